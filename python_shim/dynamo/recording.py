"""One recording set-up, for root traces (frontend), side and stitch traces (tracetree) and
size probes (probe): the recorder, the trace's guards and the interpreter that drives both, and
what the recording must remember of the call it records.

What belongs to one call lives here, on the objects of that recording, never on the optimized
function they serve: two threads recording one function at once each keep their own.
"""
import torch

from . import native
from .frames import StitchNow
from .guards import TORCH_STATE_TEXT, GuardSet, torch_state
from .interpreter import Interpreter
from .recorder import Recorder


def ir_name(name):
    """A Python qualified name as a trace's IR name (letters, digits, '_')."""
    return name.replace(".", "_").replace("<", "").replace(">", "")


class CallFacts:
    """What a root trace keeps of the call it was recorded from: its dispatch key (tracetree.
    shape_key), the shapes of its tensor leaves (size probes), and its place in the trace store
    (computed before the call runs: the arguments as the call got them)."""

    __slots__ = ("shape_key", "leaf_shapes", "store_where")

    def __init__(self, shape_key=None, leaf_shapes=None, store_where=None):
        self.shape_key, self.leaf_shapes, self.store_where = shape_key, leaf_shapes, store_where


def start(name, *, consts=None, nopython=False, value_cuts=False, state_guard=True, call=None):
    """(recorder, guards, interpreter) for one recording named `name`. consts: guard constants
    the recording starts with (a snapshot's); state_guard: guard torch's global state (grad mode,
    default dtype, autocast; not for probes, whose base recording did); call: its CallFacts,
    kept on the recorder as `rec.call`."""
    rec = Recorder(ir_name(name))
    rec.call = call or CallFacts()
    gs = GuardSet()
    if consts:
        gs._consts.update(consts)
    if state_guard:
        gs.guard_state("torch_state()", torch_state(), TORCH_STATE_TEXT)
    interp = Interpreter(rec, gs)
    interp.nopython = nopython
    interp.value_cuts = value_cuts
    return rec, gs, interp


def run(rec, interp, body):
    """body() with the recorder on and OpenBLAS held to one thread: (its result, None), or
    (None, the exception it raised) -- the program's own or dynamo's, for the caller to tell
    apart, outside any except block. Grad mode is put back as the recording started when it
    raised (a `with torch.no_grad():` left midway). StitchNow (a stitch's step made) propagates."""
    try:
        with rec, native.blas_one_thread():
            return body(), None
    except StitchNow:
        raise
    except Exception as e:  # noqa: BLE001 -- handed to the caller
        torch._C._set_grad_enabled(interp.grad_at_start)
        return None, e
