"""The trace store: compiled traces a later process can use without recording them again.

Recording a call (the interpreter runs the forward op by op) is most of a warm process's first
call: resnet50 ~90 ms, efficientnet_v2_s ~360 ms, while its compiled objects come from the disk
cache in a few. So beside the objects, a root trace (one without side exits or stitches) is kept
with what it needs to be checked and run in a new process: its IR text, its guards (the checks,
their compiled code, their constants), how to build the result, and later what its convolution
and product steps chose by timing (dynamo_entry_choices).

The guards' constants are objects of the recording process. A new process *binds* each one again
before the guards run, and uses the stored trace only when every one binds:

  * plain values (numbers, strings, dtypes, ranges, slices of numbers, tuples and lists of
    them) are stored as they are;
  * modules, module globals, classes and functions that are reachable by name (module and
    qualified name, looked up in sys.modules: nothing is imported) are found by that name;
  * anything else an identity guard checked (an nn.Module instance, a code object read from a
    function) is taken from the source that guard read (`a[0].layer1`, `c9.__code__`);

and every bound object must match the fingerprint stored for it: a class by module and qualified
name, a function or code object by its code's contents (bytecode, constants, names, file and
first line: an edited forward does not match), an enum member by its name, a functools.partial
by its function and plain arguments, an instance by its class -- and an instance of a builtin
type not named here (a sentinel object(), a deque) is not carried at all: taken from its source,
its identity guard would pass for whatever the call passes there. Distinct constants must
bind to distinct objects, so that `x is y` comes out as it did when the trace was recorded. Then
the guards run as usual (values, lengths, keys, method lookups, tensor metadata natively), and
the bound objects stay their constants: later calls check identity again, as a recorded trace's
guards do.

Files live in the disk cache's directory (dynamo_cache_directory: private, this user's) as
`py-<hash>.traces` (marshal, one per function code and call signature -- argument types, tensor
shapes, modules' parameter counts --; the constants pickled inside), the guards' texts for
explain and logs in `py-<hash>-<trace>.guards` and `py-<hash>-<trace>.choices`; each file
read must be this user's and not writable by others, as for compiled objects. The key holds this
front end's own source, the library file, Python's and torch's versions: any change records anew.
DYNAMO_TRACE_STORE=0 (or config.trace_store = False) turns the store off; it is off with the
cache (DYNAMO_CACHE_DIR=off).
"""
import enum
import functools
import hashlib
import marshal
import os
import pickle
import stat
import sys
import types

import torch

from . import config, native
from .guards import _HELPERS
from .log import log

_FORMAT = "dynamo-traces-v1"
_MAX_TRACES = 8          # stored traces per function code and call signature (the newest kept)
_salt = None
_dir = False             # False: not looked up yet; None: no store


def enabled():
    """The store is on: config.trace_store, DYNAMO_TRACE_STORE not 0/off, and a disk cache."""
    env = os.environ.get("DYNAMO_TRACE_STORE")
    return config.trace_store and env not in ("0", "off", "") and _directory() is not None


def _directory():
    global _dir
    if _dir is False:
        try:
            _dir = native.cache_directory()
        except (ImportError, OSError):
            _dir = None
    return _dir


def _salt_text():
    """What a stored trace depends on besides its function's code: this front end's source (the
    recording rules), the library file, Python, torch."""
    global _salt
    if _salt is None:
        h = hashlib.sha256(_FORMAT.encode())
        here = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(here)):
            if name.endswith(".py"):
                with open(os.path.join(here, name), "rb") as fh:
                    h.update(name.encode() + b"\0" + fh.read())
        try:
            st = os.stat(native.lib()._name)
            h.update(f"{native.lib()._name} {st.st_size} {st.st_mtime_ns}".encode())
        except (OSError, AttributeError):
            h.update(b"unknown library")
        h.update(f"{sys.version} {marshal.version} {torch.__version__}".encode())
        _salt = h.hexdigest()
    return _salt


# -- fingerprints: what an object stands for, comparable across processes ----------------------

_code_fps = {}  # id(code) -> (code, fingerprint)


