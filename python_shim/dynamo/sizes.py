"""Size families: one recorded trace serving the same program at other tensor sizes.

A trace's IR text is the program at one set of sizes: the sizes are integers in it (input and
result types, the shape lists of reshapes). When a function is recorded a second time and the new
trace is the first one with only such integers changed (the same Python guards, the same ops, the
same output structure), the two are a *family*: each input dimension that changed is a size
variable s0, s1, ..., and each integer of the text is fitted through the samples to a polynomial of
them: c * s0^e0 * s1^e1 ... (e in 0..2, c rational), or that plus d * (s - a) for one new
variable s (an offset: a cache of n and its mask of n + 1, cat of two lengths); an op argument
(not a type or shape) must be what a size Python computed and passed there gives (sizeflow.py),
and Python's comparisons of sizes are guards each instance checks. A later call whose sizes miss
every trace, but which the family's Python guards accept, gets an *instance*: the text with the
call's sizes put in, compiled at once (machine code shared with the family's traces: sizes are
data of the code) and run natively -- no recording. A third recording that differs in other dimensions (a new batch size
after new lengths) widens the family by the variables it adds.

Why an instance computes what the program would:
  * every size the program read in Python was followed (sizeflow.py): its sums and products
    passed to torch ops are polynomials the instance evaluates, its comparisons are guards, and
    any other use fixed it (a family never varies a fixed size); a size read that is not
    followed keeps the trace to its own sizes;
  * every integer that changed is a type or a reshape/expand shape: the verifier recomputes every
    IR op's result type from its operands and rejects an annotation that differs, and every
    LibTorch call's result is checked against its annotation when it runs, so a fit that is wrong
    at some size fails (then the call is recorded as usual) rather than computing something else.
    An integer of any other kind (a slice bound, an index, an op's argument) that changed leaves
    the two traces apart. Slices are written as the program gave them (x[:, 1:] ends at "the end"
    whatever the size), so a clamp such as x[:, :100] stays a constant;
  * a size variable is at least 2 in recorded samples and their instances (0 and 1 change
    broadcasting, squeeze and strides): those sizes get traces of their own -- unless size probes
    (probe.py) showed the program the same at 1 (Family.low);
  * the samples must tell the variables apart: no two products of their ratios are equal (batch
    x2 with length /2 leaves the traces apart). Input dims that changed by the same ratio are
    one variable (a dim equal to it, or a fixed multiple of it: y of 5 * n elements viewed as
    [n, 5]); an instance serves only calls in that relation, and every input dim that follows a
    variable is at least 2 there.
"""
import collections
import functools
import re
from fractions import Fraction
from itertools import product

import torch

_INT = re.compile(r"(?<![\w.%:\-])-?\d+(?![\w.])")
_OP = re.compile(r"=\s*(extern\s+)?([A-Za-z_][\w:.]*)")
_SHAPE_OPS = frozenset(("reshape", "view", "expand"))
_SHAPE_EXTERNS = frozenset(("aten::_unsafe_view", "aten::view", "aten::reshape", "aten::expand", "aten::zeros",
                            "aten::ones", "aten::empty", "aten::empty.memory_format", "aten::full",
                            "aten::new_zeros", "aten::new_ones", "aten::new_empty", "aten::new_full"))
MAX_VARS = 4
# what an integer of the text is: an input's dimension or stride (with the input slot and the
# dimension), a result type's size, a shape list's entry, or anything else
DIM, STRIDE, TYPE, SHAPE, OTHER = "dim", "stride", "type", "shape", "other"
_FREE = (DIM, STRIDE, TYPE, SHAPE)  # kinds an instance may change


def _spans(line, a, b):
    """(start, end) of each a ... b bracket pair in line."""
    out, i = [], 0
    while True:
        j = line.find(a, i)
        if j < 0:
            return out
        k = line.find(b, j)
        if k < 0:
            return out
        out.append((j, k))
        i = k + 1


def tokens(text, owners=None):
    """(parts, values, kinds) of an IR text: text == parts[0] + str(values[0]) + parts[1] + ...;
    kinds[i] is (kind, input slot, dim) for an input's dims and strides, else (kind,). owners,
    when given (a dict), gets (trace value name, dim) -> i for every input dim and result type
    size: where the sizes of a value are in the text. (The same text is tokenized once: a family
    asks for its proto's tokens at every widening and every check; the lists are the caller's.)"""
    parts, values, kinds, own = _tokens(text)
    if owners is not None:
        owners.update(own)
    return list(parts), list(values), list(kinds)


