"""dynamo.config: the knobs of the front end (module attributes; set them before calls).

hot_threshold  calls of a function before its next call is recorded (default 1: the first call
               records, as torch.compile users expect compilation on first use).
cache_limit    compiled traces with machine code of their own kept per function (default 8);
               further variants run eagerly, with one warning line on stderr.
size_variants  further traces per function past cache_limit that share the machine code of one
               of them: the same program at other tensor sizes (default 512), recorded (when the
               program reads sizes in Python) or instances of a size family (sizes.py: no
               recording, counter size_instances). Neither costs an LLVM compile (code_shared).
abort_limit    recordings of a function that may abort before it is left to CPython (default 3);
               after the k-th abort, the next 2^(k-1) - 1 calls run in CPython first (back-off).
               Two aborts in a row at the same place for the same reason leave it at once.
retry_after    calls after which a function left to CPython is recorded once more (default 1000;
               each later try waits 4x as many calls; 0: never). A change of any other knob
               here also lets it be recorded again at its next call. dynamo.disable is for good.
hotexit        times a side exit (a data-dependent branch leaving a trace) is taken before a side
               trace is recorded from it (default 8); until then the call resumes in the interpreter.
max_side_traces side traces compiled under one root trace, at any depth (default 16); further
               hot exits resume in the interpreter.
max_trace_ops  IR instructions a trace may record (default 5000); a longer one is cut: it ends there
               and the rest of the call continues from a snapshot (resumed, or as side traces).
stitch         when True (default), a call the recorder cannot record (print, a dynamo.disable'd
               function, unknown C code, .tolist(), a store into an outside object) ends the trace
               as a *stitch*: the recording makes the call and records the trace after it; later
               calls run the trace natively, make that one call in Python, and go on in the native
               trace after it. False: such a call aborts the recording (the function runs eagerly).
write_backs    when True (default), an attribute the call sets on a plain data object from outside
               it (`cache.layers[0].keys = torch.cat(...)`, a Hugging Face cache's update), to a
               tensor of the trace or a plain value, is set again by the trace after each native
               run (a *write-back*) instead of ending the trace there; later reads in the call see
               the value set. False: such a store is a stitch (or ends the recording).
max_stitches   stitches (continuation traces) under one root trace (default 8); a call that
               needs one more drops the root trace (an abort: the function is left to CPython
               rather than interpreted from that stitch on every call). The traces of a tree
               are compiled when the call that recorded them ends, so a tree dropped in that
               call costs no compile (counter compiles_skipped).
max_stitch_variants traces recorded after one stitch (default 4); a call that fits none of
               them drops the root trace (an abort: what follows the stitch depends on values that
               change between calls, such as numbers read by .tolist()).
compile_parts  when True (default), an optimized module whose forward runs in CPython after an
               abort (backing off, or left to CPython for good) has its submodules optimized
               apart, each with its own traces and guards; a part that aborts splits the same
               way, down to the leaves. False: the whole forward runs eagerly.
trace_store    when True (default), compiled traces without side exits or stitches are kept in the
               disk cache with their guards, and a later process whose call passes those guards
               runs them without recording (see store.py); off with DYNAMO_TRACE_STORE=0 or
               DYNAMO_CACHE_DIR=off.
log            None (use $DYNAMO_LOG) or a set of categories to print to stderr: traces, guards,
               exits, recompiles, aborts, perf, store; {"all"} for every one.
verify         when True, every native run is also run eagerly and compared (allclose,
               rtol 1e-4, atol 1e-5); a mismatch raises AssertionError. For debugging.
dynamic        None (default, automatic) or True: a Python float or int passed as an argument of
               the optimized function that only meets tensors in + - * / is a scalar input of the
               trace, read each call, not guarded by value (f(x, 0.1), f(x, 0.2), ... run one
               trace); a number that steers control flow, a shape, or any other call is guarded
               by value as before. Tensor sizes: the first trace is specialized; the first call
               that misses it only on sizes is probed (size_probes) and gets a size family whose
               instances serve every size of the dims that can vary, without a recording; a
               second recording at other sizes also makes one (sizes.py). Sizes 0 stay
               specialized, sizes 1 where a probe shows the program the same there; a size used
               as a number in Python stays fixed. False: every number is a guarded constant and
               every shape its own recording, except dims marked with dynamo.mark_dynamic(x, dim),
               which a size family may still vary.
size_probes    when True (default), a call that misses a trace only on tensor sizes runs the
               function once per argument dim on fake tensors (no data, no effects; probe.py) to
               find which dims can vary and how the trace follows them; False: size families
               come from recordings only.
gpu            when True (default), traces over CUDA tensors (all inputs on one device) compile for
               that GPU through dynamo's CUDA engine (needs the NVIDIA driver; without one they fall
               back to eager with the driver's reason). False: CUDA tensors always run eagerly.
training       when True (default), a call with grad on and tensors that require grad runs its
               forward and backward compiled (training.py: AOTAutograd's joint graph of the trace,
               each half compiled by dynamo; a branch on a tensor's value then ends a trace, and
               the parts compile apart); False: such calls run eagerly, as under the "autograd"
               reason.
training_batch_norm
               when True, batch norm in training mode (running statistics updated in place)
               compiles with grad too: the statistics are computed as further outputs of the
               compiled forward and written back after it, as eager's kernel updates them
               (training.py); resnet18 then trains compiled whole, with eager's losses and
               statistics, but measured 0.66-0.74x eager's speed per step on 2 cores (its
               compiled backward is slower than eager's: docs/PERFORMANCE.md). False (default):
               such calls run eagerly and a model's other parts compile apart.
keep_weight_results
               when True (default), what a trace computes from the modules' parameters and
               buffers alone (and constants: a T5 model's relative position bias, a mask built
               from aranges) is computed on a call and kept for the next calls, computed again
               when one of those tensors changes (the native code compares their addresses,
               version counters and 32 sampled elements; a write through .data shows in the
               sample). False: computed on every call (what reads no tensor at all, such as
               an arange, is still computed once).
ddp_bucket_mb  when torch.distributed is initialized with more than one rank, a recording with
               grad on ends its trace before calling a submodule once the parameters it has used
               reach this many MiB (default 25, DistributedDataParallel's bucket size; 0: never):
               each part's backward is an autograd node of its own, so the gradients of the last
               layers are handed to DDP (which starts all-reducing their bucket) while the
               backward of the earlier layers still runs, as in eager DDP.

Setting a name that is not one of these raises AttributeError with the list of the valid ones (a
misspelt knob would otherwise change nothing, silently); a value of the wrong type raises
TypeError and one out of range ValueError, each naming what the setting takes.
"""
import difflib
import sys
import types