def code_fingerprint(co):
    hit = _code_fps.get(id(co))
    if hit is not None and hit[0] is co:
        return hit[1]
    parts = (co.co_name, co.co_qualname, co.co_filename, co.co_firstlineno, co.co_argcount,
             co.co_posonlyargcount, co.co_kwonlyargcount, co.co_flags, co.co_code, co.co_names,
             co.co_varnames, co.co_freevars, co.co_cellvars, co.co_exceptiontable,
             tuple(_literal(c) for c in co.co_consts))
    fp = hashlib.sha256(repr(parts).encode()).hexdigest()
    _code_fps[id(co)] = (co, fp)
    return fp


def _literal(c):
    if isinstance(c, types.CodeType):
        return ("code", code_fingerprint(c))
    if type(c) is tuple:
        return tuple(_literal(x) for x in c)
    if type(c) is frozenset:
        return ("frozenset", tuple(sorted(repr(_literal(x)) for x in c)))
    return (type(c).__name__, repr(c))


def _module_name(d):
    """The name of the module whose globals d is, or None."""
    n = d.get("__name__") if type(d) is dict else None
    m = sys.modules.get(n) if type(n) is str else None
    return n if m is not None and getattr(m, "__dict__", None) is d else None


def fingerprint(obj):
    """A stable description of what obj stands for (None: it has none)."""
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if isinstance(obj, type):
        return ("class", obj.__module__, obj.__qualname__)
    if isinstance(obj, types.FunctionType):  # (dynamo.disable'd or not: recorded differently)
        return ("function", obj.__module__, obj.__qualname__, code_fingerprint(obj.__code__),
                bool(getattr(obj, "_dynamo_disable", False)))
    if isinstance(obj, types.CodeType):
        return ("code", code_fingerprint(obj))
    if isinstance(obj, types.BuiltinFunctionType):
        owner = obj.__self__
        of = ("module", owner.__name__) if isinstance(owner, types.ModuleType) else \
            ("instance", type(owner).__module__, type(owner).__qualname__)
        return ("builtin", getattr(obj, "__module__", None), obj.__qualname__, of)
    if isinstance(obj, types.MethodType):
        f, s = fingerprint(obj.__func__), fingerprint(obj.__self__)
        return None if f is None or s is None else ("method", f, s)
    if type(obj) is dict and _module_name(obj) is not None:
        return ("globals", _module_name(obj))
    if obj is sys.modules:
        return ("sys.modules",)
    if isinstance(obj, (torch.Tensor, types.GeneratorType)):
        return None
    t = type(obj)
    if isinstance(obj, enum.Enum):  # (the member, not only its class: Mode.A is not Mode.B)
        return ("enum", t.__module__, t.__qualname__, obj.name)
    if t is functools.partial:
        f = fingerprint(obj.func)
        plain = _plain_deep(obj.args) and _plain_deep(list(obj.keywords.items()))
        return ("partial", f, obj.args, sorted(obj.keywords.items())) if f is not None and plain else None
    if t.__module__ == "builtins":  # (what it holds is not described: any such object would pass)
        return None
    return ("instance", t.__module__, t.__qualname__)


def _plain_deep(v, depth=0):
    if v is None or type(v) in (bool, int, float, str, torch.dtype, torch.device, range):
        return True
    if type(v) is slice:
        return all(x is None or type(x) is int for x in (v.start, v.stop, v.step))
    if type(v) in (tuple, list, frozenset, torch.Size) and depth < 6:
        return all(_plain_deep(x, depth + 1) for x in v)
    return False


def _walk(mod, qualname):
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _name_of(obj):
    """A reference that finds obj by name in any process with the same modules loaded, or None."""
    if obj is sys.modules:
        return ("sys.modules",)
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__) if sys.modules.get(obj.__name__) is obj else None
    if type(obj) is dict:
        n = _module_name(obj)
        return ("globals", n) if n is not None else None
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        mod, qn = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if type(mod) is not str or type(qn) is not str or "<" in qn or sys.modules.get(mod) is None:
            return None
        for path in (qn, getattr(obj, "__name__", None)):  # torch.tensor: qualname _VariableFunctionsClass.tensor
            try:
                if type(path) is str and _walk(sys.modules[mod], path) is obj:
                    return ("attr", mod, path)
            except AttributeError:
                pass
    return None