@functools.lru_cache(maxsize=16)
def _tokens(text):
    owners = {}
    parts, values, kinds = [], [], []
    cur, slot = [], 0
    for line in text.splitlines(keepends=True):
        ms = list(_INT.finditer(line))
        op = _OP.search(line)
        if not ms:  # (a rank-0 input has no number, but it is a slot all the same)
            cur.append(line)
            slot += bool(op and op.group(2) == "input" and not op.group(1))
            continue
        name = op.group(2) if op else ""
        is_input = name == "input" and not op.group(1)
        eq = line.find(" = ")
        defined = [n.strip() for n in line[:eq].split(",")] if eq >= 0 else []
        if is_input:
            dims, strides = _spans(line, "[", "]")[:1], _spans(line, "{", "}")[:1]
        else:
            close = line.rfind(") : ")
            types_at = close + 3 if close >= 0 else len(line)
            shape_op = (name in _SHAPE_EXTERNS) if op and op.group(1) else (name in _SHAPE_OPS)
            lists = _spans(line, "[", "]") if shape_op else []
        at = 0
        for m in ms:
            cur.append(line[at:m.start()])
            parts.append("".join(cur))
            cur = []
            values.append(int(m.group()))
            p = m.start()
            if is_input:
                inside = lambda spans: spans and spans[0][0] < p < spans[0][1]  # noqa: E731
                if inside(dims):
                    kinds.append((DIM, slot, line.count(",", dims[0][0], p)))
                    if owners is not None and defined:
                        owners[(defined[0], kinds[-1][2])] = len(values) - 1
                elif inside(strides):
                    kinds.append((STRIDE, slot, line.count(",", strides[0][0], p)))
                else:
                    kinds.append((OTHER,))
            elif p > types_at:
                kinds.append((TYPE,))
                if owners is not None:
                    k = line.count("[", types_at, p) - 1  # which result's type
                    opened = line.rfind("[", types_at, p)
                    if 0 <= k < len(defined) and opened >= 0:
                        owners[(defined[k], line.count(",", opened, p))] = len(values) - 1
            elif any(a < p < b for a, b in lists):
                kinds.append((SHAPE,))
            else:
                kinds.append((OTHER,))
            at = m.end()
        cur.append(line[at:])
        if is_input:
            slot += 1
    parts.append("".join(cur))
    return tuple(parts), tuple(values), tuple(kinds), owners


# Polynomials over size symbols: a sorted tuple of (monomial, coefficient) pairs with no zero
# coefficient, a monomial a sorted tuple of symbols (a symbol repeated is a power). A family's
# integers are polynomials over its variables (numbers 0, 1, ...); what sizeflow.py follows in
# Python, over (trace value name, dim) keys.
def _num(c):
    """c as an int where it is whole (coefficients are ints or Fractions: int arithmetic is fast)."""
    return c if type(c) is int else (c.numerator if c.denominator == 1 else c)


def poly(const=0, sym=None):
    """The constant const, or (sym given) const * sym (const 0 taken as 1)."""
    if sym is not None:
        return (((sym,), _num(Fraction(const or 1))),)
    return (((), _num(Fraction(const))),) if const else ()


def p_add(a, b, k=1):
    """a + k * b."""
    out = dict(a)
    for m, c in b:
        out[m] = out.get(m, 0) + k * c
    return tuple(sorted((m, _num(c)) for m, c in out.items() if c))


def p_mul(a, b):
    out = {}
    for m1, c1 in a:
        for m2, c2 in b:
            m = tuple(sorted(m1 + m2))
            out[m] = out.get(m, 0) + c1 * c2
    return tuple(sorted((m, _num(c)) for m, c in out.items() if c))


def p_eval(a, value):
    """a at symbol values value (a list or dict: value[symbol]): an int, or a Fraction."""
    total = 0
    for m, c in a:
        for s in m:
            c *= value[s]
        total += c
    return total


def p_syms(a):
    return {s for m, _ in a for s in m}


