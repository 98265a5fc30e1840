"""Snapshots at side exits, and resuming the interpreter from one.

When the recording interpreter meets a data-dependent branch (`if t:` on a recorded tensor), the
trace gets a mid-trace guard (the IR's guard op) and this module keeps what is needed to continue
from the *other* branch: every live (inlined) Python frame with its code, the bytecode offset to
resume at, its locals and value stack. Each entry is encoded so that it means the same thing on
a later call with other inputs:

  ("src", expr)      a value read from a guarded source: re-read from this call's a, k, g, f
  ("live", i)        a tensor the trace computed: the exit's i-th live value
  ("inview", expr, sizes, strides, offset)  a view of an input's memory, made again from this call's
                     input (writes through it must reach the input)
  ("const", obj)     an immutable or identity-guarded object (ints, strings, functions, dtypes)
  ("liveview", i, sizes, strides, offset)  a view of the i-th live value (one memory with it)
  ("liveperm", i, dims) a tensor the trace computed in another dense order than row-major (x.t() * 2,
                     channels-last): the i-th live value, handed out in its memory order, permuted back
  ("bound", spec, name)  a builtin method bound to the object spec stands for (x.masked_select)
  ("tuple", ...), ("null",)
  ("siter", items, n), ("seqiter", seq, position, n)  an iterator (over a sequence's items, or
                     CPython's range/list/tuple iterator at a position), object n
  ("liter", spec, i, n)  a loop over a list at element i: live again over the list spec stands for
  ("list", items, n), ("dict", items, n, dict, OrderedDict or a defaultdict's maker), ("cell", spec, n, local),
  ("cell_empty", n, local), ("lazy", kind, parts, n, strict),
  ("obj", attrs, n, cls)  a mutable object the call holds (cls: a plain class whose instance the
                     call made, attrs its __dict__; a cell is local when the call made it, so the
                     resumed frame may assign it; lazy: a zip or an enumerate, its parts
                     as __reduce__ gives them): made again, once, as object n of the snapshot
  ("closure", n, code, globals, name, qualname, defaults, kwdefaults, cells, attrs)  a function
                     with a closure that the call made: made again around its cells, object n
  ("ref", n)         object n again: two frames holding one list (an accumulator passed to a
                     helper) must hold one list after the exit too, or appends through one would
                     not be seen through the other

What cannot be encoded faithfully (a tensor made outside the trace, a closure whose cells hold
itself, an object of a class with its own __new__ or slots) makes the branch abort the
recording instead; a local nothing reads after the resume point is left unbound instead
(_locals_spec).
"""
import collections
import functools
import re
import types

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .frames import CO_GENERATOR, NULL as _NULL, NoSnapshot, ResumeFailed, SourcedIter as _SourcedIter
from .frames import ItemRead, dense_order, plain_class as _plain_class
from .guards import EXIT, FUNC, Source
from .sources import recovered_source


_CONVERT_EXPR = {"item": "(lambda t: t.item())", "int": "int", "float": "float", "bool": "bool"}


def _convert(t, conv):
    return t.item() if conv == "item" else {"int": int, "float": float, "bool": bool}[conv](t)


class FrameState:
    __slots__ = ("code", "fn", "ip", "locals", "stack", "kw_names", "init")

    def __init__(self, code, fn, ip, locals_, stack, kw_names, init=False):
        self.code, self.fn, self.ip = code, fn, ip
        self.locals, self.stack, self.kw_names = locals_, stack, kw_names
        self.init = init  # an __init__ run by cls(...): the caller gets its self, not its return


class Snapshot:
    """The live frames at one side exit (outermost first) and the guard constants their
    source expressions may name."""

    def __init__(self, frames, consts, where, guard="branch"):
        self.frames = frames
        self.consts = consts
        self.where = where  # "file:line" of the branch, for explain()
        self.guard = guard  # what the exit's guard checks, for explain()
        self.count = 0      # times this exit was taken
        self.sides = []     # compiled side traces starting here (tracetree.Compiled)
        self.aborts = []    # why side-trace recordings from here failed
        self.retry_at = 0   # back-off: exit count before the next recording attempt
        self.blacklisted = None
        self.linked = False  # a side trace is linked natively (the C API) to this exit
        self.step = None     # a stitch: (kind, specs of its stack operands, extra): "call" (extra: the
        #                      keyword names), "setattr" / "delattr" (the name), "setitem"
        self.step_fn = None  # the step's operands as one compiled function (a, k, g, f, x) -> list
        self.pre = []        # a stitch: sources the frames hold values of, read before its step
        #                      (the step may rebind them: a global counter it increments); the
        #                      values follow the step's result among the exit's values
        self.pre_fn = None   # those reads as one compiled function (a, k, g, f, x) -> list
        self.pre_now = None  # their values at the stitch of the recording call (taken before the step)
        self.owner = None    # the compiled trace whose cut exit this is (set when it compiles)
        self.value_cut = False  # a cut at a branch on, or a read of, a tensor's value (grad on):
        #                      taken every call, its continuation recorded at once, one per value
        self.bucket_cut = False  # a cut at a DDP bucket's end (config.ddp_bucket_mb): taken every
        #                      call, its continuation recorded at once (a side trace)
        self.branch_truth = None  # a branch on a tensor: what the recording took (size probes take it too)

    def fresh_copy(self):
        """This branch exit for another trace of the same program (a size family's instance):
        the same frames to resume, none of this one's counts, side traces or links."""
        out = Snapshot(self.frames, self.consts, self.where, self.guard)
        assert self.step is None and not self.value_cut and not self.bucket_cut, "a branch exit only"
        out.branch_truth = self.branch_truth
        return out

    @property
    def plain_branch(self):
        """A side exit at a branch (not a stitch or a cut)."""
        return self.step is None and not self.value_cut and not self.bucket_cut


