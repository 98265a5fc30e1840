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
import sys as _sys

# What the package runs on: the interpreter the recorder and the frame hook are written for, and
# the torch whose LibTorch the library links (its C++ ABI changes between releases).
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
SUPPORTED_TORCH = "2.14"


def _check_supported():
    """ImportError naming what is supported, before anything that would fail less clearly."""
    here = f"{_sys.implementation.name} {_sys.version.split()[0]}"
    if _sys.implementation.name != "cpython" or _sys.version_info[:2] not in SUPPORTED_PYTHONS:
        raise ImportError(f"dynamo supports CPython {', '.join('%d.%d' % v for v in SUPPORTED_PYTHONS)}; "
                          f"this is {here}")
    import torch
    got = torch.__version__.split("+")[0]
    if got.split(".")[:2] != SUPPORTED_TORCH.split("."):
        raise ImportError(f"dynamo supports torch {SUPPORTED_TORCH}.x (built and tested with 2.14.1); this "
                          f"environment has torch {torch.__version__}: pip install torch==2.14.1")
    try:
        from ._build import TORCH_VERSION  # written by the package build (pip install .)
    except ImportError:
        return  # run from a source tree: CMake checked the torch it built against
    if got != TORCH_VERSION:
        raise ImportError(f"dynamo was built against torch {TORCH_VERSION}; this environment has torch "
                          f"{torch.__version__}: install torch {TORCH_VERSION}, or build dynamo again "
                          "against this torch (pip install --force-reinstall --no-deps .)")


_check_supported()

from ._capi import DynamoError, ABI_VERSION  # noqa: F401, E402
from .frames import NopythonError  # noqa: F401, E402
from . import config, native  # noqa: F401, E402
from .api import counters, disable, explain, mark_dynamic, optimize, report, reset  # noqa: F401, E402
from .compile_backend import backend, register as _register_backend  # noqa: F401, E402

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
