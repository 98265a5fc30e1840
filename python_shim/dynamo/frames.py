"""What the interpreter's frames hold and the errors that cross module lines: a leaf module.

The recording interpreter (interpreter.py), the ATen recorder (recorder.py), the snapshots at
side exits and stitches (snapshot.py) and the front end (frontend.py) all name these; keeping
them here, importing nothing of dynamo, is what lets those modules import one another one way
only: frontend -> interpreter -> snapshot, recorder -> frames (tests/python/
test_interpreter_layout.py checks that no import runs the other way).
"""
import abc
import types

import torch

CO_GENERATOR = 0x20  # code flag: a generator function's body

NULL = object()  # CPython's NULL stack entry (pushed before a callable that is not a method)


class ItemRead:
    """The source of a Python number read from a recorded float tensor (t.item(), float(t)) whose
    exit is not made yet: while the number only moves (locals, the value stack) or meets a
    number in a comparison, the trace guards the comparison's outcome instead of the number
    (cuts._compare_item: `while err > tol` with err read by .item() each iteration). Any
    other use makes the number's own value exit there (cuts._settle_items); a snapshot
    taken meanwhile carries it as the read of the live tensor (snapshot.encode)."""

    __slots__ = ("t", "conv", "expr", "base")

    def __init__(self, t, conv):
        self.t, self.conv = t, conv
        self.expr = f"<{conv}() of a tensor, not guarded yet>"  # (never a guard's source)
        self.base = None


def plain_class(cls):
    """A Python class whose instances are made by object.__new__ or a __new__ in Python, and whose
    __init__ is Python code (or object's): calling it can be interpreted, and an instance the call made can be
    carried through a snapshot as its class and __dict__."""
    # (ABCMeta makes classes as type does; object.__new__ refuses an abstract one, as in eager)
    if not isinstance(cls, type) or type(cls) not in (type, abc.ABCMeta) or cls.__module__ == "builtins":
        return False
    if issubclass(cls, (torch.Tensor, torch.nn.Module, BaseException)):
        return False
    if cls.__new__ is not object.__new__ and not isinstance(cls.__new__, types.FunctionType):
        return False  # (a __new__ in Python, as torch.no_grad's, is interpreted too)
    return cls.__init__ is object.__init__ or isinstance(cls.__init__, types.FunctionType)


def dense_order(t):
    """t's dims from innermost to outermost in memory when t is dense in that order (a
    permutation of a row-major tensor: transposed, channels-last), else None. Size-1 dims count
    wherever they stand."""
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
    expect = 1
    for d in order:
        if t.shape[d] != 1 and t.stride(d) != expect:
            return None
        expect *= t.shape[d]
    return order


def dense_strides(t, shape):
    """Strides for a tensor of `shape` laid out as t is (t dense in some dim order), or None."""
    if t.dim() == 0:
        return ()
    order = dense_order(t)
    if order is None:
        return None
    out, step = [0] * t.dim(), 1
    for d in order:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def is_torch_callable(fn):
    """A callable of torch's: a function or class of a torch module, a tensor's method, or a
    builtin of torch's C modules (the interpreter calls these for real; their ATen ops are
    recorded). Of torch's classes only torch.Size counts."""
    mod = getattr(fn, "__module__", None) or ""
    if mod == "torch" or mod.startswith("torch."):
        return not isinstance(fn, type) or fn is torch.Size
    self_ = getattr(fn, "__self__", None)
    if isinstance(self_, torch.Tensor):
        return True
    owner = getattr(fn, "__objclass__", None)  # a tensor method read from the class: torch.Tensor.add_
    if isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return True
    if self_ is not None and type(self_).__name__ == "_VariableFunctionsClass":
        return True
    return isinstance(self_, types.ModuleType) and self_.__name__.startswith("torch")


class SourcedIter:
    """Iteration over a sourced list/tuple: elements keep their sources (and guards). Over a
    list (`seq`, read from `src`) it is live, as CPython's list iterator: element i is read when
    reached, so appends made during the loop are seen."""

    __slots__ = ("items", "srcs", "i", "seq", "src")

    def __init__(self, items, srcs, seq=None, src=None, i=0):
        self.items, self.srcs, self.i, self.seq, self.src = items, srcs, i, seq, src

    @classmethod
    def live(cls, seq, src, i=0):
        return cls(None, None, seq, src, i)

    def next_pair(self):
        k = self.i
        if self.seq is not None:
            if k >= len(self.seq):
                raise StopIteration
            self.i += 1
            return self.seq[k], (self.src.item(k) if self.src is not None else None)
        if k >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[k], self.srcs[k]

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_pair()[0]


# ---------------------------------------------------------------------------------------------
# Errors


class Abort(Exception):
    """The trace cannot be compiled; the call itself still completes correctly. kind: the
    reason's row in reasons.KINDS (the message says the particulars)."""

    def __init__(self, message, kind="internal"):
        super().__init__(message)
        self.kind = kind


class ProbeStop(Abort):
    """A size probe (probe.py) cannot go on: the program would do something a probe must not
    (an effect, a call not recorded, a side exit) or decide something on a size the probe
    changed. The probe ends; the real call was made already and is not touched."""


class SizeUsed(ProbeStop):
    """A probe's changed size is about to be used as a number in Python."""


class DataDependentStep(Exception):
    """Raised out of the dispatch mode, before the op runs, for an op whose output size depends
    on the data and that no side exit can check in the trace (torch.unique, torchvision's nms),
    when it is the first op of a torch call the interpreter makes (step_mark): the interpreter
    makes that call a stitch step instead (it runs for real between two traces, its results the
    next trace's inputs). Elsewhere such an op aborts the recording, as before."""


class NopythonError(RuntimeError):
    """dynamo.optimize(nopython=True) met something it cannot compile (raised to the caller)."""


class StitchNow(Exception):
    """Raised by a recording right after it made a stitch's step: the front end compiles the
    trace so far and records the rest of the call from the stitch's snapshot, in the same call
    (value: the step's result). Never handed to the program's exception handlers."""

    def __init__(self, value):
        super().__init__("stitch")
        self.value = value


class NoSnapshot(Exception):
    """The interpreter state at a branch cannot be carried to a later call."""


class ResumeFailed(Exception):
    """dynamo could not rebuild the frames of a snapshot (before any of the program ran from it)."""