_DICTS = (dict, collections.OrderedDict)  # exactly these: rebuilt empty, then filled in order
_CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size, slice,
                range, type, types.BuiltinFunctionType, types.ModuleType, type(Ellipsis))


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type())


def _plain_object(interp, x):
    """x is an instance the call made (object.__new__) of a plain Python class, its state all in
    its __dict__."""
    t = type(x)
    # (object.__new__ must be able to make it again: every base is a class defined in Python; a
    # subclass of tuple, list, OrderedDict, ... keeps its contents outside __dict__)
    return id(x) in interp.local_objs and _plain_class(t) and isinstance(getattr(x, "__dict__", None), dict) and \
        all("__slots__" not in c.__dict__ for c in t.__mro__[:-1]) and \
        all(c is object or c.__flags__ & _HEAPTYPE for c in t.__mro__)


def _object_number(x, live_index):
    """(n, seen): x's number among the snapshot's mutable objects (kept in live_index under
    ("ref", id(x)); live_index otherwise maps live tensors), and whether it was numbered before."""
    key = ("ref", id(x))
    if key in live_index:
        return live_index[key], True
    n = live_index.get("refs", 0)
    live_index["refs"] = n + 1
    live_index[key] = n
    return n, False


def spec_objects(spec, out):
    """Adds to out the numbers of the mutable objects spec holds or refers to (at any depth)."""
    kind = spec[0]
    if kind in ("ref", "cell_empty"):
        out.add(spec[1])
    elif kind in ("list", "tuple", "siter"):
        if kind != "tuple":
            out.add(spec[2])
        for e in spec[1]:
            spec_objects(e, out)
    elif kind in ("dict", "obj"):
        out.add(spec[2])
        for _, e in spec[1]:
            spec_objects(e, out)
    elif kind == "cell":
        out.add(spec[2])
        spec_objects(spec[1], out)
    elif kind == "lazy":
        out.add(spec[3])
        for e in spec[2]:
            spec_objects(e, out)
    elif kind in ("seqiter", "liter"):
        out.add(spec[-1])
        spec_objects(spec[1], out)
    elif kind == "bound":
        spec_objects(spec[1], out)
    elif kind == "closure":
        out.add(spec[1])
        parts = ([spec[6]] if spec[6] else []) + [s for _, s in spec[7] or ()] + list(spec[8]) + [s for _, s in spec[9]]
        for e in parts:
            spec_objects(e, out)
    return out


def encode(interp, x, src, live, live_index):
    """The spec of interpreter value x (read from src, or None). Mutable objects (lists, dicts,
    cells, plain objects the call made) are numbered in live_index, so that each is one object
    again when the snapshot is decoded."""
    if x is _NULL:
        return ("null",)
    if isinstance(x, torch.Tensor):
        return _encode_tensor(interp, x, src, live, live_index)
    if type(src) is ItemRead:  # a number read from a live tensor, its exit not made yet
        return ("item", live_number(src.t, live, live_index), src.conv)
    # (an object from outside the call that went through a local dict: where it was first read)
    found = src or (recovered_source(interp, x) if id(x) not in interp.local_objs else None)
    if found is not None and not found.expr.startswith("x["):
        return ("src", found.expr)
    # (a value a side trace read as x[i] -- a stitch's result -- is encoded by what it is: the
    # next exit's x is another one)
    t = type(x)
    if t is types.BuiltinMethodType and x.__self__ is not None and not isinstance(x.__self__, types.ModuleType):
        # x0.masked_select on the stack: bound to this call's object, which must be this call's again
        return ("bound", encode(interp, x.__self__, None, live, live_index), x.__name__)
    if isinstance(x, _CONST_TYPES):
        return ("const", x)
    if t is types.FunctionType:
        if x.__closure__ and id(x) in interp.local_objs:
            return _encode_closure(interp, x, live, live_index)
        return ("const", x)
    if t is tuple:
        srcs = interp._tuple_srcs.get(id(x)) or [None] * len(x)
        return ("tuple", [encode(interp, e, s, live, live_index) for e, s in zip(x, srcs)])
    if t is types.CellType and id(x) in interp.outer_cells and id(x) not in interp.local_objs:
        # a closure cell from outside the call (a nonlocal of an enclosing function): the cell
        # itself, never a copy -- a store after the exit must reach the program's cell, and a
        # read must see what the stitch's step wrote into it
        csrc = interp.outer_cells[id(x)]
        return ("src", csrc.expr) if csrc is not None else ("const", x)
    if t is list or t in _DICTS or t is collections.defaultdict or t is types.CellType or t in _LAZY or \
            t is _SourcedIter or t.__name__ in _SEQ_ITERATORS or _plain_object(interp, x):
        # (an iterator is an object too: the frames and a stitch's step holding one iterator
        # must hold one after it, or next() through one would not move the other)
        n, seen = _object_number(x, live_index)
        if seen:
            return ("ref", n)
    if t is list:
        return ("list", [encode(interp, e, None, live, live_index) for e in x], n)
    if t in _DICTS or t is collections.defaultdict:
        return _encode_dict(interp, x, n, live, live_index)
    if t is _SourcedIter and x.seq is not None:  # live over a list: the list and the position
        return ("liter", encode(interp, x.seq, x.src, live, live_index), x.i, n)
    if t is _SourcedIter:
        rest = range(x.i, len(x.items))
        return ("siter", [encode(interp, x.items[j], x.srcs[j], live, live_index) for j in rest], n)
    if t is types.CellType:
        local = id(x) in interp.local_objs  # made by this call (MAKE_CELL): it may be assigned again
        try:
            v = x.cell_contents
        except ValueError:
            return ("cell_empty", n, local)
        return ("cell", encode(interp, v, interp._cell_src.get(id(x)), live, live_index), n, local)
    if t.__name__ in _SEQ_ITERATORS:
        r = x.__reduce__()  # (iter, (seq,), position); an exhausted one: (iter, ((),))
        seq = r[1][0]
        seq_src = None
        if type(seq) is list and id(seq) not in interp.local_objs:
            # made again over a copy, it would not see the program's appends to the real list: it
            # must be this call's list, read again from where the call found it (a builtin such
            # as zip() was handed it: interp.outer_lists)
            seq_src = interp.outer_lists.get(id(seq))
            if seq_src is None or seq_src.expr.startswith("x["):
                raise NoSnapshot("an iterator over a list from outside the call is live at the branch")
        return ("seqiter", encode(interp, seq, seq_src, live, live_index), r[2] if len(r) > 2 else 0, n)
    if t in _LAZY:  # zip / enumerate over iterators: what they hold, in order
        r = x.__reduce__()
        parts = [encode(interp, p, None, live, live_index) for p in r[1]]
        return ("lazy", t.__name__, parts, n, len(r) > 2 and bool(r[2]))
    if _plain_object(interp, x):  # numbered above
        attrs = [(name, encode(interp, v, None, live, live_index)) for name, v in x.__dict__.items()]
        return ("obj", attrs, n, t)
    raise NoSnapshot(f"a {t.__name__} object is live at the branch")