def p_subst(a, polys):
    """a with each symbol s replaced by the polynomial polys[s]."""
    out = ()
    for m, c in a:
        term = poly(c)
        for s in m:
            term = p_mul(term, polys[s])
        out = p_add(out, term)
    return out


def _ratio(exps, ratios):
    """prod(ratios[i] ** exps[i])."""
    out = Fraction(1)
    for r, e in zip(ratios, exps):
        out *= r ** e
    return out


# comparisons of sizes (sizeflow.py: dis.cmp_op's order), as applied to (left - right, 0)
_CMP = (lambda d: d < 0, lambda d: d <= 0, lambda d: d == 0, lambda d: d != 0, lambda d: d > 0, lambda d: d >= 0)
CMP_TEXT = ("<", "<=", "==", "!=", ">", ">=")


class Family:
    """Traces of one program at several sizes. proto: the Compiled whose guards, output spec
    and op list every instance shares; exprs: per integer of the text, its polynomial over the
    variables; variables: per variable, the (input slot, dim) pairs that are it; samples: the
    variables' values at each trace the fit went through (None: the proto's alone)."""

    def __init__(self, proto, parts, kinds, exprs, variables, low=None, samples=None):
        self.proto, self.parts, self.kinds, self.exprs, self.variables = proto, parts, kinds, exprs, variables
        # per variable, its least value: 2, or 1 where a probe showed the program the same at 1
        self.low = list(low) if low is not None else [2] * len(variables)
        self.samples = [list(e) for e in samples] if samples is not None else []
        self.instances = 0      # compiled from it without a recording
        self.failures = 0       # instances that did not compile (the family goes after a few)
        # each input slot's rank: the dims its `input` line lists (none for a 0-d tensor or a number)
        self.ranks = collections.Counter(k[1] for k in kinds if k[0] == DIM)
        # the comparisons of sizes Python made (sizeflow.py), over the variables, with what each
        # gave: an instance's sizes must give the same; unusable: why the family cannot serve
        self.checks, self.unusable = self._size_checks()

    @classmethod
    def of_trace(cls, c):
        """A trace as a family without variables (every integer a constant)."""
        parts, values, kinds = tokens(c.text)
        return cls(c, parts, kinds, [poly(v) for v in values], [], samples=[[]])

    def key_polys(self):
        """{(trace value name, dim): its size as a polynomial over the variables}."""
        owners = {}
        tokens(self.proto.text, owners)
        return {key: self.exprs[j] for key, j in owners.items() if self.exprs[j] is not None}

    def _size_checks(self):
        guards = getattr(self.proto, "size_guards", ())
        if not guards:
            return [], None
        keys = self.key_polys()
        out = []
        for expr, op, outcome, where in guards:
            missing = p_syms(expr) - keys.keys()
            if missing:
                k = min(missing)
                return [], f"the program compared {value_name(self.proto, k[0])}.size({k[1]}) in Python at {where}"
            out.append((p_subst(expr, keys), op, outcome, where))
        return out, None

    def describe(self, input_srcs=None):
        """The variables as readable guards: `s0 = a[0].size(1) >= 2`, equalities between dims."""
        out = []
        for k, dims in enumerate(self.variables):
            names = [f"{(input_srcs or self.proto.input_srcs)[i]}.size({d})" for i, d in dims]
            out.append(f"s{k} = {' == '.join(names)} >= {self.low[k]}")
        return "; ".join(out)

    def key_of(self, inputs):
        """The variables' values read from inputs at the first dim of each (no checks): two
        instances at other values cannot both take a call (their native guards check those
        dims), so the dispatch skips the instances whose key is not the call's (None: inputs
        without those dims)."""
        try:
            return tuple(inputs[dims[0][0]].shape[dims[0][1]] for dims in self.variables)
        except (AttributeError, IndexError, TypeError):
            return None

    def bind(self, inputs):
        """The variables' values for these trace inputs (tensors, in slot order), or a reason."""
        if self.unusable is not None:
            return None, self.unusable
        for i, t in enumerate(inputs):  # a family is of one rank per input: another misses it
            if isinstance(t, torch.Tensor) and t.dim() != self.ranks[i]:
                return None, f"input {i} has {t.dim()} dims, the family {self.ranks[i]}"
        env = []
        for k, dims in enumerate(self.variables):
            vals = set()
            for i, d in dims:
                t = inputs[i]
                if not hasattr(t, "shape") or len(t.shape) <= d:
                    return None, f"input {i} is not a tensor of rank > {d}"
                vals.add(int(t.shape[d]))
            if len(vals) != 1:
                return None, f"s{k}: the dims {self.describe().split('; ')[k].split(' = ')[1]} differ ({sorted(vals)})"
            v = vals.pop()
            if v < self.low[k]:
                return None, f"s{k} would be {v} (this size variable is at least {self.low[k]})"
            env.append(v)
        why = self.check_sizes(env)
        return (env, None) if why is None else (None, why)

    def check_sizes(self, env):
        """None when Python's comparisons of sizes give at env what they gave when recorded."""
        at = [int(v) for v in env]
        for expr, op, outcome, where in self.checks:
            if _CMP[op](p_eval(expr, at)) != outcome:
                return f"the comparison of sizes ({CMP_TEXT[op]}) at {where} would come out {not outcome}"
        return None

    def instantiate(self, inputs):
        """The IR text of this program at the sizes of inputs, or (None, why not)."""
        env, why = self.bind(inputs)
        if env is None:
            return None, why
        return self.text_at(env, inputs)

    def _text_plan(self):
        """What text_at needs of the tokens, worked out once: each constant token's text (None
        for the others), the tokens that follow variables (index, polynomial, kind, its
        variables), and the input size and stride tokens (index, kind, polynomial)."""
        plan = self.__dict__.get("_plan")
        if plan is None or plan[0] is not self.exprs:
            texts, varying, checked = [], [], []
            for i, (expr, kind) in enumerate(zip(self.exprs, self.kinds)):
                constant = not expr or (len(expr) == 1 and not expr[0][0])
                texts.append((str(expr[0][1]) if expr else "0") if constant else None)
                if not constant:
                    varying.append((i, expr, kind, p_syms(expr)))
                if kind[0] in (DIM, STRIDE):
                    checked.append((i, kind, expr))
            plan = self._plan = (self.exprs, texts, varying, checked)
        return plan

    def text_at(self, env, inputs=None):
        """The IR text at variable values env, or (None, why not); with inputs (the call's
        tensors), each input size and stride of the text must be theirs."""
        _, texts, varying, checked = self._text_plan()
        vals = list(texts)
        at = [int(x) for x in env]
        ints = {}
        for i, expr, kind, syms in varying:
            v = p_eval(expr, at)
            if v.denominator != 1:
                return None, f"a size of the trace would be {v} (not a whole number)"
            v = int(v)
            least = 2 if any(self.low[k] > 1 for k in syms) else 1
            if kind[0] == DIM and v < least:
                return None, (f"input {kind[1]}'s size {kind[2]} would be {v} (sizes that follow a variable are "
                              f"at least {least})")
            ints[i] = v
            vals[i] = str(v)
        if inputs is not None:
            strides = {}
            for i, kind, expr in checked:
                v = ints.get(i)
                if v is None:
                    v = p_eval(expr, at) if expr else 0
                    if v.denominator != 1:
                        return None, f"a size of the trace would be {v} (not a whole number)"
                    v = int(v)
                t = inputs[kind[1]]
                if kind[0] == DIM:
                    actual = t.shape[kind[2]]
                else:
                    st = strides.get(kind[1])
                    if st is None:
                        st = strides[kind[1]] = t.stride()
                    actual = st[kind[2]]
                if actual != v and (kind[0] == DIM or t.shape[kind[2]] > 1):
                    what = "size" if kind[0] == DIM else "stride"
                    return None, f"input {kind[1]}'s {what} {kind[2]} is {actual}, the family has {v} there"
        parts = self.parts
        out = [parts[0]]
        for i, v in enumerate(vals):
            out.append(v)
            out.append(parts[i + 1])
        return "".join(out), None

    def widened(self, c, least=2):
        """A family that also covers trace c (recorded at other sizes), or (None, why not).
        least: the smallest size a variable may have in the samples (1 for probes, probe.py)."""
        parts, values, kinds = tokens(c.text)
        if parts != self.parts or len(values) != len(self.exprs):
            return None, "other operations or constants"
        if list(getattr(c, "size_guards", ())) != list(getattr(self.proto, "size_guards", ())):
            return None, "a comparison of sizes in Python came out otherwise"
        # the known variables at c's sizes
        env = []
        for k, dims in enumerate(self.variables):
            vals = {values[_dim_token(kinds, i, d)] for i, d in dims}
            if len(vals) != 1 or min(vals) < max(least, self.low[k]):
                return None, f"s{k} is not one size >= {max(least, self.low[k])} in the new trace"
            env.append(vals.pop())
        new, new_dims, why = self._new_variables(kinds, values, least)
        if why is not None:
            return None, why
        nvars = len(self.variables) + len(new)
        if nvars > MAX_VARS:
            return None, f"more than {MAX_VARS} size variables"
        ratios = [Fraction(b) / Fraction(a) for a, b in new]
        steps = list(product(range(3), repeat=len(new)))
        seen = set()
        for e in steps:
            r = _ratio(e, ratios)
            if r in seen:
                return None, "the sizes changed in step (the variables cannot be told apart)"
            seen.add(r)
        old = len(self.variables)
        at = [Fraction(v) for v in env]
        # per step of the new variables: its ratio and the monomial that scales by it
        olds = [Fraction(a) for a, _ in new]
        scaled = [(_ratio(k, ratios), (tuple(sorted(s for i, x in enumerate(k) for s in [old + i] * x)),
                                      1 / _ratio(k, olds))) for k in steps]
        exprs, other = [], []
        for j, (kind, expr) in enumerate(zip(kinds, self.exprs)):
            e = expr[0][1] if len(expr) == 1 and not expr[0][0] else p_eval(expr, at)  # (a constant: most)
            b = values[j]
            if kind[0] not in _FREE and (p_syms(expr) or e != b):
                other.append(j)  # (what gives it is found below)
                exprs.append(None)
                continue
            fit = None
            if e == 0:
                fit = expr if b == 0 else None
            else:
                for r, term in scaled:
                    if e * r == b:
                        fit = p_mul(expr, (term,))
                        break
            if fit is None and len(new) == 1:  # an offset of the new variable: expr + d * (s - a)
                a_new, b_new = new[0]
                d = Fraction(b - e) / (b_new - a_new)
                if d.denominator == 1 and d:
                    fit = p_add(p_add(expr, poly(d, old)), poly(-d * a_new))
            if fit is None:
                fixed = getattr(self.proto, "size_fixed", None)
                hint = f" (the program used a size as a number in Python at {min(fixed.values())})" if fixed else ""
                return None, f"integer {j} of the text ({kind[0]}) follows no product or offset of the sizes{hint}"
            exprs.append(fit)
        samples = [list(s) + [a for a, _ in new] for s in (self.samples or [[]])] + [env + [b for _, b in new]]
        if other:
            why = self._computed(other, exprs, values, samples)
            if why is not None:
                return None, why
        why = _fixed_sizes_constant(self.proto, exprs)
        if why is not None:
            return None, why
        fam = Family(self.proto, self.parts, self.kinds, exprs, self.variables + new_dims,
                     self.low + [least] * len(new_dims), samples)
        return (fam, None) if fam.unusable is None else (None, fam.unusable)

    def _new_variables(self, kinds, values, least):
        """The input dims of a new sample (its text's kinds and values) that were constants and
        changed: new variables ((old size, new size) each, and the (slot, dim) pairs that are
        it), or a reason. Equal pairs are one variable; dims that changed by the same ratio as one
        are a multiple of it (y of 5 * n elements viewed as [n, 5]), by the same difference an
        offset of it (a cache of n and a mask of n + 1): those are fitted, not new."""
        new, new_dims, offset = [], [], False
        for j, (kind, expr) in enumerate(zip(kinds, self.exprs)):
            if kind[0] != DIM or p_syms(expr):
                continue
            a, b = p_eval(expr, []), values[j]
            if a == b:
                continue
            if a < least or b < least:
                return None, None, (f"input {kind[1]}'s size {kind[2]} changed from {a} to {b} "
                                    f"(variables are >= {least})")
            key = (a, b)
            same = [i for i, (a0, b0) in enumerate(new) if Fraction(b0, a0) == Fraction(b, a)]
            if same:
                if new[same[0]] == key:
                    new_dims[same[0]].append((kind[1], kind[2]))
            elif any(b0 - a0 == b - a for a0, b0 in new):
                offset = True
            else:
                new.append(key)
                new_dims.append([(kind[1], kind[2])])
        if not new:
            return None, None, "no input size changed"
        if offset and len(new) > 1:
            return None, None, "sizes changed in step with an offset among several new variables"
        return new, new_dims, None

    def _computed(self, other, exprs, values, samples):
        """Each integer of `other` (op arguments, not types or shapes: nothing checks them when
        the code runs) that changed or follows the sizes: the polynomial of a size Python
        computed and passed to a torch call (sizeflow.py), which must give it in every sample;
        its slot in exprs is filled. None, or why not."""
        owners = {}
        tokens(self.proto.text, owners)
        keys = {key: exprs[j] for key, j in owners.items() if exprs[j] is not None}
        passed = []
        for q in getattr(self.proto, "size_passed", ()):
            if p_syms(q) <= keys.keys():
                passed.append(p_subst(q, keys))
        at = [[Fraction(v) for v in s] for s in samples]
        for j in other:
            want = [p_eval(self.exprs[j], s[:len(self.variables)]) for s in at[:-1]] + [Fraction(values[j])]
            found = next((q for q in passed if all(p_eval(q, s) == w for s, w in zip(at, want))), None)
            if found is None:
                return (f"integer {j} of the text ({self.kinds[j][0]}: not a type or a shape) depends on the sizes, "
                        "and no size the program computed in Python gives it")
            exprs[j] = found
        return None


