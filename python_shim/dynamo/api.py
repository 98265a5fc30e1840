"""The entry points `import dynamo` gives: optimize, disable, reset, counters, explain, report.

Here rather than in frontend.py because `optimize()` with no argument is the frame hook's `with`
block (hook.py), which in turn optimizes the frames it sees through frontend.py: the package's
modules import one another in one direction only (tests/python/test_interpreter_layout.py).
"""
import torch

from . import frontend, hook
from .explain import explain, report  # noqa: F401 -- dynamo.explain, dynamo.report
from .frontend import disable  # noqa: F401 -- dynamo.disable
from .registry import counters  # noqa: F401 -- dynamo.counters


def optimize(fn_or_module=None, *, nopython=False):
    """Returns a version of a function (or nn.Module) that records and compiles its hot paths.

    Usable as `optimize(fn)`, `@optimize`, `@optimize(nopython=True)`, and as
    `with optimize():`, which compiles the frames that start inside the block (PEP 523 hook).
    For an nn.Module, the module itself is returned with its forward compiled (it stays the same
    module: attributes, state_dict, train()/eval() all work; `self.training` is guarded). The
    compiled state is kept out of copies and pickles: copy.deepcopy(module) gives a module whose
    forward is optimized afresh (its own traces); pickle.dumps / torch.save of the whole module
    load as an optimized module with nothing compiled yet (where dynamo can be imported);
    torch.jit.script(module) scripts the class's forward (scripting a parent module puts a plain
    twin of the optimized one, sharing its parameters and buffers, in the parent's place).
    """
    if fn_or_module is None:
        frontend._load_library()
        return hook.OptimizeContext(nopython=nopython)
    return frontend.optimize(fn_or_module, nopython=nopython)


def mark_dynamic(t, *dims):
    """Marks dims of tensor t as sizes that change between calls (as PyTorch 2's mark_dynamic).
    Sizes become variables of a size family after two recordings anyway (dynamo.config.dynamic
    None, the default); the mark matters with config.dynamic = False, where only marked dims
    may vary in a family, and it makes dynamo say once on stderr why a recording with marked
    dims joined no family. Returns t."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mark_dynamic: expected a tensor, got {type(t).__name__}")
    norm = set(getattr(t, "_dynamo_dynamic", ()))
    for d in dims:
        if type(d) is not int or not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"mark_dynamic: dim {d!r} is out of range for a tensor of {t.dim()} dims")
        norm.add(d % t.dim())
    t._dynamo_dynamic = frozenset(norm)
    return t


def reset():
    """Drops every compiled trace, forgets the frames the hook has seen, and zeroes the counters."""
    hook.reset()
    frontend.reset()