def encode_pair(interp, p, live, live_index):
    """The spec of a stack or local pair. A number or a shape computed from tensor sizes (a pair
    sizeflow.py tracks) is encoded as those tensors' sizes, read where the snapshot is resumed:
    a size family's instance (sizes.py) that takes the exit resumes with its own sizes. One that
    is not a sum of products of sizes (a floor division), or whose tensors cannot be carried,
    is a constant, and its sizes are fixed for size families."""
    if getattr(p, "dims", None):
        spec = _encode_sized(interp, p, live, live_index)
        if spec is not None:
            return spec
        interp.sizes.fix_at_snapshot(p)
    return encode(interp, p[0], p[1], live, live_index)


def _encode_sized(interp, p, live, live_index):
    v = p[0]
    if p.elems is None:
        return _sized_number(interp, p.expr, live, live_index) if p.expr is not None else None
    if type(v) not in (tuple, torch.Size) or any(e is None for e in p.exprs):
        return None
    specs = [_sized_number(interp, e, live, live_index) for e in p.exprs]
    return None if any(x is None for x in specs) else ("sizes", specs, type(v) is torch.Size)


def _sized_number(interp, expr, live, live_index):
    """("sized", [(coefficient, [(tensor spec, dim), ...]), ...]) of a polynomial over (trace
    value name, dim) keys, or None when a tensor it reads is not at hand."""
    named = {}
    for t in interp.rec.keep:
        n = interp.rec.vals.get(id(t)) if isinstance(t, torch.Tensor) else None
        if n is not None:
            named.setdefault(n, t)
    terms = []
    for mono, coef in expr:
        if coef.denominator != 1:
            return None
        factors = []
        for name, d in mono:
            t = named.get(name)
            if t is None:
                return None
            try:
                factors.append((encode(interp, t, _src_of(interp, t), live, live_index), d))
            except NoSnapshot:
                return None
        terms.append((int(coef), factors))
    return ("sized", terms)


def _src_of(interp, t):
    expr = interp.tensor_src.get(id(t))
    return Source(expr) if expr is not None else None


def _encode_closure(interp, x, live, live_index):
    """("closure", n, code, globals, name, qualname, defaults, keyword defaults, cells, attributes)
    of a function with a closure that the call made (a decorator's wrapper, Hugging Face's mask
    functions): made again from its code around its cells, each one object again (the frames
    holding a cell and the function share it). One whose cells hold itself is not carried."""
    if any(_cell_holds(c, x) for c in x.__closure__):
        raise NoSnapshot(f"a recursive closure made inside the function ({x.__qualname__}) is live")
    n, seen = _object_number(x, live_index)
    if seen:
        return ("ref", n)
    enc = lambda v: encode(interp, v, None, live, live_index)  # noqa: E731
    return ("closure", n, x.__code__, x.__globals__, x.__name__, x.__qualname__,
            enc(x.__defaults__) if x.__defaults__ else None,
            [(k, enc(v)) for k, v in x.__kwdefaults__.items()] if x.__kwdefaults__ else None,
            [enc(c) for c in x.__closure__], [(k, enc(v)) for k, v in x.__dict__.items()])


def _cell_holds(cell, x):
    try:
        return cell.cell_contents is x
    except ValueError:  # (an empty cell)
        return False


def _make_closure(spec, made, dec):
    """The function a "closure" spec stands for; dec(spec) decodes a part."""
    _, n, code, glb, name, qual, defaults, kwdefaults, cells, attrs = spec
    fn = types.FunctionType(code, glb, name, dec(defaults) if defaults else None, tuple(dec(c) for c in cells))
    made[n] = fn
    fn.__qualname__ = qual
    if kwdefaults:
        fn.__kwdefaults__ = {k: dec(s) for k, s in kwdefaults}
    for k, s in attrs:
        fn.__dict__[k] = dec(s)
    return fn


def _encode_dict(interp, x, n, live, live_index):
    """("dict", items, n, what makes it) of a dict, an OrderedDict or a defaultdict (Hugging
    Face's check_model_inputs collects outputs in a defaultdict(tuple)): made again with the same
    default factory, which must be a class or a function from outside the call."""
    t = type(x)
    if t is collections.defaultdict:
        factory = x.default_factory
        if not (factory is None or isinstance(factory, type) or
                (type(factory) in (types.FunctionType, types.BuiltinFunctionType) and id(factory) not in interp.local_objs)):
            raise NoSnapshot("a defaultdict whose default factory was made in the call is live")
        t = functools.partial(collections.defaultdict, factory)
    srcs = interp.dict_srcs(x)
    return ("dict", [(k, encode(interp, v, srcs.get(k), live, live_index)) for k, v in x.items()], n, t)


