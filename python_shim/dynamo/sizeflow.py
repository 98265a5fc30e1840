"""Tensor sizes read in Python, followed while the program only passes them on (`SizeFlow`, one
per interpreter: Interpreter.sizes).

A size family (sizes.py) serves a program at sizes it was not recorded at. That is right only if
the Python code did the same at those sizes: nothing it decided may have depended on a size that
changes. So a size read in Python -- `x.shape`, `x.size()`, `x.size(d)`, `len(x)`, `x.numel()` --
is a *tracked* value: a stack pair (`_Sized`) that remembers which dimensions of which trace
values it was computed from. While the program only moves it (locals, tuples, lists built as
`[*shape, n]`, unpacking, indexing a shape with a constant), adds, subtracts or multiplies it
(kept as a polynomial over the sizes it came from: `_Sized.expr`), divides it by plain numbers,
or hands it to a torch operation (also as `x.view(*shape)`, a slice bound `x[:, :n + 1]`, a
scalar `x * n`) -- where it becomes an integer of the IR text, given by its polynomial
(`size_passed`) -- it stays tracked. A comparison or a branch on it is a *guard*
(`size_guards`): a family holds only at sizes where it comes out the same. Any other use -- a
builtin or math function, a container, a closure, an attribute store, the returned value, a
floor division passed to an op (`size_opaque`) -- *fixes* those dimensions: the family must
then hold them constant (sizes.py refuses a family in which a fixed dimension changed). The rule
is a safe default: a bytecode not known to be a move fixes every tracked value it might read.

Sizes of tensors that are not values of the trace, and strides, are not followed: the trace then
serves its own sizes only (SizeFlow.size_read), as before this module.
"""
import types
from inspect import CO_VARARGS, CO_VARKEYWORDS

import torch

from . import snapshot
from .sizes import p_add, p_mul, poly
from .frames import NULL as _NULL, ProbeStop, SizeUsed, is_torch_callable

# bytecodes that only move stack values (a tracked value passes through unchanged)
_MOVES = frozenset(("LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL", "NOP",
                    "RESUME", "PRECALL", "EXTENDED_ARG", "KW_NAMES", "STORE_FAST", "POP_TOP", "COPY", "SWAP",
                    "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "CACHE", "DELETE_FAST",
                    "COPY_FREE_VARS", "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
                    "STORE_FAST_STORE_FAST", "PUSH_NULL_BELOW", "END_SEND", "RETURN_CONST"))
# how many values from the top of the stack a bytecode reads (others: the whole stack is fixed)
_READS = {"COMPARE_OP": 2, "IS_OP": 2, "CONTAINS_OP": 2, "UNARY_NEGATIVE": 1, "UNARY_POSITIVE": 1,
          "UNARY_INVERT": 1, "UNARY_NOT": 1, "GET_ITER": 1, "FOR_ITER": 1, "STORE_SUBSCR": 3, "STORE_ATTR": 2,
          "STORE_DEREF": 1, "STORE_GLOBAL": 1, "LIST_APPEND": 1, "SET_ADD": 1, "MAP_ADD": 2, "LIST_EXTEND": 1,
          "YIELD_VALUE": 1, "GET_LEN": 1, "POP_JUMP_FORWARD_IF_FALSE": 1, "POP_JUMP_FORWARD_IF_TRUE": 1,
          "POP_JUMP_BACKWARD_IF_FALSE": 1, "POP_JUMP_BACKWARD_IF_TRUE": 1, "POP_JUMP_FORWARD_IF_NONE": 1,
          "POP_JUMP_FORWARD_IF_NOT_NONE": 1, "POP_JUMP_BACKWARD_IF_NONE": 1, "POP_JUMP_BACKWARD_IF_NOT_NONE": 1,
          "JUMP_IF_FALSE_OR_POP": 1, "JUMP_IF_TRUE_OR_POP": 1, "STORE_SLICE": 4, "CONVERT_VALUE": 1,
          "FORMAT_SIMPLE": 1, "FORMAT_WITH_SPEC": 2, "CALL_INTRINSIC_1": 1, "CLEANUP_THROW": 3, "LOAD_SUPER_ATTR": 3,
          "END_FOR": 2}
