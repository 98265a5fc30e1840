"""dynamo: a trace JIT for PyTorch programs.

    import dynamo
    fast = dynamo.optimize(model)       # or @dynamo.optimize on a function
    with torch.no_grad():
        y = fast(x)                     # first call records, later calls run native code

dynamo.explain(fn, *args) shows what is compiled and why anything falls back;
dynamo.counters() counts calls, native runs, recordings, aborts and compile time;
dynamo.config holds the knobs; dynamo.native is the thin binding of the C API.
torch.compile(model, backend="dynamo") runs PyTorch's own front end with dynamo's engine behind
it (dynamo.backend is that backend function).
"""
from ._capi import DynamoError, ABI_VERSION  # noqa: F401
from .frames import NopythonError  # noqa: F401
from . import config, native  # noqa: F401
from .api import counters, disable, explain, mark_dynamic, optimize, report, reset  # noqa: F401
from .compile_backend import backend, register as _register_backend  # noqa: F401

__version__ = "0.1.0"


def _say_setup_problems():
    """Said once, at import, on stderr: a library that cannot load (optimized functions then run
    eagerly), misspelt DYNAMO_ variables, unknown $DYNAMO_LOG categories."""
    import os
    import sys
    from . import log
    if native.load_error() is not None:
        print(f"{native.load_error()} dynamo.optimize runs everything eagerly.", file=sys.stderr)
    for line in config.misspelt_environment(os.environ):
        print(line, file=sys.stderr)
    log.enabled("traces")  # (checks $DYNAMO_LOG now)


_say_setup_problems()

_register_backend()