def live_number(t, live, live_index):
    """t's position among the snapshot's live tensors (added when new)."""
    if id(t) not in live_index:
        live_index[id(t)] = len(live)
        live.append(t)
    return live_index[id(t)]


def _encode_tensor(interp, x, src, live, live_index):
    """The spec of tensor x: its source (an input), a view of an input, a view of a live value, or
    a live value itself."""
    name = interp.rec.vals.get(id(x))
    if src is not None and (name is None or name in interp.rec.input_names) and not src.expr.startswith("x["):
        return ("src", src.expr)  # an input (perhaps not read yet): this call's own
    # (a side trace's x[i], the parent exit's values, is not at hand when the side trace exits in
    # turn: it is handed back as a live value like any tensor the trace holds)
    if id(x) in interp.rec.pairs:
        raise NoSnapshot("a complex tensor is live (the trace holds it as float pairs, which it does not hand out)")
    view = _input_view(interp, x)
    if view is not None:
        return view
    if x._base is not None and id(x._base) in interp.rec.vals:
        return _live_view(interp, x, live, live_index)
    if name is None:
        raise NoSnapshot("a tensor made outside the trace is live")
    if not x.is_contiguous():  # (transposed, channels-last: eager's layout, kept through the exit)
        return _live_in_memory_order(interp, x, live, live_index)
    return ("live", live_number(x, live, live_index))


def _live_in_memory_order(interp, x, live, live_index):
    """("liveperm", i, dims) for x, a tensor the trace computed that is not row-major but a
    permutation of it (x * 2 of a transposed input keeps its layout, as TensorIterator does):
    the live value is x permuted into its memory order (a view in the trace), which the exit
    hands out dense -- the same memory layout as x -- and the resumed program gets it permuted
    back, with eager's strides (is_contiguous(), stride(), view() answer as in eager; in-place
    writes into it are writes through a permute, which side traces record)."""
    order = dense_order(x)
    if order is None:
        raise NoSnapshot("a tensor the trace computed with overlapping or gapped strides is live")
    outer_first = order[::-1]
    back = tuple(sorted(range(len(outer_first)), key=outer_first.__getitem__))
    if id(x) not in live_index:
        y = x.permute(outer_first)  # recorded: a view op of the trace
        if interp.rec.vals.get(id(y)) is None:
            raise NoSnapshot("a non-contiguous tensor is live and its layout could not be recorded")
        live_index[id(x)] = len(live)
        live.append(y)
    return ("liveperm", live_index[id(x)], back)


def _input_view(interp, x):
    """("inview", source, sizes, strides, offset) when tensor x is a view of an input's memory:
    it must be that view of this call's input again (a copy would not see, nor make, writes
    through it), re-derived with the strides eager gave it (the input's layout is guarded)."""
    if x.numel() == 0:
        return None
    found = _input_memory(interp).get(_memory_of(x))
    if found is None:
        return None
    expr, t = found
    if x is t:  # the input itself (written in place: `y = p.add_(1)`): this call's input object again
        return ("src", expr)
    for tid, iexpr in interp.tensor_src.items():  # another input of that memory, itself
        if interp.input_objs.get(tid) is x and not iexpr.startswith("x["):
            return ("src", iexpr)
    return ("inview", expr, tuple(x.shape), tuple(x.stride()), x.storage_offset() - t.storage_offset())


def _memory_of(t):
    """Where t's storage starts (the storage's data pointer, without making a storage object); a
    size probe's fake tensor has no data: its storage's identity instead."""
    if isinstance(t, FakeTensor):
        return ("fake", t.untyped_storage()._cdata)
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _input_memory(interp):
    """{storage start: (source, tensor)} of the call's input tensors, the first input of each
    memory; kept up to date on interp as inputs are added (a snapshot asks once per live tensor:
    rebuilding it each time made a detection model's snapshots quadratic, seconds per call)."""
    index, seen = getattr(interp, "_input_memory", None) or ({}, 0)
    items = interp.tensor_src
    if seen != len(items):
        for tid, expr in list(items.items())[seen:]:
            if expr.startswith("x["):  # a parent exit's values: copies, not the caller's memory
                continue
            t = interp.input_objs.get(tid)
            if t is not None and t.numel():
                index.setdefault(_memory_of(t), (expr, t))
        seen = len(items)
    interp._input_memory = (index, seen)
    return index


def _live_view(interp, x, live, live_index):
    """("liveview", i, sizes, strides, offset): x is a view of a tensor the trace computed (t2 =
    t1.reshape(-1)); both must stay one memory after the exit (t2.relu_() changes t1), so x is
    made again from its base's live value, with the strides eager gave it over a contiguous base."""
    b = x._base
    spec = encode(interp, b, None, live, live_index)
    # (a non-contiguous base is handed on in its memory order: the same memory layout)
    if spec[0] not in ("live", "liveperm"):
        raise NoSnapshot("a view of a tensor the trace does not hand back is live")
    return ("liveview", spec[1], tuple(x.shape), tuple(x.stride()), x.storage_offset() - b.storage_offset())


def _made(env):
    """The objects decoded so far in this decoding (env is one per resume or step)."""
    return env.setdefault("_dynamo_objects", {})


