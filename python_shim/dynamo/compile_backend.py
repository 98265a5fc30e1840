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
    derived = _sizes_of_inputs(gm)
    if not derived:
        return optimize(gm)
    _sums_as_adds(gm)
    # The integers that are sizes of tensor inputs are left out of the optimized call and read
    # from those tensors inside it: as arguments they would be guarded by value (and recorded
    # again at each), as sizes a size family follows them from call to call.
    skip = {k for k, _, _ in derived}
    total = _num_inputs(gm)
    kept = [k for k in range(total) if k not in skip]
    where = {k: (kept.index(i), d) for k, i, d in derived}
    # (made as source: each size goes straight into the call, where dynamo follows it; through a
    # list it would be a number Python used)
    params = ", ".join(f"r{j}" for j in range(len(kept)))
    passed = ", ".join(f"r{where[k][0]}.shape[{where[k][1]}]" if k in where else f"r{kept.index(k)}"
                       for k in range(total))
    env = {"gm": gm}
    exec(compile(f"def forward({params}):\n    return gm({passed})\n", "<dynamo backend>", "exec"), env)
    inner = optimize(env["forward"])

    def call(*args):
        return inner(*[args[k] for k in kept])
    return call


def _sums_as_adds(gm):
    """torch.sym_sum([a, b, ...]) of sizes in gm as a + b + ...: the same integer, where dynamo
    follows each size through `+` but not through a list."""
    import operator

    import torch
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.sym_sum or len(node.args) != 1 or node.kwargs or \
                not isinstance(node.args[0], (list, tuple)) or not node.args[0]:
            continue
        terms = list(node.args[0])
        with gm.graph.inserting_before(node):
            acc = terms[0]
            for t in terms[1:]:
                acc = gm.graph.call_function(operator.add, (acc, t))
        if acc is terms[0]:
            continue
        node.replace_all_uses_with(acc)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def _num_inputs(gm):
    return sum(1 for node in gm.graph.nodes if node.op == "placeholder")


def _sizes_of_inputs(gm):
    """The integer inputs of gm that are a dim of one of its tensor inputs: (input k, tensor input
    i, dim d) each. With dynamic shapes, TorchDynamo passes each size symbol of the inputs as an
    integer argument of its own (the cache's length at each decode step): an integer argument
    that changes on every call would be recorded again at every value, where as the size of a
    tensor (which TorchDynamo's guards bind it to) it is one variable of a size family."""
    try:
        import torch
        places = [n for n in gm.graph.nodes if n.op == "placeholder"]
        vals = [n.meta.get("example_value", n.meta.get("val")) for n in places]
        dims = {}
        for i, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                for d, size in enumerate(v.shape):
                    if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                        dims.setdefault(size.node.expr, (i, d))
        out = []
        for k, v in enumerate(vals):
            if isinstance(v, torch.SymInt) and v.node.expr in dims:
                out.append((k,) + dims[v.node.expr])
        return out
    except Exception:  # noqa: BLE001 -- graphs without these facts take their integers as given
        return []


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