def _resolve(ref):
    kind = ref[0]
    if kind == "sys.modules":
        return sys.modules
    m = sys.modules[ref[1]]  # KeyError: not loaded here, so not the same program state
    if kind == "module":
        return m
    if kind == "globals":
        return m.__dict__
    return _walk(m, ref[2])


def portable_consts(exported):
    """The constants of exported guards as descriptors (name -> ("value", v) | ("name", ref, fp) |
    ("at", expr, fp)), or a string saying which one cannot be carried to another process."""
    out = {}
    for name, obj in exported["consts"].items():
        if _plain_deep(obj):
            out[name] = ("value", obj)
            continue
        fp = fingerprint(obj)
        if fp is None:
            return f"{name} is a {type(obj).__name__}"
        ref = _name_of(obj)
        if ref is not None:
            out[name] = ("name", ref, fp)
        elif name in exported["where"]:
            out[name] = ("at", exported["where"][name], fp)
        else:
            return f"{name} ({type(obj).__qualname__}) has neither a name nor a source"
    return out


def bind(stored, a, k, g, f):
    """(the guards' globals with the stored trace's constants bound for this call, the constants),
    or (None, why). The guards' code defines check() and, for each constant an identity guard
    found, _at_<name>() reading the source it was found at (GuardSet.compile(binder=True))."""
    consts = stored["consts"]
    env = dict(_HELPERS.ready(), a=a, k=k, g=g, f=f, x=None)
    exec(marshal.loads(stored["code"]), env)  # noqa: S102 -- our own, from a private file
    bound, ids = {}, set()
    try:
        for name in sorted(consts, key=lambda n: int(n[1:])):  # c0, c1, ...: a source uses earlier ones
            desc = consts[name]
            if desc[0] == "value":
                obj = desc[1]
            else:
                try:
                    obj = _resolve(desc[1]) if desc[0] == "name" else env[f"_at_{name}"]()
                except Exception as e:  # noqa: BLE001 -- then the stored trace does not apply
                    return None, f"{name} ({desc[1]}) is not found here ({type(e).__name__})"
                if fingerprint(obj) != desc[2]:
                    return None, f"{name} ({desc[1]}) is {fingerprint(obj)!r}, the trace was recorded with {desc[2]!r}"
                if id(obj) in ids:
                    return None, f"{name} ({desc[1]}) is the same object as another constant"
                ids.add(id(obj))
            bound[name] = obj
            env[name] = obj
    finally:
        for root in ("a", "k", "g", "f", "x"):  # the guards take these as arguments: not kept here
            env.pop(root, None)
    return env, bound


# -- files ------------------------------------------------------------------------------------------

def _trusted_read(path):
    """The file's bytes if it is a regular file of this user's, not writable by others; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log("store", f"ignoring {path}: not a private file of this user's")
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def _write_atomic(path, data):
    tmp = f"{path}.tmp.{os.getpid()}.{id(data)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as e:
        log("store", f"could not write {path}: {e}")
        try:
            os.unlink(tmp)
        except OSError:
            pass


def signature(args, kwargs):
    """What the call is made with, cheaply (types; tensors' shapes and dtypes; modules' parameter
    counts and sizes): part of the store's key, so that models of one family (one forward's code,
    resnet18 .. resnet152) keep their traces apart and a process reads only those of its own."""
    def one(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), str(v.dtype), v.device.type)
        if isinstance(v, torch.nn.Module):  # (a walk of _modules: parameters() costs 3 ms on 700 modules)
            n = total = 0
            todo = [v]
            while todo:
                m = todo.pop()
                for p in m._parameters.values():
                    if p is not None:
                        n += 1
                        total += p.numel()
                todo.extend(c for c in m._modules.values() if c is not None)
            return ("module", type(v).__module__, type(v).__qualname__, n, total)
        return (type(v).__module__, type(v).__qualname__)
    return repr([one(v) for v in args] + [(k, one(kwargs[k])) for k in sorted(kwargs)])


def where(code, args, kwargs):
    """The store's place for a call of code with these arguments: (code, signature)."""
    return (code, signature(args, kwargs))