def decode(spec, env, live):
    kind = spec[0]
    if kind == "ref":
        return _made(env)[spec[1]]
    if kind == "live":
        return live[spec[1]]
    if kind == "src":
        return eval(spec[1], env)  # noqa: S307 -- our own guard expressions
    if kind == "const":
        return spec[1]
    if kind == "liveview":
        return live[spec[1]].as_strided(spec[2], spec[3], live[spec[1]].storage_offset() + spec[4])
    if kind == "liveperm":
        return live[spec[1]].permute(spec[2])
    if kind == "bound":
        return getattr(decode(spec[1], env, live), spec[2])
    if kind == "inview":
        t = eval(spec[1], env)  # noqa: S307 -- our own guard expressions
        return t.as_strided(spec[2], spec[3], t.storage_offset() + spec[4])
    if kind == "null":
        return _NULL
    if kind == "tuple":
        return tuple(decode(s, env, live) for s in spec[1])
    if kind == "list":
        out = _made(env)[spec[2]] = []  # registered first: it may hold itself
        out.extend(decode(s, env, live) for s in spec[1])
        return out
    if kind == "dict":
        out = _made(env)[spec[2]] = spec[3]()
        for k, s in spec[1]:
            out[k] = decode(s, env, live)
        return out
    if kind == "obj":
        out = _made(env)[spec[2]] = object.__new__(spec[3])
        for name, s in spec[1]:
            out.__dict__[name] = decode(s, env, live)
        return out
    if kind == "siter":
        items = [decode(s, env, live) for s in spec[1]]
        out = _made(env)[spec[2]] = _SourcedIter(items, [None] * len(items))
        return out
    if kind == "liter":
        out = _made(env)[spec[3]] = _SourcedIter.live(decode(spec[1], env, live), None, spec[2])
        return out
    if kind == "cell":
        out = _made(env)[spec[2]] = types.CellType()
        out.cell_contents = decode(spec[1], env, live)
        return out
    if kind == "cell_empty":
        out = _made(env)[spec[1]] = types.CellType()
        return out
    if kind == "item":  # the number .item()/int()/float()/bool() read from a live tensor
        return _convert(live[spec[1]], spec[2])
    if kind == "seqiter":
        out = _made(env)[spec[3]] = _seqiter(decode(spec[1], env, live), spec[2])
        return out
    if kind == "lazy":
        out = _made(env)[spec[3]] = _lazy(spec, [decode(p, env, live) for p in spec[2]])
        return out
    if kind == "closure":
        return _make_closure(spec, _made(env), lambda s: decode(s, env, live))
    if kind == "sized":  # a number computed from sizes: at the sizes of this run's tensors
        total = 0
        for coef, factors in spec[1]:
            for ts, d in factors:
                coef *= decode(ts, env, live).shape[d]
            total += coef
        return total
    if kind == "sizes":
        out = tuple(decode(s, env, live) for s in spec[1])
        return torch.Size(out) if spec[2] else out
    raise AssertionError(f"unknown snapshot spec {kind}")


def _seqiter(seq, position):
    it = iter(seq)
    if position:
        it.__setstate__(position)
    return it


_SEQ_ITERATORS = ("range_iterator", "list_iterator", "tuple_iterator")

# Iterators that only rearrange what their parts yield (map and filter call functions as they go,
# outside the interpreter: they stay unencodable).
_LAZY = (zip, enumerate)


def _lazy(spec, parts):
    """A zip / enumerate again, over its decoded parts (as its __reduce__ gave them)."""
    if spec[1] == "zip":
        return zip(*parts, strict=True) if spec[4] else zip(*parts)
    return enumerate(parts[0], parts[1])


_SOURCE_CODE = {}  # source expression -> its compiled code (a side trace's inputs are read at every recording)


def _source_code(expr):
    code = _SOURCE_CODE.get(expr)
    if code is None:
        if len(_SOURCE_CODE) > 20000:
            _SOURCE_CODE.clear()
        code = _SOURCE_CODE[expr] = compile(expr, "<dynamo source>", "eval")
    return code


def eval_source(expr, env, rec):
    """The value of source expr now, read without recording: a source may make a tensor (the
    guards' `c7(c8, dtype=c9)` for a torch.tensor of numbers), which is the trace's input, not
    an op of the trace being recorded."""
    rec.paused += 1
    try:
        return eval(_source_code(expr), env)  # noqa: S307 -- our own guard expressions
    finally:
        rec.paused -= 1


def _decode_pair(spec, env, live, interp):
    """(value, source) for recording a side trace: sourced values keep their source, live
    tensors become the side trace's inputs x[i]; both are guarded as they are read."""
    kind = spec[0]
    if kind == "ref":
        return _made(env)[spec[1]], None
    if kind == "src":
        v, src = eval_source(spec[1], env, interp.rec), Source(spec[1])
        if type(v) is types.CellType:  # a closure cell from outside the call (see encode)
            interp._cell_src.setdefault(id(v), src.attr("cell_contents"))
            interp.outer_cells.setdefault(id(v), src)
            return v, None
    elif kind == "live":
        v, src = live[spec[1]], EXIT.item(spec[1])
    elif kind == "liter":
        seq, ssrc = _decode_pair(spec[1], env, live, interp)
        v = _made(env)[spec[3]] = interp._mark_local(_SourcedIter.live(seq, ssrc, spec[2]))
        return v, None
    elif kind in ("tuple", "siter"):
        pairs = [_decode_pair(s, env, live, interp) for s in spec[1]]
        if kind == "siter":
            v = _made(env)[spec[2]] = interp._mark_local(_SourcedIter([p[0] for p in pairs], [p[1] for p in pairs]))
            return v, None
        v = tuple(p[0] for p in pairs)
        interp._tuple_srcs[id(v)] = [p[1] for p in pairs]
        interp.keep.append(v)
        return v, None
    elif kind == "list":
        v = _made(env)[spec[2]] = interp._mark_local([])
        v.extend(_decode_pair(s, env, live, interp)[0] for s in spec[1])
        return v, None
    elif kind == "dict":
        v = _made(env)[spec[2]] = interp._mark_local(spec[3]())
        srcs = {}
        for k, s in spec[1]:
            v[k], srcs[k] = _decode_pair(s, env, live, interp)
        interp.note_dict_srcs(v, srcs)
        return v, None
    elif kind == "obj":
        v = _made(env)[spec[2]] = interp._mark_local(object.__new__(spec[3]))
        for name, s in spec[1]:
            v.__dict__[name] = _decode_pair(s, env, live, interp)[0]
        return v, None
    elif kind == "item":
        return _decode_item(spec, live, interp)
    elif kind == "bound":
        return getattr(_decode_pair(spec[1], env, live, interp)[0], spec[2]), None
    elif kind in ("cell", "cell_empty"):
        return _decode_cell(spec, env, live, interp)
    elif kind == "seqiter":
        # (made by this resume at the snapshot's position on every call: the side trace may
        # specialize on what next() gives, as on an iterator the call made)
        seq, ssrc = _decode_pair(spec[1], env, live, interp)
        if type(seq) is list and ssrc is not None and id(seq) not in interp.local_objs:
            interp.outer_lists.setdefault(id(seq), ssrc)  # (this call's list, as encode found it)
            interp.keep.append(seq)
        v = _made(env)[spec[3]] = interp._mark_local(_seqiter(seq, spec[2]))
        return v, None
    elif kind == "lazy":
        v = _made(env)[spec[3]] = _lazy(spec, [_decode_pair(p, env, live, interp)[0] for p in spec[2]])
        interp.keep.append(v)
        return v, None
    elif kind == "closure":  # (a function of the call's own, as MAKE_FUNCTION made it)
        return interp._mark_local(_make_closure(spec, _made(env), lambda s: _decode_pair(s, env, live, interp)[0])), None
    else:
        return decode(spec, env, live), None
    interp.touch(v, src)
    return v, src