# BINARY_OP arguments that keep a product of sizes a product: * (and *=); // and / and ** by a
# plain number (the family's fit checks that the result is a whole number at each size)
_MUL = frozenset((5, 18))
_DIV_POW = frozenset((2, 8, 11, 15, 21, 24))
_ADD = frozenset((0, 13))
_SUB = frozenset((10, 23))
_DECIDES = frozenset(("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
                      "POP_JUMP_BACKWARD_IF_TRUE", "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP", "UNARY_NOT",
                      "COMPARE_OP", "UNARY_NEGATIVE"))
_NUMBER = (int, float)
_NO_DIMS = frozenset()


class _Sized(tuple):
    """A (value, None) stack pair holding a number or a sequence of numbers computed from tensor
    sizes. dims: the (trace value name, dimension) pairs a number came from; elems: per element
    of a sequence, the same (dims is then their union). expr: the number as a polynomial over
    those (name, dim) keys (sizes.poly), where it is one (a floor division is not: None); exprs:
    per element of a sequence, the same."""

    def __new__(cls, value, dims=_NO_DIMS, elems=None, expr=None, exprs=None):
        p = super().__new__(cls, (value, None))
        p.elems = tuple(elems) if elems is not None else None
        p.dims = frozenset().union(*p.elems) if p.elems is not None else frozenset(dims)
        p.expr = expr if type(value) is int else None
        p.exprs = tuple(exprs) if exprs is not None and p.elems is not None and len(exprs) == len(p.elems) else \
            ((None,) * len(p.elems) if p.elems is not None else None)
        return p


def _dims_of(p):
    return p.dims if isinstance(p, _Sized) else _NO_DIMS


def _expr_of(p):
    """The polynomial of a stack pair's number: a tracked one's, a plain int's constant, else None."""
    if isinstance(p, _Sized):
        return p.expr
    v = p[0]
    return poly(v) if type(v) is int and p[1] is None else None


def _exprs_of(p, n):
    if isinstance(p, _Sized) and p.exprs is not None:
        return p.exprs
    v = p[0]
    if type(v) in (tuple, list, torch.Size):
        return tuple(poly(x) if type(x) is int else None for x in v)
    return (None,) * n


def _is_number(v):
    return type(v) in _NUMBER


def _is_shape(v):
    return type(v) in (tuple, list, torch.Size) and all(type(x) is int for x in v)


