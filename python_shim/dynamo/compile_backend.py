"""dynamo as a backend of PyTorch's own front end: `torch.compile(model, backend="dynamo")`.

TorchDynamo (torch.compile's front end) captures each region it can of a program as an FX graph
and hands it, with example inputs, to a backend, which returns what to call instead. This backend
gives it back the graph module optimized by dynamo's engine: the graph's generated Python code is
recorded on its first call and compiled to native code like any function (fused loops, LibTorch
calls for the rest, guards, side exits); in training, through AOTAutograd, as dynamo.optimize
does. So a user picks the front end: dynamo's own (dynamo.optimize, which records the program's
Python as it runs) or PyTorch's (graph capture with its guards and graph breaks), with the same
native engine behind both.

The name "dynamo" reaches torch through the "torch_dynamo_backends" entry point of the installed
package's metadata (pyproject.toml; `pip install .`): torch.compile finds it without `import
dynamo`. `import dynamo` also registers it when
torch._dynamo is already loaded, and `torch.compile(model, backend=dynamo.backend)` needs neither.
"""
import importlib.abc
import importlib.util
import sys

NAME = "dynamo"


def backend(gm, example_inputs, options=None):
    """The torch.compile backend: gm (a torch.fx.GraphModule) optimized by dynamo. The example
    inputs are not needed (dynamo records on the first real call). It takes no options
    (torch.compile(..., options={...}) hands them here): dynamo.config holds its settings, and an
    option given is refused rather than ignored."""
    if options:
        raise TypeError(f"torch.compile(backend=\"dynamo\") takes no options (got {', '.join(sorted(options))}); "
                        "set dynamo.config instead")
    from .api import optimize
    # TorchDynamo's graph modules generate their code on first call (_LazyGraphModule), through a
    # forward that calls the module again: make the real code now, so that dynamo records it.
    real_recompile = getattr(gm, "real_recompile", None)
    if real_recompile is not None:
        real_recompile()
    return optimize(gm)


_REGISTRY = "torch._dynamo.backends.registry"


def register():
    """Registers the backend under NAME with torch._dynamo's registry: now where that module is
    loaded, else as soon as it is (importing torch._dynamo here would cost every `import dynamo`
    about two seconds). An installed package is also found through its entry point; a source
    checkout (PYTHONPATH=python_shim) has none, and `import dynamo` is what makes the name known."""
    registry = sys.modules.get(_REGISTRY)
    if registry is None:
        if not any(isinstance(f, _RegisterWhenLoaded) for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterWhenLoaded())
        return
    if NAME in getattr(registry, "_BACKENDS", {}):
        return  # (found through the entry point, which is loading this module now, or registered)
    try:
        registry.register_backend(backend, name=NAME)
    except Exception:  # noqa: BLE001 -- another "dynamo" already registered: the entry point stays
        pass


class _RegisterWhenLoaded(importlib.abc.MetaPathFinder):
    """An import hook that waits for torch._dynamo's backend registry: the module is found and
    loaded as usual, and register() runs once it has executed; then the hook removes itself."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _REGISTRY:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            register()
        loader.exec_module = exec_module
        return spec