LOG_CATEGORIES = ("traces", "guards", "exits", "recompiles", "aborts", "perf", "store")

hot_threshold = 1
cache_limit = 8
size_variants = 512
abort_limit = 3
retry_after = 1000
hotexit = 8
max_side_traces = 16
max_trace_ops = 5000
stitch = True
write_backs = True
max_stitches = 8
max_stitch_variants = 4
verify = False
compile_parts = True
trace_store = True
log = None
gpu = True
dynamic = None
size_probes = True
training = True
training_batch_norm = False
keep_weight_results = True
ddp_bucket_mb = 25

_SETTINGS = tuple(n for n, v in list(globals().items())
                  if not n.startswith("_") and n not in ("LOG_CATEGORIES", "difflib", "sys", "types"))
assert all(not callable(getattr(sys.modules[__name__], n)) for n in _SETTINGS)
_version = 0  # bumped by every setting (backoff.py compares the knobs only after a change)


def unknown(name, valid, what):
    """The message refusing `name`, which is not among `valid`: the closest spelling, the list."""
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{what} has no {name!r}{hint}; valid: {', '.join(valid)}"


def check_log(value):
    """config.log: None, or a set (list, tuple) of categories of LOG_CATEGORIES (or "all")."""
    if value is None:
        return
    valid = LOG_CATEGORIES + ("all",)
    if isinstance(value, str):
        close = difflib.get_close_matches(value, valid, n=1)
        example = close[0] if close else "traces"
        raise TypeError(f"dynamo.config.log takes None or a set of categories, e.g. {{{example!r}}}, "
                        f"not the string {value!r}; categories: {', '.join(valid)}")
    if not isinstance(value, (set, frozenset, list, tuple)):
        raise TypeError(f"dynamo.config.log takes None or a set of categories ({', '.join(valid)}), "
                        f"not {type(value).__name__}")
    for c in value:
        if not isinstance(c, str) or c not in valid:
            raise ValueError(unknown(c, valid, "dynamo.config.log") if isinstance(c, str) else
                             f"dynamo.config.log: categories are strings ({', '.join(valid)}), not {c!r}")


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"dynamo.config.{name} takes True or False, not {value!r}")