def _decode_item(spec, live, interp):
    """_decode_pair of a number read from a live tensor (.item(), float(), ...): the side trace
    specializes on it (its guards read it back from x[i]), or, compared with a Python number
    later, defers the read as the recording did (cuts._compare_item)."""
    expr = f"{_CONVERT_EXPR[spec[2]]}(x[{spec[1]}])"
    interp.rec.paused += 1  # reading the number is not part of the side trace
    try:
        v = _convert(live[spec[1]], spec[2])
    finally:
        interp.rec.paused -= 1
    t = live[spec[1]]
    interp.touch(t, EXIT.item(spec[1]))
    if spec[2] in ("item", "float") and t.is_floating_point() and type(v) is float and interp.rec.known(t) \
            and not interp._cut_for_grad():
        interp.deferred_reads += 1  # (guarded where it is used, as at the read: cuts._compare_item)
        return v, ItemRead(t, spec[2])
    interp.guards.guard_state(expr, v, f"the value read at the exit ({expr})")
    return v, None


def _decode_cell(spec, env, live, interp):
    """_decode_pair of a cell the call made (a "cell" or "cell_empty" spec): made again, once,
    local when the call made it (the resumed frame may assign it)."""
    full = spec[0] == "cell"
    cell = _made(env)[spec[2] if full else spec[1]] = types.CellType()
    interp.keep.append(cell)
    local = (len(spec) > 3 and spec[3]) if full else (len(spec) > 2 and spec[2])
    if local:
        interp._mark_local(cell)
    if full:
        cell.cell_contents, isrc = _decode_pair(spec[1], env, live, interp)
        interp._cell_src[id(cell)] = isrc
    return cell, None


def _step_expr(spec, names):
    """spec as a Python expression over a, k, g, f and x (the live values), or None; constants
    it needs are added to names (name -> object)."""
    kind = spec[0]
    if kind == "src":
        return f"({spec[1]})"
    if kind == "live":
        return f"x[{spec[1]}]"
    if kind in ("const", "null"):
        name = f"_s{len(names)}"
        names[name] = spec[1] if kind == "const" else _NULL
        return name
    if kind == "tuple":
        parts = [_step_expr(x, names) for x in spec[1]]
        if None in parts:
            return None
        return f"({', '.join(parts)},)"
    if kind == "list" and not spec_objects(spec, set()) - {spec[2]}:
        # a list of tensors and constants, held by nothing else: made anew each call
        parts = [_step_expr(x, names) for x in spec[1]]
        return None if None in parts else f"[{', '.join(parts)}]"
    if kind == "bound":
        inner = _step_expr(spec[1], names)
        return None if inner is None else f"getattr({inner}, {spec[2]!r})"
    if kind == "liveview":
        return f"x[{spec[1]}].as_strided({spec[2]!r}, {spec[3]!r}, x[{spec[1]}].storage_offset() + {spec[4]})"
    if kind == "liveperm":
        return f"x[{spec[1]}].permute({spec[2]!r})"
    return None


def compile_step(snap):
    """The stitch's operands as one function (a, k, g, f, x) -> list, compiled once: decoding
    the specs on every call (eval of each source's text) cost ~15 us. None when a spec has no
    expression form (then run_step decodes them one by one)."""
    names = {}
    parts = [_step_expr(sp, names) for sp in snap.step[1]]
    if None in parts:
        return None
    env = dict(snap.consts, Tensor=torch.Tensor, torch=torch, **names)
    exec(compile(f"def step(a, k, g, f, x):\n    return [{', '.join(parts)}]", "<dynamo stitch>", "exec"), env)
    return env["step"]