def _key(at):
    code, sig = at
    return hashlib.sha256(f"{_salt_text()}\n{code_fingerprint(code)}\n{sig}".encode()).hexdigest()[:32]


def _path(at):
    d = _directory()
    return None if d is None else os.path.join(d, f"py-{_key(at)}.traces")


def _read_all(path, at):
    data = _trusted_read(path)
    if data is None:
        return []
    try:
        stored = marshal.loads(data)  # a private file of this user's (as compiled objects are)
        if type(stored) is not dict or stored.get("format") != _FORMAT or stored.get("key") != _key(at):
            return []
        return list(stored["traces"])
    except Exception as e:  # noqa: BLE001 -- a damaged file is ignored and rewritten
        log("store", f"ignoring {path}: {type(e).__name__}: {e}")
        return []


def load(at):
    """The traces stored at `at` (where()), newest last, each a dict; [] when none."""
    if not enabled():
        return []
    path = _path(at)
    if path is None:
        return []
    traces = _read_all(path, at)
    for t in traces:
        ch = _trusted_read(f"{path[:-len('.traces')]}-{t['id']}.choices")
        t["choices"] = ch.decode(errors="replace") if ch else ""
        # the objects marshal does not carry (dtypes, sizes) were pickled apart
        t["consts"], t["out_spec"] = pickle.loads(t.pop("objects"))  # noqa: S301 -- as above
    return traces


def save(at, name, exported, text, out_spec, ops, inlined, mutates):
    """Stores a compiled root trace at `at` (where()); returns its id (for save_choices), or None
    with a log line saying why it is not stored."""
    if not enabled() or exported is None:
        return None
    path = _path(at)
    if path is None:
        return None
    consts = portable_consts(exported)
    if isinstance(consts, str):
        log("store", f"{name}: trace not stored: {consts}")
        return None
    try:
        code_bytes = marshal.dumps(exported["code"])
        checks, lines = list(exported["checks"]), [tuple(x) for x in exported["lines"]]
        entry = dict(objects=pickle.dumps((consts, out_spec)), code=code_bytes,
                     tensor_inputs=list(exported["tensor_inputs"]), text=text, ops=list(ops),
                     inlined=list(inlined), mutates=bool(mutates), name=name)
        entry["id"] = hashlib.sha256("\n".join([text] + checks).encode()).hexdigest()[:16]
        texts = marshal.dumps((checks, lines))  # for explain and logs only: a file apart
    except Exception as e:  # noqa: BLE001 -- not storable: record next time
        log("store", f"{name}: trace not stored: {type(e).__name__}: {e}")
        return None
    _write_atomic(f"{path[:-len('.traces')]}-{entry['id']}.guards", texts)
    traces = [t for t in _read_all(path, at) if t.get("id") != entry["id"]]
    traces = (traces + [entry])[-_MAX_TRACES:]
    _write_atomic(path, marshal.dumps(dict(format=_FORMAT, key=_key(at), traces=traces)))
    log("store", f"{name}: trace stored ({len(consts)} constants, {len(checks)} guards)")
    return entry["id"]


def texts(at, trace_id):
    """(checks, lines) of a stored trace's guards, for explain and logs; empty when unreadable."""
    path = _path(at)
    data = _trusted_read(f"{path[:-len('.traces')]}-{trace_id}.guards") if path is not None else None
    try:
        checks, lines = marshal.loads(data)
        return list(checks), list(lines)
    except Exception:  # noqa: BLE001 -- (a missing or damaged file: nothing to show)
        return [], []


def save_choices(at, trace_id, choices):
    path = _path(at) if enabled() else None
    if path is not None and trace_id is not None:
        _write_atomic(f"{path[:-len('.traces')]}-{trace_id}.choices", choices.encode())