def _count(least):
    """A whole number of at least `least` (bool refused: `cache_limit = True` is a slip)."""
    def check(name, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"dynamo.config.{name} takes a whole number >= {least}, not {value!r}")
        if value < least:
            raise ValueError(f"dynamo.config.{name} takes a whole number >= {least}, not {value}")
    return check


def _megabytes(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"dynamo.config.{name} takes a number of MiB >= 0 (0: never), not {value!r}")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"dynamo.config.{name} takes a finite number of MiB >= 0 (0: never), not {value}")


def _dynamic(name, value):
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"dynamo.config.{name} takes None (automatic), True or False, not {value!r}")


# What each setting takes; checked when it is set (a wrong value would otherwise fail later, far
# from the line that set it, or change nothing).
_CHECKS = {
    "hot_threshold": _count(0), "cache_limit": _count(0), "size_variants": _count(0),
    "abort_limit": _count(1), "retry_after": _count(0), "hotexit": _count(1),
    "max_side_traces": _count(0), "max_trace_ops": _count(1), "max_stitches": _count(0),
    "max_stitch_variants": _count(1), "ddp_bucket_mb": _megabytes, "dynamic": _dynamic,
    "log": lambda name, value: check_log(value),
}
assert all(n in _CHECKS or isinstance(globals()[n], bool) for n in _SETTINGS)  # the rest are flags


# The environment variables dynamo reads (docs/SETTINGS.md's table); a DYNAMO_ name close to one of these
# is taken for a misspelling and said at import (others may be another tool's: left alone).
ENVIRONMENT = ("DYNAMO_ATTENTION", "DYNAMO_CACHE_DIR", "DYNAMO_CACHE_MAX_MB", "DYNAMO_COMPILE_THREADS",
               "DYNAMO_CONV", "DYNAMO_CONV_WINOGRAD", "DYNAMO_DUMP_DIR", "DYNAMO_FAULT", "DYNAMO_GEMM",
               "DYNAMO_GPU_POOL_MB", "DYNAMO_GPU_ROW_BLOCK", "DYNAMO_GPU_TF32", "DYNAMO_GPU_UNROLL",
               "DYNAMO_LAYOUT", "DYNAMO_LIBCUBLASLT", "DYNAMO_LIBCUDA", "DYNAMO_LIBDEVICE", "DYNAMO_LIBRARY", "DYNAMO_LOG",
               "DYNAMO_PERF_MAP", "DYNAMO_PRINT_CHOICES", "DYNAMO_SHARE_CODE", "DYNAMO_TRACE_STORE",
               "DYNAMO_SOAK_CALLS", "DYNAMO_SOAK_CYCLES")


def misspelt_environment(environ):
    """Lines saying which DYNAMO_ variables of environ look like misspellings of ours."""
    out = []
    for name in sorted(n for n in environ if n.startswith("DYNAMO_") and n not in ENVIRONMENT):
        close = difflib.get_close_matches(name, ENVIRONMENT, n=1, cutoff=0.8)
        if close:
            out.append(f"dynamo: environment variable {name} is not one dynamo reads (did you mean {close[0]}?); "
                       "ignored")
    return out


class _Settings(types.ModuleType):
    """This module's class: setting an unknown name is refused, each value checked (_CHECKS)."""

    def __setattr__(self, name, value):
        if not name.startswith("_"):
            if name not in _SETTINGS:
                raise AttributeError(unknown(name, _SETTINGS, "dynamo.config"))
            _CHECKS.get(name, _flag)(name, value)
        super().__setattr__(name, value)
        if not name.startswith("_"):
            super().__setattr__("_version", self._version + 1)


sys.modules[__name__].__class__ = _Settings
