"""The recording interpreter has one handler per bytecode (`_op_<NAME>` methods marked with
`@_handles`), and the bytecodes it supports are exactly those handlers' plus the few it skips:
a code object using any other is refused before it runs (`unsupported_reason`). The package's
modules import one another one way only (frames.py, a leaf, holds what they share)."""
import dis

from dynamo import bytecode
from dynamo import interpreter as I


def test_every_supported_bytecode_has_one_handler():
    assert I._SUPPORTED == frozenset(I._HANDLERS) | I._SKIPPED
    # each an opcode of this version, of 3.11's vocabulary that bytecode.py decodes into, or of 3.12/3.13
    known = set(dis.opmap) | bytecode.VOCABULARY_311 | bytecode.LATER_NAMES | bytecode.OWN_NAMES
    assert I._SUPPORTED <= known, sorted(I._SUPPORTED - known)
    for name, fn in I._HANDLERS.items():
        assert fn.__name__.startswith("_op_") and name in fn.opnames
    assert not set(I._HANDLERS) & I._SKIPPED


def test_a_bytecode_without_a_handler_is_refused_up_front():
    def delegates():
        yield from range(3)  # SEND: no handler
    why = I.unsupported_reason(delegates.__code__, top=True)
    assert why is not None and ("SEND" in why or "generator" in why), why


def _imports_of_package():
    """{module: set of the package's modules it imports}, from the source (imports inside
    functions included: a lazy import is still a dependency)."""
    import ast
    import pathlib
    pkg = pathlib.Path(I.__file__).parent
    graph = {}
    for path in pkg.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[path.stem] = deps & {p.stem for p in pkg.glob("*.py")}
    return graph


def test_the_package_imports_one_way():
    graph = _imports_of_package()
    # a leaf: what the interpreter, recorder and snapshots share (frames, errors)
    assert graph["frames"] == set(), graph["frames"]
    assert "interpreter" not in graph["snapshot"] | graph["recorder"]
    # the interpreter's collaborators take it as a parameter and never import it
    for part in ("bytecode", "calls", "cuts", "sources", "generators"):
        assert "interpreter" not in graph[part], (part, graph[part])
    assert "frontend" not in graph["interpreter"] | graph["snapshot"] | graph["recorder"] | graph["tracetree"]
    # the call path's stages: the runner (tracetree) runs and resumes, the policy (backoff)
    # decides; neither records (recording) nor reaches back into the front end
    for stage in ("tracetree", "backoff"):
        assert not graph[stage] & {"frontend", "recording", "probe", "training"}, (stage, graph[stage])
    assert "tracetree" not in graph["recording"] and "backoff" not in graph["recording"]
    done, path = set(), []

    def visit(m):  # depth-first: a module met again on the current path is a cycle
        assert m not in path, "import cycle: " + " -> ".join(path[path.index(m):] + [m])
        if m in done:
            return
        path.append(m)
        for d in sorted(graph.get(m, ())):
            visit(d)
        path.pop()
        done.add(m)
    for m in sorted(graph):
        visit(m)


def test_no_mixins():
    """The package's classes are composed, not mixed: none has a base that is another class of
    the package other than the one it specializes (an error kind, a GuardSet, a Compiled)."""
    import ast
    import pathlib
    pkg = pathlib.Path(I.__file__).parent
    ours = {}
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                ours[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    mixed = {name: bases for name, bases in ours.items() if len([b for b in bases if b in ours]) > 1 or
             (bases and all(b in ours for b in bases) and any(not b.endswith(("Error", "Stop", "Abort", "Set",
                                                                             "Compiled", "Used")) for b in bases))}
    assert not mixed, mixed


def test_no_function_reaches_80_lines():
    """Every function of the package reads in one screen or two (the longest was 125 lines)."""
    import ast
    import pathlib
    pkg = pathlib.Path(I.__file__).parent
    long = []
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 >= 80:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