def run_step(snap, fn, args, kwargs, live):
    """Makes the step a stitch snapshot stands before and returns its result: a call as
    CPython 3.11's CALL makes it (the stack holds NULL and the callable, or a method and its
    self, then the arguments; the last len(kw_names) are keywords), or STORE_ATTR's setattr(obj,
    name, value) / STORE_SUBSCR's container[key] = value (None). Rebuilding the operands can fail
    (ResumeFailed, nothing of the step made yet); the step's own exception propagates."""
    kind, specs, extra = snap.step
    try:
        if snap.step_fn is None:
            snap.step_fn = compile_step(snap) or False
        if snap.step_fn:
            ops = snap.step_fn(args, kwargs, fn.__globals__, fn, live)
        else:
            env = dict(snap.consts, a=args, k=kwargs, g=fn.__globals__, f=fn, Tensor=torch.Tensor, torch=torch)
            ops = [decode(s, env, live) for s in specs]
    except Exception as e:  # noqa: BLE001
        raise ResumeFailed(f"cannot rebuild the call at {snap.where}: {type(e).__name__}: {e}") from e
    if kind == "setattr":  # stack: value, object
        setattr(ops[1], extra, ops[0])
        return None
    if kind == "setitem":  # stack: value, container, key
        ops[1][ops[2]] = ops[0]
        return None
    if kind == "delattr":  # stack: object
        delattr(ops[0], extra)
        return None
    kw_names = extra
    first, second, items = ops[0], ops[1], ops[2:]
    if first is _NULL:
        callee = second
    else:
        callee, items = first, [second] + items
    if kw_names:
        n = len(items) - len(kw_names)
        return callee(*items[:n], **dict(zip(kw_names, items[n:])))
    return callee(*items)


# ---------------------------------------------------------------------------------------------
# Taking a snapshot: the interpreter's frames as they are now


def where(f, full=False):
    """'file:line' of the bytecode interpreter frame f last started (full: the file's path)."""
    ins = f.dec.insts[f.ip - 1]
    line = ins.positions.lineno if getattr(ins, "positions", None) else "?"
    return f"{f.code.co_filename if full else f.code.co_filename.rsplit('/', 1)[-1]}:{line}"


def take(interp, f, resume_ip, guard, stack=None, kw_names=None):
    """(Snapshot, live tensors, their index: id -> position) of the interpreter's live frames,
    the innermost being f, to resume at bytecode index resume_ip (with stack and kw_names in
    place of f's own where given: the state at the start of the current bytecode). guard: what
    the exit checks, for explain(). Raises NoSnapshot when the state cannot be carried."""
    live, index = [], {}
    saved = f.stack, f.kw_names
    if stack is not None:
        f.stack, f.kw_names = stack, kw_names
    try:
        frames = _frame_states(interp, f, resume_ip, live, index)
    finally:
        f.stack, f.kw_names = saved
    return Snapshot(frames, interp.guards._consts, where(f), guard), live, index


def _frame_states(interp, f, resume_ip, live, index):
    if interp.writebacks:
        # (the trace sets them after its native run; an exit's snapshot would have to carry them)
        raise NoSnapshot(f"the call set attribute {interp.writebacks[0][1]} of {interp.writebacks[0][0].expr} "
                         "before it (a write-back)")
    if torch.is_grad_enabled() != interp.grad_at_start:
        raise NoSnapshot("grad mode differs from the trace's start here (inside torch.no_grad() or the like)")
    if any(fr.code.co_flags & CO_GENERATOR for fr in interp.frames):
        # a generator's frame runs under whatever iterates it (all(), list(), ...), which
        # cannot be rebuilt in Python
        raise NoSnapshot("it is inside a generator")
    frames = []
    for fr in interp.frames:
        if fr.fn_src is FUNC:
            fn_spec = ("func",)
        elif fr.fn_src is not None and fr.fn_src.expr.startswith("x["):
            # a function read from a value an earlier stitch made (`__import__(m).f`): the
            # values of that exit are not at hand where this one resumes
            raise NoSnapshot("a function called from a value a stitch made is live")
        elif fr.fn_src is not None:
            fn_spec = ("src", fr.fn_src.expr)
        else:
            fn_spec = ("const", fr.fn)
        enc = lambda pair: encode_pair(interp, pair, live, index)  # noqa: E731
        ip = resume_ip if fr is f else fr.ip
        frames.append(FrameState(fr.code, fn_spec, ip, _locals_spec(interp, fr, ip, live, index),
                                 [enc(p) for p in fr.stack], fr.kw_names, fr.init))
    return frames


def _locals_spec(interp, fr, ip, live, index):
    """The specs of frame fr's locals, resuming at instruction ip. A local that cannot be carried
    (a closure made in the call, an object of a kind snapshots do not make again) is left unbound
    where nothing from ip on reads it (_Code.unread_from): a wrapper's helper defined before the
    call it wraps does not keep the whole call from having side exits."""
    specs = []
    for i, p in enumerate(fr.locals):
        n_live, n_index, refs = len(live), len(index), index.get("refs")
        try:
            spec = encode_pair(interp, p, live, index)
        except NoSnapshot:
            # (an object with a finalizer -- a generator suspended in a try block -- must stay
            # held to the call's end, where CPython drops the frame's locals and runs it)
            if (fr.init and i == 0) or i not in fr.dec.unread_from(ip) or hasattr(type(p[0]), "__del__"):
                raise
            # what the failed encode added is taken back: live values and numbered objects are
            # only appended, and the object counter only grows
            del live[n_live:]
            for k in list(index)[n_index:]:
                del index[k]
            if refs is not None:
                index["refs"] = refs
            spec = ("null",)
        specs.append(spec)
    return specs