class SizeFlow:
    """The tracked sizes of one interpreter (see the module's text): interp's frames, recorder
    (rec, recording) and size probe (probe) are what it reads; the interpreter calls step_safe
    before each bytecode and the step it returns after it."""

    def __init__(self, interp):
        self.interp = interp
        self.size_read = None     # a size read that is not followed: the trace serves its own sizes only
        self.size_fixed = {}      # (trace value name, dim) -> where Python used that size as a number
        self._sized = False       # a tracked value exists (then each bytecode is checked)
        # comparisons of tracked sizes that Python made: (left - right as a polynomial over the
        # keys, dis.cmp_op index, the outcome, where); a size family holds only where they come
        # out the same (sizes.Family.check_sizes)
        self.size_guards = []
        self.size_passed = []     # polynomials of tracked numbers handed to torch calls (op arguments)
        self.size_opaque = []     # (dims, value) of tracked numbers handed to torch calls without one
        self.slice_bounds = {}    # id(slice) -> (the slice, its bounds as polynomials): BUILD_SLICE
        self._next_slice = None   # ((start, stop), bounds) of the slice a BINARY_SLICE is making
        self._origin = False      # the current bytecode makes a tracked value (no size_read note)

    def note_read(self, what, text=None):
        """The program read a tensor's size in a way this module does not follow (a tensor that
        is not a trace value, strides, getattr(x, "shape"), ...): the trace serves its own sizes
        only (sizes.py)."""
        if self._origin:
            return
        where = snapshot.where(self.interp.frames[-1]) if self.interp.frames else "?"
        text = text or {"shape": "x.shape", "len": "len(x)", "numel": "torch.numel(x)"}.get(what, f"x.{what}()")
        if self.size_read is None:
            self.size_read = f"{text} at {where}"

    def step_safe(self, f, op, ins):
        """_size_step, with a failure of its own (never the program's) ending the following of
        sizes: the trace then serves its own sizes only."""
        try:
            return self._size_step(f, op, ins)
        except ProbeStop:
            raise
        except Exception as e:  # noqa: BLE001 -- dynamo's own error: sizes stay specialized
            self._size_failed(e)
            return None

    def after_safe(self, after):
        try:
            after()
        except ProbeStop:
            raise
        except Exception as e:  # noqa: BLE001 -- as above
            self._size_failed(e)

    def _size_failed(self, e):
        self._origin = False
        if self.interp.probe is not None:
            raise ProbeStop(f"following a size failed: {type(e).__name__}: {e}")
        if self.size_read is None:
            self.size_read = f"a size (following it failed inside dynamo: {type(e).__name__}: {e})"

    def fix_at_snapshot(self, p):
        """A tracked pair that a snapshot (a side exit's) holds as a constant: its sizes are fixed."""
        self._fix((p,), self.interp.frames[-1] if self.interp.frames else None)

    def _fix(self, pairs, f):
        """The tracked values among pairs are used as numbers: their dimensions stay constant."""
        for p in pairs:
            if isinstance(p, _Sized) and p.dims:
                where = snapshot.where(f) if f is not None else "?"
                if self.interp.probe is not None:
                    self._probe_fixed(p.dims, where)
                for key in p.dims:
                    self.size_fixed.setdefault(key, where)

    def _probe_fixed(self, keys, where):
        """In a size probe (probe.py), Python is about to use these sizes as numbers: the probe
        ends before it does when one of them is not what it was in the probe's base run (what
        Python decides with it may differ; the probe must take the base run's path). The base
        run itself (self.interp.probe empty) decides as the program would at its sizes."""
        if not self.interp.probe:
            return
        shapes = self.interp.rec.value_shapes()
        for name, d in keys:
            a, b = shapes.get(name), self.interp.probe.get(name)
            if a is None or b is None or len(a) <= d or len(b) <= d or a[d] != b[d]:
                raise SizeUsed(f"the program uses the size as a number in Python at {where}")

    def _size_step(self, f, op, ins):
        """Before bytecode op runs in frame f: fixes what it reads as a number, or returns a
        function to run after it that marks the values it made from tracked ones (or from a
        tensor's sizes) as tracked."""
        self._next_slice = None  # (a BINARY_SLICE's bounds serve that bytecode alone)
        if op in _MOVES:
            return None
        stack = f.stack
        if op in ("LOAD_ATTR", "LOAD_METHOD"):
            obj = stack[-1][0] if stack else None
            if op == "LOAD_ATTR" and ins.argval == "shape" and isinstance(obj, torch.Tensor):
                return self._origin_of(f, obj)
            if stack and isinstance(stack[-1], _Sized):
                self._fix(stack[-1:], f)
            return None
        if op == "CALL":
            return self._size_call(f, ins)
        if op == "CALL_KW":  # 3.13: the keyword names on top, the call below them
            return self._size_call(f, ins, kw_on_stack=True)
        if not self._sized:
            return None
        if op == "BINARY_OP":
            return self._size_binary(f, ins)
        if op in _DECIDES:
            return self._size_decision(f, op, ins)
        if op == "BINARY_SUBSCR":
            return self._size_subscript(f)
        if op == "BINARY_SLICE":  # 3.12: shape[start:end]
            return self._size_slice(f)
        if op == "UNPACK_SEQUENCE":
            p = stack[-1]
            if isinstance(p, _Sized) and p.elems is not None and len(p.elems) == ins.arg:
                elems, exprs = p.elems, p.exprs
                return lambda: self._mark_unpacked(f, elems, exprs)
            self._fix(stack[-1:], f)
            return None
        if op in ("BUILD_TUPLE", "BUILD_LIST"):
            items = stack[len(stack) - ins.arg:] if ins.arg else []
            if any(isinstance(p, _Sized) for p in items):
                elems, exprs = [_dims_of(p) for p in items], [_expr_of(p) for p in items]
                return lambda: self._mark_top(f, elems=elems, exprs=exprs)
            return None
        if op in ("LIST_APPEND", "LIST_EXTEND"):
            return self._size_list_add(f, op, ins)
        if op == "BUILD_SLICE":
            return self._size_build_slice(f, ins)
        if op in ("STORE_SUBSCR", "STORE_SLICE") and self._tensor_store(f, op):
            return None
        if op == "LIST_TO_TUPLE":
            p = stack[-1]
            if isinstance(p, _Sized) and p.elems is not None:
                elems, exprs = p.elems, p.exprs
                return lambda: self._mark_top(f, elems=elems, exprs=exprs)
            return None
        if op == "CALL_FUNCTION_EX":
            return self._size_star_call(f, ins)
        if op == "RETURN_VALUE":
            if len(self.interp.frames) <= 1:
                self._fix(stack[-1:], f)  # the optimized function's result: its numbers are constants
            return None
        if op == "MAKE_CELL":
            self._fix((f.locals[ins.arg],), f)  # a closure reads it where the interpreter does not see
            return None
        n = ins.arg if op in ("BUILD_SLICE", "BUILD_STRING", "BUILD_SET", "BUILD_MAP") else _READS.get(op)
        if op == "BUILD_MAP":
            n = 2 * n
        self._fix(stack if n is None else stack[len(stack) - n:], f)
        return None

    def _size_binary(self, f, ins):
        """BINARY_OP on a tracked number or shape: `*` (and `//`, `/`, `**` by a plain number) and
        shape `+` keep it tracked; any other fixes it."""
        a, b = f.stack[-2], f.stack[-1]
        if not (isinstance(a, _Sized) or isinstance(b, _Sized)):
            return None
        x, y, arg = a[0], b[0], ins.arg
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            self._passed((a, b))  # the number becomes an integer of the op's IR line
            return None
        dims = _dims_of(a) | _dims_of(b)
        if _is_number(x) and _is_number(y) and (arg in _MUL or arg in _DIV_POW and not isinstance(b, _Sized)):
            ea, eb = _expr_of(a), _expr_of(b)
            expr = p_mul(ea, eb) if arg in _MUL and ea is not None and eb is not None else None
            return lambda: self._mark_top(f, dims=dims, expr=expr)
        if (arg in _ADD or arg in _SUB) and type(x) is int and type(y) is int and \
                _expr_of(a) is not None and _expr_of(b) is not None:
            expr = p_add(_expr_of(a), _expr_of(b), 1 if arg in _ADD else -1)  # (n + 1: an offset)
            return lambda: self._mark_top(f, dims=dims, expr=expr)
        if arg in _ADD and _is_shape(x) and _is_shape(y):
            elems = (a.elems if isinstance(a, _Sized) and a.elems is not None else (_dims_of(a),) * len(x)) + \
                    (b.elems if isinstance(b, _Sized) and b.elems is not None else (_dims_of(b),) * len(y))
            exprs = _exprs_of(a, len(x)) + _exprs_of(b, len(y))
            return lambda: self._mark_top(f, elems=elems, exprs=exprs)
        self._fix((a, b), f)
        return None

    def _size_slice(self, f, at=-3):
        """BINARY_SLICE (and STORE_SLICE, whose container is at `at`): a tracked shape sliced by
        plain bounds stays tracked (as BINARY_SUBSCR with a slice); a tensor sliced by bounds
        that are polynomials of the sizes takes them as integers of its op (as x[:, :n + 1]
        built with BUILD_SLICE); other tracked bounds are fixed."""
        obj, lo, hi = f.stack[at], f.stack[at + 1], f.stack[at + 2]
        if isinstance(obj[0], torch.Tensor) and all(_expr_of(b) is not None or b[0] is None for b in (lo, hi)):
            self._passed((lo, hi))
            self._next_slice = ((lo[0], hi[0]), (_expr_of(lo) if lo[0] is not None else None,
                                                 _expr_of(hi) if hi[0] is not None else None, None))
            return None
        self._fix((lo, hi), f)
        if isinstance(obj, _Sized):
            if obj.elems is not None and all(b[0] is None or type(b[0]) is int for b in (lo, hi)):
                elems, exprs = obj.elems[lo[0]:hi[0]], obj.exprs[lo[0]:hi[0]]
                return lambda: self._mark_top(f, elems=elems, exprs=exprs)
            self._fix((obj,), f)
        return None

    def _size_subscript(self, f):
        """BINARY_SUBSCR: a tracked shape indexed by a constant (or sliced) stays tracked; a
        tracked number used as a key into anything but a tensor is fixed."""
        obj, key = f.stack[-2], f.stack[-1]
        if isinstance(key, _Sized) and not isinstance(obj[0], torch.Tensor):
            self._fix((key,), f)
        if isinstance(obj, _Sized) and not isinstance(key, _Sized):
            k = key[0]
            if obj.elems is not None and type(k) is int and -len(obj.elems) <= k < len(obj.elems):
                dims, expr = obj.elems[k], obj.exprs[k]
                return lambda: self._mark_top(f, dims=dims, expr=expr)
            if obj.elems is not None and type(k) is slice:
                elems, exprs = obj.elems[k], obj.exprs[k]
                return lambda: self._mark_top(f, elems=elems, exprs=exprs)
            self._fix((obj,), f)
        return None

    def _origin_of(self, f, t):
        """A step that reads tensor t's shape (x.shape, x.size()): after it, the shape on top is
        tracked, element d from (t's trace value, d). Not followed (a size_read note instead)
        when t is not a trace value."""
        name = self.interp.rec.vals.get(id(t)) if self.interp.recording else None
        if name is None:
            return None
        self._origin = True
        elems = [frozenset({(name, d)}) for d in range(t.dim())]
        exprs = [poly(1, (name, d)) for d in range(t.dim())]

        def after():
            self._mark_top(f, elems=elems, exprs=exprs)
        return after

    def _size_call(self, f, ins, kw_on_stack=False):
        """CALL: a size read (x.size(), x.size(d), x.numel(), len(x)), or a call receiving tracked
        values: torch functions and inlined Python functions take them as they are, len() of a
        tracked shape is its rank, int/tuple/list keep them tracked; anything else fixes them."""
        stack = f.stack
        n = ins.arg
        stack_kw = None
        if kw_on_stack:
            if not stack or type(stack[-1][0]) is not tuple:
                return None
            stack_kw = stack[-1][0]
            nkw = len(stack_kw)
            stack = stack[:-1]
        else:
            nkw = len(f.kw_names or ())
        if len(stack) < n + 2:
            return None
        items = stack[len(stack) - n:]
        first, second = stack[-n - 2], stack[-n - 1]
        if first[0] is _NULL:
            fnp, args = second, list(items)
        else:
            fnp, args = first, [second] + list(items)
        fn = fnp[0]
        pos = args[:len(args) - nkw]
        self_t = getattr(fn, "__self__", None)
        if isinstance(self_t, torch.Tensor) and not nkw:
            name = getattr(fn, "__name__", None)
            if name == "size" and not pos:
                return self._origin_of(f, self_t)
            if name == "size" and len(pos) == 1 and type(pos[0][0]) is int and not isinstance(pos[0], _Sized):
                d = pos[0][0] % max(self_t.dim(), 1)
                return self._origin_num(f, self_t, (d,))
            if name in ("numel", "nelement") and not pos:
                return self._origin_num(f, self_t, tuple(range(self_t.dim())))
        if (fn is len or fn is torch.numel) and len(pos) == 1 and not nkw and isinstance(pos[0][0], torch.Tensor):
            t = pos[0][0]
            return self._origin_num(f, t, (0,) if fn is len else tuple(range(t.dim())))
        if not self._sized:
            return None
        tracked = [p for p in [fnp] + args if isinstance(p, _Sized)]
        if not tracked:
            return None
        if isinstance(fnp, _Sized):
            self._fix(tracked, f)
            return None
        if fn is len and len(args) == 1:
            return None  # the length of a shape is a rank (guarded natively), not a size
        if fn is int and len(args) == 1 and _is_number(args[0][0]):
            dims, expr = args[0].dims, args[0].expr
            return lambda: self._mark_top(f, dims=dims, expr=expr)
        if fn in (tuple, list, torch.Size) and len(args) == 1 and args[0].elems is not None:
            elems, exprs = args[0].elems, args[0].exprs
            return lambda: self._mark_top(f, elems=elems, exprs=exprs)
        if fn in (torch.tensor, torch.as_tensor, torch.scalar_tensor):
            self._fix(tracked, f)  # data made from the numbers: a constant of the trace
            return None
        code = _python_code(fn)
        if code is not None:
            if code.co_flags & (CO_VARARGS | CO_VARKEYWORDS):
                # *args/**kwargs are rebuilt without their pairs: what lands there is fixed
                names = (stack_kw if kw_on_stack else f.kw_names) or ()
                bound = isinstance(fn, (types.MethodType, torch.nn.Module))
                self._fix(_landing_in_stars(code, bound, pos, names, args[len(args) - nkw:]), f)
            return None
        if _torch_c_callable(fn):
            self._passed(tracked)

            def after():  # a torch function's numbers (not tensors) computed from tracked ones
                if f.stack and not _tensors_only(f.stack[-1][0]):
                    self._fix(tracked, f)
            return after
        self._fix(tracked, f)
        return None

    def _size_list_add(self, f, op, ins):
        """LIST_APPEND / LIST_EXTEND (a list being built: [*shape, n], comprehensions): the
        list's pair carries the tracked elements it now holds."""
        stack = f.stack
        item, lst = stack[-1], stack[-1 - ins.arg]
        if not isinstance(item, _Sized) and not isinstance(lst, _Sized):
            return None
        if type(lst[0]) is not list:
            self._fix((item,), f)
            return None
        before = lst.elems if isinstance(lst, _Sized) and lst.elems is not None else (_NO_DIMS,) * len(lst[0])
        exprs = _exprs_of(lst, len(lst[0]))
        if op == "LIST_APPEND":
            added, exprs = (_dims_of(item),), exprs + (_expr_of(item),)
        elif isinstance(item, _Sized) and item.elems is not None:
            added, exprs = item.elems, exprs + item.exprs
        elif type(item[0]) in (tuple, list, torch.Size) and not isinstance(item, _Sized):
            added, exprs = (_NO_DIMS,) * len(item[0]), exprs + _exprs_of(item, len(item[0]))
        else:
            self._fix((item,), f)
            return None
        elems, at = before + added, -ins.arg

        def after():
            p = f.stack[at]
            if type(p[0]) is list and len(p[0]) == len(elems):
                f.stack[at] = _Sized(p[0], elems=elems, exprs=exprs)
                self._sized = True
            else:
                self._fix((_Sized(None, elems=elems),), f)
        return after

    def _size_star_call(self, f, ins):
        """CALL_FUNCTION_EX: tracked numbers in the argument tuple go into a torch C function as
        they are (x.view(*shape)); into anything else (its pairs are rebuilt) they are fixed."""
        stack = f.stack
        n = 3 if ins.arg & 1 else 2
        if len(stack) < n:
            return None
        items = stack[len(stack) - n:]
        tracked = [p for p in items if isinstance(p, _Sized)]
        if not tracked:
            return None
        fn = items[0][0]
        if ins.arg & 1 or isinstance(items[0], _Sized) or not _torch_c_callable(fn):
            self._fix(tracked, f)
            return None
        self._passed(tracked)

        def after():
            if f.stack and not _tensors_only(f.stack[-1][0]):
                self._fix(tracked, f)
        return after

    def _origin_num(self, f, t, dims):
        name = self.interp.rec.vals.get(id(t)) if self.interp.recording else None
        if name is None:
            return None
        self._origin = True
        keys = frozenset((name, d) for d in dims)
        expr = (((tuple(sorted(keys)), 1),) if keys else poly(1))  # (a size, or the product numel() is)

        def after():
            self._mark_top(f, dims=keys, expr=expr)
        return after

    def _mark_top(self, f, dims=_NO_DIMS, elems=None, expr=None, exprs=None):
        """The value on top of f's stack (just made) as a tracked pair."""
        if not f.stack or f.stack[-1][1] is not None:
            return
        v = f.stack[-1][0]
        if elems is not None and not (type(v) in (tuple, list, torch.Size) and len(v) == len(elems)):
            self._fix((_Sized(None, elems=elems),), f)  # not the sequence expected: fixed
            return
        if elems is None and not _is_number(v):
            self._fix((_Sized(None, dims),), f)
            return
        f.stack[-1] = _Sized(v, dims, elems, expr, exprs)
        self._sized = True

    def _mark_unpacked(self, f, elems, exprs):
        k = len(elems)
        for i in range(k):
            p = f.stack[-1 - i]
            if p[1] is None and _is_number(p[0]):
                f.stack[-1 - i] = _Sized(p[0], elems[i], expr=exprs[i])
        self._sized = True

    def _size_decision(self, f, op, ins):
        """COMPARE_OP, a branch or `not` on a tracked number (a guard on how it comes out, or on
        it being 0), or UNARY_NEGATIVE (its polynomial negated)."""
        stack = f.stack
        if op == "COMPARE_OP":
            return self._size_compare(f, ins)
        p = stack[-1] if stack else None
        if op == "UNARY_NEGATIVE":
            if isinstance(p, _Sized) and p.expr is not None:
                dims, expr = p.dims, p_add((), p.expr, -1)
                return lambda: self._mark_top(f, dims=dims, expr=expr)
            self._fix(stack[-1:], f)
            return None
        if isinstance(p, _Sized) and p.expr is not None:
            self._guard(p.expr, 3, bool(p[0]), f)
        else:
            self._fix(stack[-1:], f)
        return None

    def _tensor_store(self, f, op):
        """x[:, :n] = v (STORE_SUBSCR, 3.12's STORE_SLICE) into a tensor: the key's bounds are
        integers of the write's IR (as in a read), and a number stored is data (fixed). False
        when the container is not a tensor."""
        stack = f.stack
        at = -2 if op == "STORE_SUBSCR" else -3
        if len(stack) < -at + 1 or not isinstance(stack[at][0], torch.Tensor):
            return False
        self._fix(stack[at - 1:at], f)
        if op == "STORE_SLICE":
            self._size_slice(f, at=-3)
        return True

    def _size_build_slice(self, f, ins):
        """BUILD_SLICE with tracked bounds that are polynomials: a tracked slice, whose bounds
        are integers of an op line where it indexes a tensor (x[:, :n + 1]); any other use of
        it fixes them (a list sliced by a size has a length Python would decide with)."""
        items = f.stack[len(f.stack) - ins.arg:]
        tracked = [p for p in items if isinstance(p, _Sized)]
        if not tracked:
            return None
        if any(p.expr is None for p in tracked):
            self._fix(tracked, f)
            return None
        dims = frozenset().union(*(p.dims for p in tracked))
        self._passed(tracked)
        bounds = tuple(_expr_of(p) for p in items) + (None,) * (3 - len(items))

        def after():
            if f.stack and type(f.stack[-1][0]) is slice and f.stack[-1][1] is None:
                s = f.stack[-1][0]
                f.stack[-1] = _Sized(s, dims)
                self.slice_bounds[id(s)] = (s, bounds)  # (start, stop, step) as polynomials
                self._sized = True
        return after

    def slice_bound(self, s):
        """(start, stop, step) of slice s as polynomials over the sizes (plain ints as constants,
        None where absent or not a polynomial)."""
        found = self.slice_bounds.get(id(s))
        if found is not None and found[0] is s:
            return found[1]
        nxt, self._next_slice = self._next_slice, None
        if nxt is not None and nxt[0] == (s.start, s.stop) and s.step is None:  # (3.12's BINARY_SLICE)
            return nxt[1]
        return tuple(poly(x) if type(x) is int else None for x in (s.start, s.stop, s.step))

    def alias_guard(self, expr, where):
        """An index kept a whole dim: its bound (expr - the dim's size, a polynomial) was at
        least the size; a family holds only where it still is (a guard, not a fixed size)."""
        self.size_guards.append((expr, 5, True, where))

    def _size_compare(self, f, ins):
        """COMPARE_OP on tracked numbers (or one and a plain int): a guard on how it comes out
        (size_guards), not a fixed size; of anything else they are fixed."""
        a, b = f.stack[-2], f.stack[-1]
        if not (isinstance(a, _Sized) or isinstance(b, _Sized)):
            return None
        ea, eb = _expr_of(a), _expr_of(b)
        if ea is None or eb is None or not 0 <= ins.arg < 6:
            self._fix((a, b), f)
            return None
        diff = p_add(ea, eb, -1)

        def after():
            r = f.stack[-1][0] if f.stack else None
            if type(r) is bool:
                self._guard(diff, ins.arg, r, f)
            else:
                self._fix((a, b), f)
        return after

    def _guard(self, expr, op, outcome, f):
        if any(m for m, _ in expr):
            self.size_guards.append((expr, op, outcome, snapshot.where(f)))

    def _passed(self, pairs):
        """Tracked numbers handed to a torch call: integers of its IR line, each either given by
        its polynomial (size_passed) or not (size_opaque: a family must not vary it there)."""
        for p in pairs:
            if not isinstance(p, _Sized):
                continue
            if p.elems is None:
                items = [(p.expr, p.dims, p[0])]
            else:
                vals = p[0] if isinstance(p[0], (tuple, list)) else ()
                items = list(zip(p.exprs, p.elems, vals))
            for expr, dims, v in items:
                if expr is not None:
                    if any(m for m, _ in expr) and expr not in self.size_passed:
                        self.size_passed.append(expr)
                elif dims:
                    self.size_opaque.append((frozenset(dims), v))