def value_name(c, name):
    """A trace value's name for people: an input by its source (a[0]), else the IR name."""
    if name.startswith("%i") and name[2:].isdigit():
        k = int(name[2:])
        if k < len(c.input_srcs or ()):
            return str(c.input_srcs[k])
    return f"the trace value {name}"


def _fixed_sizes_constant(proto, exprs):
    """None when every size the program used as a number in Python (sizeflow.py) is a constant
    of the fit, and no number computed from a size that varies without a polynomial (a floor
    division) went into an op's arguments; else why not: what Python decided with it, or the op
    given it, may differ at other sizes."""
    fixed = getattr(proto, "size_fixed", None)
    opaque = getattr(proto, "size_opaque", None)
    if not fixed and not opaque:
        return None
    owners = {}
    _, values, kinds = tokens(proto.text, owners)
    if opaque:
        others = {v for v, k in zip(values, kinds) if k[0] not in _FREE}
        for dims, v in opaque:
            varies = [key for key in dims if key not in owners or p_syms(exprs[owners[key]])]
            if varies and v in others:
                return (f"the program computed {v} from {value_name(proto, varies[0][0])}.size({varies[0][1]}) "
                        "(not as a sum or product of sizes) and passed it to a torch op")
    if not fixed:
        return None
    for key, where in sorted(fixed.items()):
        j = owners.get(key)
        if j is None:
            return f"the program used a size of {key[0]} in Python at {where}, which is not a size of the trace"
        if p_syms(exprs[j]):
            return (f"the program used {value_name(proto, key[0])}.size({key[1]}) as a number in Python at {where}, "
                    "and it changed")
    return None


def _dim_token(kinds, slot, dim):
    for j, k in enumerate(kinds):
        if k[0] == DIM and k[1] == slot and k[2] == dim:
            return j
    raise KeyError((slot, dim))


def same_program(a, b):
    """Whether traces a and b (Compiled) may be one family: the same Python guards (checks and
    the constants they compare with), output structure, ops and writes."""
    ga, gb = a.guards, b.guards
    if ga._checks != gb._checks or a.out_spec != b.out_spec or list(a.ops) != list(b.ops) or \
            a.mutates != b.mutates or list(a.input_srcs) != list(b.input_srcs) or \
            set(getattr(a, "size_fixed", ())) != set(getattr(b, "size_fixed", ())):
        return False
    if ga._consts.keys() != gb._consts.keys():
        return False
    for name, x in ga._consts.items():
        y = gb._consts[name]
        if x is not y and not (type(x) is type(y) and _plain_equal(x, y)):
            return False
    return True


def _plain_equal(x, y):
    """Equal constants of a guard compared by value (a dict's key list is a list of them)."""
    from .guards import plain
    if type(x) is list:
        return len(x) == len(y) and all(_plain_equal(p, q) for p, q in zip(x, y))
    return plain(x) and plain(y) and repr(x) == repr(y)