def for_stitch(interp, f, ip, stack, kw_names, why, step):
    """(Snapshot, live tensors) of a stitch at f's bytecode index ip, whose operands are the top
    of `stack`: the frames as they will be *after* the step, with its result as one more live
    value where it pushes one, and the step itself (snap.step: its kind, the specs of its
    operands, extra). step: (kind, number of operands, extra, pushes). None when the state
    cannot be carried, or the step's operands are objects the frames also hold (decoded for the
    step alone, a list passed to the call and kept in a local would then be two lists)."""
    kind, nops, extra, pushes = step
    try:
        snap, live, _ = take(interp, f, ip, f"stitch: {why}", stack, kw_names)
    except NoSnapshot:
        return None
    inner = snap.frames[-1]
    k = len(inner.stack) - nops
    held, ops = set(), set()
    for fs in snap.frames:
        for sp in fs.locals + (fs.stack[:k] if fs is inner else fs.stack):
            spec_objects(sp, held)
    for sp in inner.stack[k:]:
        spec_objects(sp, ops)
    if held & ops:
        return None
    after = inner.stack[:k] + ([("live", len(live))] if pushes else [])
    snap.frames[-1] = FrameState(inner.code, inner.fn, ip + 1, inner.locals, after, (), inner.init)
    snap.step = (kind, inner.stack[k:], extra)
    _read_before_step(snap, interp, stack[:k], len(live) + 1)
    return snap, live


# The sources a step cannot rebind: the call's own arguments (a[0], k['x']) and the function.
# Of the rest, numbers and strings are read before the step (the continuation is guarded on
# them: what it derives from them at its own exits holds); objects are read again after it, as
# their identity is what the frames hold (a step rebinding an attribute to another object is not
# followed there).
_HELD_BY_VALUE = (int, float, bool, str, bytes, complex, type(None))
_FIXED_SOURCE = re.compile(r"^(?:[ak]\[[^\[\]]+\]|f)$")


def _read_before_step(snap, interp, inner_stack, first):
    """The numbers and strings the stitch's frames hold that were read from a source (a global,
    an attribute, an item) are what the source held before the step: decoded again after it, a
    global the step increments would read its new value where the program holds the old. Each
    becomes a value of the exit (("live", first + j): after the step's result), read before the
    step on later calls (snap.pre) and taken now from the recording's frames (snap.pre_now)."""
    pre, now = [], []

    def swap(specs, pairs):
        out = []
        for sp, (v, _) in zip(specs, pairs):
            if sp[0] == "src" and type(v) in _HELD_BY_VALUE and not _FIXED_SOURCE.match(sp[1]):
                out.append(("live", first + len(pre)))
                pre.append(sp[1])
                now.append(v)
            else:
                out.append(sp)
        return out
    for i, (fs, fr) in enumerate(zip(snap.frames, interp.frames)):
        stack_pairs = inner_stack if i == len(snap.frames) - 1 else fr.stack
        # (the inner frame's stack after the step ends with its result, which is no source)
        n = len(stack_pairs)
        snap.frames[i] = FrameState(fs.code, fs.fn, fs.ip, swap(fs.locals, fr.locals),
                                    swap(fs.stack[:n], stack_pairs) + fs.stack[n:], fs.kw_names, fs.init)
    snap.pre, snap.pre_now = pre, now


def read_before_step(snap, fn, args, kwargs, live):
    """The values of snap.pre now, before the stitch's step is made (a list, empty for most)."""
    if not snap.pre:
        return []
    if snap.pre_fn is None:
        env = dict(snap.consts, Tensor=torch.Tensor, torch=torch)
        exec(compile(f"def pre(a, k, g, f, x):\n    return [{', '.join(snap.pre)}]", "<dynamo stitch>", "exec"), env)
        snap.pre_fn = env["pre"]
    try:
        return snap.pre_fn(args, kwargs, fn.__globals__, fn, live)
    except Exception as e:  # noqa: BLE001
        raise ResumeFailed(f"cannot read the values held at {snap.where}: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Restoring one: the rest of the call from the snapshot


def resume(snap, fn, args, kwargs, live, interp, recorded=False):
    """Runs the rest of the call from snapshot `snap` with this call's arguments and the exit's
    live values in interpreter `interp`; returns the call's result. recorded: interp records
    (inside its Recorder), and the run is a side trace: values keep their sources and are
    guarded as read; else interp only runs (Interpreter.unrecorded())."""
    env = dict(snap.consts, a=args, k=kwargs, g=fn.__globals__, f=fn, Tensor=torch.Tensor, torch=torch)
    if recorded:
        pair = lambda s: _decode_pair(s, env, live, interp)  # noqa: E731
    else:
        pair = lambda s: (decode(s, env, live), None)  # noqa: E731
    frames = []
    try:
        for fs in snap.frames:
            if fs.fn == ("func",):
                f_obj, f_src = fn, FUNC
            elif fs.fn[0] == "src":
                f_obj, f_src = eval(fs.fn[1], env), Source(fs.fn[1])  # noqa: S307
            else:
                f_obj, f_src = fs.fn[1], None
            fr = interp.new_frame(fs.code, f_obj, f_src, f_obj.__globals__)
            fr.locals = [pair(s) for s in fs.locals]
            fr.stack = [pair(s) for s in fs.stack]
            fr.ip = fs.ip
            fr.kw_names = fs.kw_names
            frames.append(fr)
    except Exception as e:  # noqa: BLE001 -- nothing of the program has run yet from here
        raise ResumeFailed(f"cannot rebuild the frames at {snap.where}: {type(e).__name__}: {e}") from e
    result = None
    try:
        for depth, (fr, fs) in enumerate(zip(reversed(frames), reversed(snap.frames))):
            if depth:
                fr.stack.append(result)  # the inlined call's value, as its CALL would push it
            interp.frames = frames[:len(frames) - depth]
            made = fr.locals[0] if fs.init else None  # (cls(...) gives the caller the object __init__ set up)
            result = interp._execute(fr)
            if made is not None:
                result = made
    finally:
        # the frames are done (returned, or left by the program's exception): the interpreter no
        # longer holds them, so a generator in their locals goes when the program lets go of it,
        # as a frame of CPython's does (held by them, and holding the interpreter, it was a cycle
        # the collector broke one or two calls later)
        interp.frames = []
        frames.clear()
    return interp.finish(result[0])