def _python_code(fn):
    """The code object the interpreter inlines for fn, or None (not a Python function)."""
    if isinstance(fn, types.FunctionType):
        return fn.__code__
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return fn.__func__.__code__
    if isinstance(fn, torch.nn.Module):
        fwd = type(fn).forward
        if isinstance(fwd, types.FunctionType) and not (fn._forward_hooks or fn._forward_pre_hooks or
                                                        torch.nn.modules.module._global_forward_hooks or
                                                        torch.nn.modules.module._global_forward_pre_hooks):
            return fwd.__code__
    return None


def _landing_in_stars(code, bound, pos, names, kwvals):
    """The tracked pairs of a call to a Python function of `code` that binding puts into its
    *args tuple or **kwargs dict (calls._bind keeps the pairs of named parameters only). bound:
    fn takes self implicitly."""
    n = code.co_argcount - (1 if bound else 0)
    out = [p for p in pos[n:] if isinstance(p, _Sized)]
    settable = code.co_varnames[code.co_posonlyargcount:code.co_argcount + code.co_kwonlyargcount]
    out += [p for name, p in zip(names, kwvals) if isinstance(p, _Sized) and name not in settable]
    return out


def _torch_c_callable(fn):
    """A torch function or tensor method implemented in C (its ATen ops are recorded): not a
    Python function (those are inlined) nor a class."""
    return not isinstance(fn, (types.FunctionType, types.MethodType, type)) and is_torch_callable(fn)


def _tensors_only(v):
    if isinstance(v, torch.Tensor) or v is None:
        return True
    if type(v) in (tuple, list):
        return all(_tensors_only(x) for x in v)
    return False
