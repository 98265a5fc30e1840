"""What the process holds across optimized functions: every OptimizedFunction alive, the global
counters (dynamo.counters()), and the native engines (one for the CPU, one per CUDA device)."""
import weakref

from . import native, reasons

COUNTER_NAMES = ("calls", "native_runs", "interpreted_runs", "eager_runs", "traces_compiled",
                 "side_traces_compiled", "guard_misses", "side_exits", "exits_resumed", "aborts", "recompiles",
                 "compile_failures", "verify_failures", "cache_hits", "compile_seconds", "stitches",
                 "stitch_traces", "traces_from_store", "code_shared", "compiles_skipped", "size_instances", "size_probes", "backward_traces_compiled",
                 "backward_native_runs") + reasons.COUNTERS
_counters = dict.fromkeys(COUNTER_NAMES, 0)
_counters["compile_seconds"] = 0.0
_registry = []      # weak references to every OptimizedFunction, for reset() and the report
_engine = None
_gpu_engines = {}   # torch.device -> native.Engine


def register(of):
    _registry.append(weakref.ref(of))


def functions():
    """The OptimizedFunctions alive now, oldest first (a deep copy or a loaded module that is
    dropped is not kept alive by this list)."""
    live = [r() for r in _registry]
    if None in live:
        _registry[:] = [r for r, f in zip(_registry, live) if f is not None]
    return [f for f in live if f is not None]


def unlist(of):
    """Takes of off the list (explain's own functions are not the program's)."""
    _registry[:] = [r for r in _registry if r() is not of]


def counters():
    """A copy of the global counters (reset by dynamo.reset()). side_exits counts every failing
    mid-trace guard, including those a natively linked side trace took over; abort_<kind> counts
    aborts by their reason's row in reasons.KINDS (dtype, python, data_dependent, ...)."""
    c = dict(_counters)
    c["side_exits"] += sum(t.exits_taken() for f in functions() for t in f.compiled)
    return c


def bump(name, by=1):
    _counters[name] += by


def saved_counters():
    """The counters as they are now, for restore_counters (explain's recording counts nothing)."""
    return dict(_counters)


def restore_counters(saved):
    _counters.update(saved)


def zero_counters():
    for k in _counters:
        _counters[k] = 0
    _counters["compile_seconds"] = 0.0


def engine(device=None):
    """The CPU engine, or the CUDA engine of `device` (raises DynamoError without a GPU)."""
    global _engine
    if device is not None:
        if device not in _gpu_engines:
            _gpu_engines[device] = native.Engine(device)
        return _gpu_engines[device]
    if _engine is None:
        _engine = native.Engine()
    return _engine
