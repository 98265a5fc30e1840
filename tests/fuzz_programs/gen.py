"""Random small PyTorch programs as Python source text (a hypothesis strategy), for fuzzing dynamo.

A program is the text of a module that defines

    make_inputs(seed)    fresh, seeded inputs for one call (a tuple)
    build()              the program: a function, or an nn.Module instance
    mutate(call, target) what changes between calls (globals, attributes, closure cells, ...)

plus module-level state in UPPER-CASE names (LOG, STATE, COUNT, SCALE, CFG, TABLE, GT<n>), which
a driver compares after every call (also MODCFG, a module object whose attributes change, and
the Python-object arguments of `pyarg` statements). Programs are generated statement by statement; each statement
is executed on real tensors while it is generated (the inputs of call 0), so shapes and dtypes
are always known and statements that raise are dropped (or, rarely, kept as the last statement:
then the program raises on purpose).
"""
import re
import warnings

import hypothesis.strategies as st
import torch
import torch.nn as nn
import torch.nn.functional as F

CALLS = 4           # calls per program; mutations happen before calls 1..CALLS-1
MAX_NUMEL = 4096    # values larger than this are not kept
MAX_STATEMENTS = 12
HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
SUB_CLASS = """class Sub(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.gain = 0.5

    def forward(self, u):
        return torch.tanh(self.lin(u)) * self.gain + u
"""

DIMS = [3, 1, 7, 2, 4, 5, 8]
# how a function reads an input it was given by keyword into **kw
KEYWORD_READS = ["{0} = kw['{0}']", "{0} = kw.get('{0}')", "{0} = kw.pop('{0}')", "{0} = kw.setdefault('{0}', None)",
                 "{0} = (lambda **d: d['{0}'])(**kw)", "{0} = {{**kw}}['{0}']", "{0} = kw.copy()['{0}']",
                 "{0} = dict(kw.items())['{0}']"]
LITERALS = ["2.0", "0.5", "-1.5", "3", "0", "1e-3", "-2", "0.0", "1", "100.0"]
VALUES = ["0.5", "2.0", "-1.0", "3", "0.25", "0", "1e-4", "-3"]

UNARY = ["torch.exp({a})", "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})", "F.gelu({a})",
         "{a}.abs()", "-{a}", "{a}.clamp({n}, {m})", "{a}.clamp(min={n})", "{a}.clamp(max={m})",
         "{a} ** 2", "{a}.pow({p})", "torch.sqrt({a}.abs())", "{a}.float()", "{a}.double()", "{a}.long()",
         "{a}.half()", "({a} > {n})", "~({a} > {n})", "F.silu({a})", "torch.log1p({a}.abs())", "{a}.sign()",
         "torch.sin({a})", "{a}.reciprocal()", "torch.rsqrt({a}.abs() + 1)", "torch.erf({a})", "{a}.round()",
         "torch.floor({a})", "F.gelu({a}, approximate='tanh')", "{a}.bool()", "torch.log({a})",
         "torch.nan_to_num({a})", "{a}.clone()", "{a}.neg()", "{a} * {a}", "F.softplus({a})", "F.leaky_relu({a}, 0.1)",
         "F.elu({a})", "F.hardtanh({a})", "F.hardswish({a})", "F.logsigmoid({a})", "F.mish({a})", "torch.tril({a})",
         "torch.triu({a}, 1)", "{a}.roll(1, {d})", "{a}.flip({d})", "torch.zeros_like({a})", "torch.ones_like({a}) * {n}",
         "torch.full_like({a}, {n})", "{a}.new_zeros({a}.shape)", "{a}.type_as(torch.ones(()))", "{a}.to(torch.float64)",
         "torch.atan2({a}, {a} + 1)", "torch.lerp({a}, {a} * 2, 0.25)", "torch.addcmul({a}, {a}, {a}, value=0.5)",
         "{a}.fmod(2)", "{a}.remainder(3)", "{a} >> 1", "{a} & 3", "{a} ^ {a}", "torch.logical_not({a})",
         "{a}.repeat(2, *([1] * ({a}.dim() - 1)))", "{a}.sort({d}).values", "{a}.topk(1, {d}).values",
         "{a}.cummax({d}).values", "torch.cumprod({a}, {d})", "F.dropout({a}, 0.5, training=False)",
         "torch.einsum('...i,...i->...', {a}, {a})", "F.pad({a}, (1, 1))", "{a}.masked_select({a} > 0).sum()",
         "torch.arange({a}.shape[-1]) * {a}", "torch.linspace(0, 1, {a}.shape[-1]) + {a}"]
BINARY = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "{a} / {b}", "{b} - {a}", "torch.maximum({a}, {t})",
          "torch.where({a} > 0, {a}, {b})", "{a} // {b}", "{a} % {b}", "torch.pow({a}, {b})",
          "{a} * {b} + {a}", "torch.add({a}, {t}, alpha={n})", "{a}.masked_fill({a} < 0, {n})",
          "torch.minimum({a}, {t})", "({a} > {b})", "({a} > 0) & ({t} < 0)", "{b} / {a}",
          "torch.where({t} > {n}, {b}, {a})", "{a} == {b}", "torch.clamp({a}, min={t})",
          "torch.clamp({a}, {t}, {t} + 1)", "{a}.index_select(0, {idx})", "{a}.gather(-1, torch.zeros_like({a}, dtype=torch.long))",
          "F.mse_loss({a}, {t})", "torch.hypot({a}, {t})", "{a}.type_as({t}) * {t}", "torch.lerp({a}, {t}, 0.5)",
          "torch.logical_and({a} > 0, {t} < 0)", "{a}.expand_as({t}) + {t}" ]
REDUCE = ["{a}.sum({d})", "{a}.sum(dim={d}, keepdim=True)", "{a}.mean({d})", "{a}.mean(dim={d}, keepdim=True)",
          "{a}.amax({d})", "{a}.amax(dim={d}, keepdim=True)", "torch.softmax({a}, {d})", "F.softmax({a}, dim={d})",
          "F.log_softmax({a}, {d})", "F.layer_norm({a}, {a}.shape[-1:])", "{a}.sum()", "{a}.mean()",
          "torch.logsumexp({a}, {d})", "{a}.max(dim={d}).values", "{a}.amin({d})", "{a}.prod({d})",
          "{a}.norm(dim={d})", "{a}.var({d})", "{a}.cumsum({d})", "{a}.argmax({d})", "{a}.any({d})",
          "F.normalize({a}, dim={d})", "{a} - {a}.mean({d}, keepdim=True)", "{a} / ({a}.abs().sum() + 1)",
          "{a}.var_mean({d})[0]", "{a}.std({d}, keepdim=True)", "{a}.min(dim={d}).indices", "{a}.median({d}).values",
          "{a}.logsumexp({d}, keepdim=True)", "{a}.count_nonzero({d})", "{a}.all({d})", "F.adaptive_avg_pool1d({a}, 1)",
          "F.avg_pool1d({a}, 2)", "F.max_pool1d({a}, 2)", "F.adaptive_avg_pool2d({a}, 1)", "F.max_pool2d({a}, 2)",
          "F.rms_norm({a}, {a}.shape[-1:])" if hasattr(F, "rms_norm") else "{a} * torch.rsqrt({a}.pow(2).mean(-1, keepdim=True) + 1e-6)",
          "F.cross_entropy({a}, torch.zeros({a}.shape[0], dtype=torch.long))", "F.softmin({a}, {d})"]
VIEW = ["{a}.reshape(-1)", "{a}.reshape({rs})", "{a}.view({rs})", "{a}.permute({perm})", "{a}.transpose({d}, {e})",
        "{a}.t()", "{a}.unsqueeze({u})", "{a}.squeeze({d})", "{a}.squeeze()", "{a}.expand({ex})", "{a}[1:]",
        "{a}[..., ::2]", "{a}[:, 1:]", "{a}[0]", "{a}.select({d}, {i})", "{a}.chunk(2, {d})[0]",
        "{a}.chunk(2, {d})[-1]", "{a}.split({k}, {d})[0]", "{a}.narrow({d}, {i}, 1)", "{a}.flatten()",
        "{a}.contiguous()", "{a}.unbind({d})[-1]", "{a}[:, None]", "{a}[{i}:]", "{a}[..., -1]",
        "{a}.view(-1)[{i}:]", "{a}.movedim(0, -1)", "{a}[None].expand(2, *{a}.shape)", "{a}.unflatten(0, ({a}.shape[0], 1))",
        "{a}.mT", "{a}.T if {a}.dim() == 2 else {a}", "{a}.diagonal()", "{a}.swapaxes(0, -1)", "{a}.view_as({a})",
        "{a}.reshape({a}.shape[0], -1)", "{a}[..., None, :]", "{a}[[0]]", "{a}[-1:, ...]", "{a}.tensor_split(2, {d})[1]",
        "{a}.unfold(-1, 2, 1)", "{a}.as_strided({a}.shape, {a}.stride())", "{a}.squeeze(-1).unsqueeze(-1)"]
INPLACE = ["{a}.add_({b})", "{a}.mul_({n})", "{a}.clamp_({n}, {m})", "{a}.sub_({b})", "{a}.div_({n})",
           "{a}.relu_()", "{a}.copy_({t})", "{a}.fill_({n})", "{a}.zero_()", "{a}.exp_()", "{a}.mul_({t})",
           "{a}[0].mul_({n})", "{a}.view(-1)[:3].add_({n})", "{a}.t().mul_({n})", "{a}.add_({b}).mul_({n})",
           "{a}.masked_fill_({a} > 0, {n})", "{a}.abs_()", "{a}.neg_()", "{a}.tanh_()", "{a}[..., 1:].add_({n})",
           "{a}.transpose(0, -1)[0].sub_({n})", "{a}.unsqueeze(0).mul_({n})"]
SETITEM = ["{a}[0] = {n}", "{a}[..., 0] = {n}", "{a}[1:] = {n}", "{a}[:, 1:3] = {n}", "{a}[{a} < 0] = {n}",
           "{a}[{idx}] = {n}", "{a}[0] = {a}[-1]", "{a}[..., :1] = {a}[..., -1:] * {n}", "{a}[:] = {t}",
           "{a}[{idx}] = {a}[{idx}] * 2", "{a}[..., 1] = {a}[..., 0] + {a}[..., 1]", "{a}[{a} > {n}] = {a}[{a} > {n}] * 2"]
TENSOR_CONDS = ["{a}.sum() > 0", "{a}.max() > 0.5", "({a} > 0).any()", "{a}.mean() < {n}", "{a}.abs().sum() > 1",
                "bool(({a} < 0).all())", "{a}.sum().item() > 0", "int({a}.argmax()) > 1", "float({a}.sum()) > 0",
                "{a}.numel() and {a}.flatten()[0] > 0"]
PY_CONDS = ["FLAG", "CFG.mode == 'a'", "{a}.shape[0] > 2", "{a}.dim() == 2", "{a}.dtype == torch.float32",
            "{a}.is_contiguous()", "len(TABLE) > 2", "{a}.numel() > 10", "{n} > 0"]
RETURNS = ["{0}", "({0}, {1})", "[{0}, {1}]", "{{'a': {0}, 'b': {1}}}", "({0}, {0}.shape[0])", "({0}, None)",
           "({0}, {1}, {2})", "{0}, {{'k': [{1}]}}"]


class Program:
    """A generated program: its source text, its feature tags, and whether build() makes a module."""

    def __init__(self, source, tags, module):
        """Keeps the source, the tags (a frozenset) and the kind."""
        self.source, self.tags, self.module = source, frozenset(tags), module

    def __repr__(self):
        """The source (hypothesis prints it for a falsifying example)."""
        return "\n" + self.source


def indent(lines, depth):
    """The lines, each indented by depth levels of four spaces."""
    return [("    " * depth + line) if line else line for line in lines]


class Builder:
    """A program under construction: its pieces of source and a namespace that runs them."""

    def __init__(self, draw, module):
        """An empty program; draw is hypothesis's draw function."""
        self.draw, self.module = draw, module
        self.ns = {"torch": torch, "nn": nn, "F": F, "g": torch.Generator().manual_seed(0)}
        self.globals, self.inputs, self.closure, self.init, self.body = [], [], [], [], []
        self.input_names, self.tensors, self.decls, self.mutations, self.setters = [], [], set(), [], []
        self.cells, self.tags, self.n, self.raising, self.has_sub = [], set(), 0, False, False
        if module:
            self.ns["self"] = nn.Module()
        torch.manual_seed(0)  # submodules made while generating: the same parameters on every replay

    # -- drawing helpers --------------------------------------------------------------------

    def pick(self, seq):
        """One element of seq (shrinks toward the first)."""
        return seq[self.draw(st.integers(0, len(seq) - 1))]

    def chance(self, tenths):
        """True with probability tenths/10 (shrinks toward False)."""
        return self.draw(st.integers(0, 9)) >= 10 - tenths

    def rare(self):
        """True about once in fifty draws (shrinks toward False)."""
        return self.draw(st.integers(0, 49)) == 49

    def fresh(self, prefix="t"):
        """A new variable name."""
        self.n += 1
        return f"{prefix}{self.n}"

    def run(self, src):
        """Executes src in the namespace; False if it raises (or warns)."""
        # torch's warn-once warnings warn every time here: a statement that warns is dropped, and
        # one warned about only at its first occurrence in the process would make replaying a
        # program draw differently (hypothesis: "inconsistent data generation")
        always = torch.is_warn_always_enabled()
        torch.set_warn_always(True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                exec(src, self.ns)  # noqa: S102 -- our own generated text
            return True
        except Exception:
            return False
        finally:
            torch.set_warn_always(always)

    def value(self, pred=None):
        """A live tensor value's name (shrinks toward the most recent one), or None."""
        cands = [n for n in self.tensors if pred is None or pred(self.ns[n])]
        if not cands:
            return None
        return cands[len(cands) - 1 - self.draw(st.integers(0, len(cands) - 1))]

    def shape(self, rank):
        """A random shape of the given rank (a size-0 dimension now and then)."""
        dims = [self.pick(DIMS) for _ in range(rank)]
        if rank and self.chance(1):
            dims[self.draw(st.integers(0, rank - 1))] = 0
            self.tags.add("size:0")
        return tuple(dims)

    def dtype(self):
        """A dtype for an input (mostly float32)."""
        dt = self.pick(["float32", "float32", "float32", "float64", "int64", "bool", "float16"])
        self.tags.add("dtype:" + dt)
        return dt

    def maybe_mutate(self, line, tag, decl=None):
        """Sometimes registers a change of state before one of the later calls."""
        if self.chance(4):
            call = self.draw(st.integers(1, CALLS - 1))
            self.mutations.append((call, line, decl))
            self.tags.add("mutate:" + tag)

    # -- inputs and state -------------------------------------------------------------------

    def add_input(self, shape, dtype="float32", layout=None):
        """A new input of the given shape, dtype and memory layout; its name."""
        name = f"x{len(self.input_names)}"
        layout = layout or self.pick(["contiguous", "contiguous", "contiguous", "contiguous", "transposed", "sliced",
                                      "expanded", "offset", "varying", "restrided", "retyped", "reranked",
                                      "growing"])
        expr = input_expr(shape, dtype, layout)
        self.ns["seed"] = 0
        if not self.run(f"{name} = {expr.format(g='g')}"):
            expr = input_expr(shape, dtype, "contiguous")
            layout = "contiguous"
            self.run(f"{name} = {expr.format(g='g')}")
        self.inputs.append(f"{name} = {expr.format(g='g')}")
        self.input_names.append(name)
        self.tensors.append(name)
        self.tags.add("input:" + layout)
        return name

    def index_input(self, size):
        """A new int64 input of distinct indices below size; its name."""
        name = f"x{len(self.input_names)}"
        k = self.draw(st.integers(1, 3))
        line = f"{name} = torch.randperm({size}, generator=g)[:{k}]"
        self.run(line)
        self.inputs.append(line)
        self.input_names.append(name)
        self.tags.add("input:index")
        return name

    def scalar_input(self):
        """A Python float argument that changes between calls; its name."""
        name = f"x{len(self.input_names)}"
        line = f"{name} = 0.5 * (1 + seed % 2)"
        self.ns["seed"] = 0
        self.run(line)
        self.inputs.append(line)
        self.input_names.append(name)
        self.tags.add("input:scalar")
        return name

    def ensure_global(self, name, line, tag):
        """Defines a module-level name once (by running line); True if it was new."""
        if name in self.ns:
            return False
        self.run(line)
        self.globals.append(line)
        self.tags.add(tag)
        return True

    def ensure_cfg(self):
        """The CFG object (a plain class instance holding settings)."""
        self.ensure_global("Cfg", "class Cfg:\n    pass\n", "state:cfg")
        self.ensure_global("CFG", "CFG = Cfg()", "state:cfg")

    def cfg_attr(self, attr, value, mutated):
        """CFG.<attr>, set to value once; mutated: possible values for a later call."""
        self.ensure_cfg()
        if not hasattr(self.ns["CFG"], attr):
            line = f"CFG.{attr} = {value}"
            self.run(line)
            self.globals.append(line)
            self.maybe_mutate(f"CFG.{attr} = {self.pick(mutated)}", "attr")
        return f"CFG.{attr}"

    def global_tensor(self, shape, dtype):
        """A new module-level tensor; in-place changed or replaced between calls, sometimes."""
        name = self.fresh("GT")
        line = f"{name} = {input_expr(shape, dtype, 'contiguous').format(g=f'torch.Generator().manual_seed({self.n})')}"
        self.ensure_global(name, line, "state:global-tensor")
        if self.chance(5):
            self.maybe_mutate(f"{name}.mul_(2)" if dtype != "bool" else f"{name}.logical_not_()", "global-tensor")
        else:
            self.maybe_mutate(f"{name} = {name} + 1", "global-tensor-replaced", decl=name)
        self.tensors.append(name)
        return name

    def closure_tensor(self, shape, dtype):
        """A new tensor captured by the program from build()'s scope; its name."""
        name = self.fresh("w")
        line = f"{name} = {input_expr(shape, dtype, 'contiguous').format(g=f'torch.Generator().manual_seed({self.n})')}"
        self.run(line)
        self.closure.append(line)
        self.cells.append(name)
        self.tags.add("closure:tensor")
        self.tensors.append(name)
        return name

    # -- operands ---------------------------------------------------------------------------

    def number(self):
        """Source text of a Python number: a literal, or read from (mutable) state."""
        kind = self.pick(["literal", "literal", "literal", "global", "attr", "table", "closure", "self",
                          "shape", "arg"])
        if kind == "global":
            if self.ensure_global("SCALE", f"SCALE = {self.pick(VALUES)}", "state:global"):
                self.maybe_mutate(f"SCALE = {self.pick(VALUES)}", "global", decl="SCALE")
            return "SCALE"
        if kind == "attr":
            return self.cfg_attr("alpha", self.pick(VALUES), VALUES)
        if kind == "table":
            if self.ensure_global("TABLE", f"TABLE = [{self.pick(VALUES)}, {self.pick(VALUES)}, 1.5]", "state:list"):
                self.maybe_mutate(f"TABLE[{self.draw(st.integers(0, 2))}] = {self.pick(VALUES)}", "list")
            return f"TABLE[{self.draw(st.integers(0, 2))}]"
        if kind == "closure":
            return self.closure_number()
        if kind == "self" and self.module:
            return self.self_number()
        if kind == "shape":
            a = self.value(lambda t: t.dim() > 0)
            if a is not None:
                self.tags.add("number:shape")
                return f"{a}.shape[-1]"
        if kind == "arg":
            return self.scalar_input()
        return self.pick(LITERALS)

    def closure_number(self):
        """A number in a closure cell of build(), changed through a setter between calls."""
        if "alpha" not in self.ns:
            value = self.pick(VALUES)
            self.run(f"alpha = {value}")
            self.closure.append(f"alpha = {value}")
            self.setters.append("alpha")
            self.tags.add("closure:number")
            self.maybe_mutate(f"target.fuzz_set['alpha']({self.pick(VALUES)})", "closure")
        return "alpha"

    def self_number(self):
        """A Python number attribute of the module (self.scale), changed between calls."""
        if not hasattr(self.ns["self"], "scale"):
            value = self.pick(VALUES)
            self.add_init(f"self.scale = {value}")
            self.maybe_mutate(f"target.scale = {self.pick(VALUES)}", "module-attr")
        return "self.scale"

    def add_init(self, line):
        """A line of the module's __init__ (run on the stand-in module now)."""
        ok = self.run(line)
        if ok:
            self.init.append(line)
        return ok

    def tensor_operand(self, a):
        """A tensor whose shape broadcasts with value a: a live value, a new input, a global or a captured one."""
        t = self.ns[a]
        kind = self.pick(["value", "input", "global", "closure", "value"])
        if kind == "value":
            b = self.value(lambda v: broadcasts(v.shape, t.shape))
            if b is not None:
                return b
        shape = self.partner_shape(tuple(t.shape))
        dtype = dtype_name(t.dtype) if self.chance(7) else "float32"
        if kind == "global":
            return self.global_tensor(shape, dtype)
        if kind == "closure":
            return self.closure_tensor(shape, dtype)
        self.tags.add("input:broadcast" if shape != tuple(t.shape) else "input:same-shape")
        return self.add_input(shape, dtype)

    def partner_shape(self, shape):
        """shape, or a shape that broadcasts to it (some dims 1, leading dims dropped)."""
        out = [1 if self.chance(3) else d for d in shape]
        drop = self.draw(st.integers(0, len(out))) if self.chance(3) else 0
        return tuple(out[drop:])

    def operand(self, a):
        """Source text of the second operand of a binary op: a number or a tensor."""
        return self.number() if self.chance(4) else self.tensor_operand(a)

    def fill(self, template, a, text=None):
        """template with {a} (written as text, default a) and the other fields it names drawn for value a."""
        t = self.ns[a]
        r = t.dim()
        fields = {"a": text or a}
        makers = {
            "b": lambda: self.operand(a), "t": lambda: self.tensor_operand(a), "n": self.number,
            "m": lambda: self.pick(["1.0", "0.5", "3", "SCALE" if "SCALE" in self.ns else "2.0"]),
            "p": lambda: self.pick(["2", "3", "0.5", "-1", "2.0", "0"]),
            "d": lambda: str(self.draw(st.integers(-max(r, 1), max(r, 1) - 1))),
            "e": lambda: str(self.draw(st.integers(-max(r, 1), max(r, 1) - 1))),
            "u": lambda: str(self.draw(st.integers(-r - 1, r))),
            "i": lambda: str(self.draw(st.integers(0, max(min(t.shape) if r else 1, 1) - 1))),
            "k": lambda: str(self.draw(st.integers(1, 3))),
            "rs": lambda: self.reshape_target(tuple(t.shape)),
            "perm": lambda: ", ".join(map(str, self.draw(st.permutations(range(r))))) or "()",
            "ex": lambda: ", ".join(str(self.pick([3, 2]) if d == 1 else -1) for d in t.shape) or "()",
            "idx": lambda: self.index_input(t.shape[0]) if r else "0",
        }
        for name, make in makers.items():
            if "{" + name + "}" in template:
                fields[name] = make()
        return template.format(**fields)

    def reshape_target(self, shape):
        """Source of a shape with the same number of elements (merged or split dims)."""
        dims = list(shape)
        choice = self.pick(["merge", "one", "minus", "split"])
        if choice == "merge" and len(dims) >= 2:
            i = self.draw(st.integers(0, len(dims) - 2))
            dims[i:i + 2] = [dims[i] * dims[i + 1]]
        elif choice == "one":
            dims.insert(self.draw(st.integers(0, len(dims))), 1)
        elif choice == "minus" and dims:
            return f"-1, {dims[-1]}"
        elif choice == "split" and dims and dims[0] % 2 == 0:
            dims[0:1] = [2, dims[0] // 2]
        return ", ".join(map(str, dims)) or "()"

    # -- statements -------------------------------------------------------------------------

    def commit(self, lines, tag, new=(), check=None):
        """Runs a statement (check: what to run instead, for returns and branches); keeps it if it works."""
        src = "\n".join(check if check is not None else lines)
        ok = self.run(src) and all(self.keepable(n) for n in new)
        if not ok:
            if self.rare() and not is_compound(lines):
                self.body.extend(lines)  # kept on purpose: the program raises here on every call
                self.tags.add("raises:statement")
                self.raising = True
            return False
        self.body.extend(lines)
        self.tags.add(tag)
        self.tensors.extend(n for n in new if isinstance(self.ns.get(n), torch.Tensor) and n not in self.tensors)
        return True

    def keepable(self, name):
        """Whether a new value is small enough (and exists)."""
        v = self.ns.get(name)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            v = v.detach()
            finite = v[torch.isfinite(v)]
            if finite.numel() and float(finite.abs().max()) > 1e6:
                return False  # float32 rounding at this size is 1 or more: casts to ints would differ
        return v is not None and (not isinstance(v, torch.Tensor) or v.numel() <= MAX_NUMEL)

    def expr_stmt(self, templates, tag, pred=None):
        """tN = <template applied to a live value>."""
        a = self.value(pred)
        if a is None:
            return False
        name, template = self.fresh(), self.pick(templates)
        if "layer_norm" in template and (self.ns[a].dim() == 0 or self.ns[a].shape[-1] < 2):
            return False  # normalizing single elements: eager returns rounding noise (amplified by 1/sqrt(eps))
        if "median" in template and 0 in self.ns[a].stride():
            return False  # torch 1.13's median of an expanded (stride-0) tensor reads uninitialized memory
        step = any(op in template for op in ("//", "%", "floor", "ceil", "round", "trunc", "sign"))
        if step and self.ns[a].dtype in (torch.float16, torch.bfloat16):
            # dynamo computes a half-precision chain in float32 and rounds once (as Inductor does);
            # eager rounds every step: a step function after such a chain can land on either side
            return False
        expr = self.fill(template, a)
        if step and any(isinstance(self.ns.get(n), torch.Tensor) and self.ns[n].dtype in (torch.float16, torch.bfloat16)
                        for n in re.findall(r"[A-Za-z_]\w*", expr)):
            return False  # (the same for the other operand: x % layer_norm(x.half()))
        return self.commit([f"{name} = {expr}"], f"{tag}:{template}", [name])

    def s_unary(self):
        """A pointwise unary op."""
        return self.expr_stmt(UNARY, "pointwise:unary")

    def s_binary(self):
        """A pointwise binary op with a number or tensor operand."""
        return self.expr_stmt(BINARY, "pointwise:binary")

    def s_reduce(self):
        """A reduction, softmax or norm."""
        return self.expr_stmt(REDUCE, "reduce")

    def s_view(self):
        """A view (reshape, permute, slice, select, expand, chunk, ...)."""
        return self.expr_stmt(VIEW, "view")

    def s_matmul(self):
        """A matmul against a weight of the right shape (or the value itself)."""
        a = self.value(lambda t: t.dim() >= 1)
        if a is None:
            return False
        t = self.ns[a]
        form = self.pick(["{a} @ {w}", "torch.matmul({a}, {w})", "F.linear({a}, {w})", "torch.bmm({a}, {w})",
                          "{a} @ {a}.transpose(-1, -2)", "torch.mm({a}, {w})", "{a}.transpose(-1, -2) @ {a}"])
        k = self.pick([4, 3, 1, 7])
        shape = {"F.linear({a}, {w})": (k, t.shape[-1]),
                 "torch.bmm({a}, {w})": (t.shape[0], t.shape[-1], k)}.get(form, (t.shape[-1], k))
        w = None
        if "{w}" in form:
            maker = self.pick([self.add_input, self.global_tensor, self.closure_tensor])
            w = maker(tuple(shape), dtype_name(t.dtype))
        name = self.fresh()
        return self.commit([f"{name} = {form.format(a=a, w=w)}"], "matmul", [name])

    def target(self):
        """The value an in-place op writes: mostly a temporary, else any value (inputs, globals, captured)."""
        a = self.value_named(lambda n: kind_of(n) == "temporary") if self.chance(6) else None
        return a or self.value()

    def value_named(self, pred):
        """A live value whose name satisfies pred (shrinks toward the most recent), or None."""
        cands = [n for n in self.tensors if pred(n)]
        return cands[len(cands) - 1 - self.draw(st.integers(0, len(cands) - 1))] if cands else None

    def s_inplace(self):
        """An in-place op on an input, a temporary or a global tensor."""
        a = self.target()
        if a is None:
            return False
        template = self.pick(INPLACE)
        stmt = self.fill(template, a)
        if ".copy_(" in stmt and not self.ns[a].is_floating_point() and \
                not self.cast_is_exact(stmt[stmt.index(".copy_(") + 7:-1]):
            return False
        return self.commit([stmt], f"inplace:{kind_of(a)}:{template}")

    def s_setitem(self):
        """An item assignment (slice, select, mask or index)."""
        a = self.target()
        if a is None:
            return False
        template = self.pick(SETITEM)
        stmt = self.fill(template, a)
        if not self.ns[a].is_floating_point() and not self.cast_is_exact(stmt.split(" = ", 1)[1]):
            return False
        return self.commit([stmt], f"setitem:{kind_of(a)}:{template}")

    def cast_is_exact(self, expr):
        """Whether writing expr into an integer tensor cannot depend on float rounding: expr is not
        floating, or its values are away from integer boundaries (a 1-ulp tanh of 1.9999999 vs 2.0
        truncates to 1 vs 2)."""
        try:
            v = eval(expr, self.ns)  # noqa: S307 -- our own generated text
        except Exception:  # noqa: BLE001 -- commit() judges statements that raise
            return True
        if isinstance(v, float):
            v = torch.tensor(v)
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.numel() == 0:
            return True
        v = v[torch.isfinite(v)].double()
        return v.numel() == 0 or float((v - v.round()).abs().min()) > 1e-3

    def s_cat(self):
        """torch.cat / torch.stack of a value and something of the same shape."""
        a = self.value()
        if a is None:
            return False
        form = self.pick(["torch.cat([{a}, {a} * 2], {d})", "torch.stack([{a}, -{a}], {u})",
                          "torch.cat(({a}, {a}.flip({d})), {d})", "torch.stack([{a}] * 3)"])
        name = self.fresh()
        form = form.replace("{u}", "{d}")
        return self.commit([f"{name} = {self.fill(form, a)}"], "cat", [name])

    def s_branch(self):
        """An if on a tensor's value or on Python state, with two arms, one in-place arm, or an early return."""
        a = self.value()
        if a is None:
            return False
        cond, tag = self.condition(a)
        if tag == "branch:tensor" and not self.robust(cond, a):
            return False
        arm = self.pick(["two", "inplace", "return", "two"])
        if arm == "return":
            ret = self.return_expr()
            return self.commit([f"if {cond}:", f"    return {ret}"], tag + ":return",
                               check=[f"__c = bool({cond})", f"__r = {ret}"])
        if arm == "inplace":
            stmt = self.fill(self.pick(INPLACE), a)
            return self.commit([f"if {cond}:", f"    {stmt}"], tag + ":inplace", check=[f"__c = bool({cond})", stmt])
        name = self.fresh()
        e1, e2 = self.fill(self.pick(UNARY), a), self.fill(self.pick(UNARY), a)
        check = [f"__c = bool({cond})", f"__1 = {e1}", f"__2 = {e2}",
                 "assert __1.shape == __2.shape and __1.dtype == __2.dtype", f"{name} = __1"]
        return self.commit([f"if {cond}:", f"    {name} = {e1}", "else:", f"    {name} = {e2}"], tag, [name], check)

    def robust(self, cond, a):
        """Whether a condition on tensor a keeps its truth when a's floats move by a relative 1e-4
        (float rounding of a different summation order must not pick the branch: a sum of layer-norm
        outputs is 0 up to rounding)."""
        t = self.ns[a]
        if not t.is_floating_point() or t.numel() == 0:
            return True
        try:
            want = bool(eval(cond, self.ns))  # noqa: S307 -- our own generated text
            for sign in (1.0, -1.0):
                self.ns[a] = t * (1 + sign * 1e-4) + sign * 1e-5 * (float(t.abs().nan_to_num().max()) + 1)
                if bool(eval(cond, self.ns)) != want:  # noqa: S307
                    return False
            return True
        except Exception:  # noqa: BLE001 -- a condition that raises is judged by commit()
            return True
        finally:
            self.ns[a] = t

    def condition(self, a):
        """(source of a condition on value a or on Python state, its tag)."""
        if self.chance(5):
            return self.fill(self.pick(TENSOR_CONDS), a), "branch:tensor"
        cond = self.pick(PY_CONDS + (["self.flag", "self.training"] if self.module else []))
        if cond == "FLAG" and self.ensure_global("FLAG", "FLAG = True", "state:flag"):
            self.maybe_mutate("FLAG = not FLAG", "flag", decl="FLAG")
        if cond.startswith("CFG"):
            self.cfg_attr("mode", "'a'", ["'b'", "'a'"])
        if cond == "len(TABLE) > 2" and self.ensure_global("TABLE", "TABLE = [1.0, 2.0, 3.0]", "state:list"):
            self.maybe_mutate("TABLE.append(0.5)", "list-append")
        if cond == "self.flag" and not hasattr(self.ns["self"], "flag"):
            self.add_init("self.flag = True")
            self.maybe_mutate("target.flag = not target.flag", "module-attr")
        if cond == "self.training":
            self.maybe_mutate(f"target.train({self.pick(['False', 'True'])})", "training")
        return self.fill(cond, a), "branch:python"

    def s_loop(self):
        """A for (or while) loop: unrolled arithmetic, over TABLE, over a tensor's rows, or in-place."""
        a = self.value()
        if a is None:
            return False
        name, k = self.fresh(), self.draw(st.integers(1, 4))
        form = self.pick(["range", "table", "rows", "while", "inplace", "values", "enumerate", "zip", "unpack", "break"])
        if form in ("table", "zip"):
            self.ensure_global("TABLE", f"TABLE = [{self.pick(VALUES)}, 2.0, 1.5]", "state:list")
        body = {
            "range": lambda: [f"{name} = {a}", f"for i in range({k}):", f"    {name} = {name} * {self.number()} + i"],
            "table": lambda: [f"{name} = {a} * 0", "for c in TABLE:", f"    {name} = {name} + torch.tanh({a} * c)"],
            "rows": lambda: [f"{name} = {a}[0] * 0", f"for row in {a}:", f"    {name} = {name} + row * 2"],
            "while": lambda: [f"{name} = {a}", "i = 0", f"while i < {k}:",
                              f"    {name} = torch.sigmoid({name}) - 0.5", "    i += 1"],
            "inplace": lambda: [f"for i in range({k}):", f"    {self.fill(self.pick(INPLACE), a)}"],
            "values": lambda: [f"{name} = {a} * 0", f"for v in [{a}, {a} * 2, -{a}]:", f"    {name} = {name} + v"],
            "enumerate": lambda: [f"{name} = {a} * 0", f"for j, v in enumerate(({a}, {a}.abs())):",
                                  f"    {name} = {name} + v * (j + 1)"],
            "zip": lambda: [f"{name} = {a} * 0", f"for v, c in zip([{a}, -{a}], TABLE):", f"    {name} = {name} + v * c"],
            "unpack": lambda: [f"p, q = {a}, {a} * {self.number()}", f"{name}, _ = q + p, None"],
            "break": lambda: [f"{name} = {a}", f"for i in range({k + 1}):", f"    if i == {k}:", "        break",
                              f"    {name} = {name} * 0.5 + i"],
        }[form]()
        return self.commit(body, "loop:" + form, [] if form == "inplace" else [name])

    def s_kwargs(self):
        """A helper called with keyword arguments, *args and **kwargs."""
        a = self.value()
        if a is None:
            return False
        h, name = self.fresh("h"), self.fresh()
        body = [f"def {h}(*args, scale=1.0, **kw):", "    return sum(args) * scale + kw.get('shift', 0)",
                f"{name} = {h}({a}, {a}, scale={self.number()}, **{{'shift': {self.number()}}})"]
        return self.commit(body, "helper:kwargs", [name])

    def s_helper(self):
        """A nested function, lambda or comprehension (closures over the function's locals)."""
        a = self.value()
        if a is None:
            return False
        h, name = self.fresh("h"), self.fresh()
        form = self.pick(["def", "default", "lambda", "listcomp", "closure"])
        body = {
            "def": lambda: [f"def {h}(u):", f"    return {self.fill(self.pick(UNARY), a, 'u')} * {self.number()}",
                            f"{name} = {h}({a})"],
            "default": lambda: [f"def {h}(u, v={self.number()}):", "    return u * v + 1",
                                f"{name} = {h}({a}) + {h}({a}, v=2)"],
            "lambda": lambda: [f"{h} = lambda u: {self.fill(self.pick(UNARY), a, 'u')}",
                               f"{name} = {h}({a}) + {h}({a} * 2)"],
            "listcomp": lambda: [f"{name} = sum([{a} * c for c in (1.0, {self.number()}, 3)])"],
            "closure": lambda: [f"def {h}(u):", f"    return u + {a} * {self.number()}", f"{name} = {h}({h}({a}))"],
        }[form]()
        return self.commit(body, "helper:" + form, [name])

    def s_global_fn(self):
        """A call of a module-level helper function, which is sometimes swapped for another between calls."""
        a = self.value()
        if a is None:
            return False
        if "helper" not in self.ns:
            self.ensure_global("helper", "def helper(u, k=2.0):\n    return torch.tanh(u) * k\n", "global-fn")
            self.ensure_global("other", "def other(u, k=2.0):\n    return torch.sigmoid(u) - k\n", "global-fn")
            self.maybe_mutate("helper = other", "global-fn", decl="helper")
        name = self.fresh()
        return self.commit([f"{name} = helper({a}, {self.number()})"], "global-fn", [name])

    def s_side(self):
        """A side effect the driver counts: appends to LOG, counters in STATE, COUNT or CFG (not often:
        most of them make the whole program fall back)."""
        a = self.value()
        if a is None or not self.chance(4):
            return self.s_inplace()
        form = self.pick(["append", "state", "global", "attr", "append-tensor", "self", "cache"])
        self.ensure_global("LOG", "LOG = []", "state:log")
        if form == "state":
            self.ensure_global("STATE", "STATE = {'calls': 0}", "state:dict")
            return self.commit(["STATE['calls'] += 1"], "side:dict")
        if form == "global":
            self.ensure_global("COUNT", "COUNT = 0", "state:count")
            self.decls.add("COUNT")
            return self.commit(["COUNT += 1"], "side:global")
        if form == "attr":
            self.cfg_attr("count", "0", ["0"])
            return self.commit(["CFG.count += 1"], "side:attr")
        if form == "cache":  # a tensor attribute grown each call and read back (a KV cache's write-back)
            self.cfg_attr("kv", "torch.zeros(0)", ["torch.zeros(0)", "torch.ones(3)"])
            name = self.fresh()
            return self.commit([f"CFG.kv = torch.cat([CFG.kv, {a}.detach().reshape(-1)[:2].float()])",
                                f"{name} = {a} + CFG.kv.sum()"], "side:write-back", [name])
        if form == "self" and self.module:
            self.add_init("self.calls = 0")
            return self.commit(["self.calls += 1"], "side:module-attr")
        if form == "append-tensor":
            return self.commit([f"LOG.append({a}.sum())"], "side:append")
        return self.commit([f"LOG.append({a}.dim())"], "side:append")

    def s_module(self):
        """A submodule call or module state (module programs only)."""
        if not self.module:
            return self.s_binary()
        kind = self.pick(["linear", "layernorm", "seq", "layers", "sub", "conv", "buffer", "batchnorm", "param"])
        return getattr(self, "m_" + kind)()

    def submodule(self, ctor, tag, pred=lambda t: t.dim() >= 1 and t.is_floating_point(), params=True):
        """self.<new> = ctor(value); tN = self.<new>(value). Returns the attribute name, or None."""
        a = self.value(pred)
        if a is None:
            return None
        attr = self.fresh(tag)
        if not self.add_init(f"self.{attr} = {ctor(self.ns[a])}"):
            return None
        name = self.fresh()
        if not self.commit([f"{name} = self.{attr}({a})"], "module:" + tag, [name]):
            return None
        if params and self.chance(3):
            self.maybe_mutate(f"target.{attr}.{self.pick(['weight', 'bias'])}.mul_(0.5)", "parameter")
        return attr

    def m_linear(self):
        """nn.Linear on the last dim."""
        return self.submodule(lambda t: f"nn.Linear({t.shape[-1]}, {self.pick([4, 3, 1, 7])})", "lin")

    def m_layernorm(self):
        """nn.LayerNorm over the last dim (of two elements or more: see expr_stmt)."""
        return self.submodule(lambda t: f"nn.LayerNorm({t.shape[-1]})", "ln",
                              pred=lambda t: t.dim() >= 1 and t.is_floating_point() and t.shape[-1] >= 2)

    def m_seq(self):
        """nn.Sequential(Linear, ReLU, Linear)."""
        return self.submodule(lambda t: f"nn.Sequential(nn.Linear({t.shape[-1]}, 4), nn.ReLU(), nn.Linear(4, 3))",
                              "seq", params=False)

    def m_layers(self):
        """A loop over an nn.ModuleList."""
        a = self.value(lambda t: t.dim() >= 1 and t.is_floating_point())
        if a is None:
            return None
        attr, name = self.fresh("layers"), self.fresh()
        d = self.ns[a].shape[-1]
        if not self.add_init(f"self.{attr} = nn.ModuleList([nn.Linear({d}, {d}) for _ in range(2)])"):
            return None
        return self.commit([f"{name} = {a}", f"for layer in self.{attr}:", f"    {name} = torch.relu(layer({name}))"],
                           "module:layers", [name])

    def m_sub(self):
        """A user-defined submodule with its own forward and a Python attribute."""
        if not self.has_sub:
            self.run(SUB_CLASS)
            self.has_sub = True
        attr = self.submodule(lambda t: f"Sub({t.shape[-1]})", "sub", params=False)
        if attr:
            self.maybe_mutate(f"target.{attr}.gain = 2.0", "submodule-attr")
        return attr

    def m_conv(self):
        """nn.Conv2d on a 4-D value (a new input if there is none)."""
        if self.value(lambda t: t.dim() == 4 and t.is_floating_point()) is None:
            self.add_input((2, self.pick([3, 1]), self.pick([5, 4, 1]), self.pick([5, 7])))
        return self.submodule(lambda t: f"nn.Conv2d({t.shape[1]}, {self.pick([2, 4])}, 3, padding=1)", "conv",
                              pred=lambda t: t.dim() == 4 and t.is_floating_point())

    def m_batchnorm(self):
        """nn.BatchNorm1d (train mode updates its running statistics)."""
        attr = self.submodule(lambda t: f"nn.BatchNorm1d({t.shape[1]})", "bn",
                              pred=lambda t: t.dim() in (2, 3) and t.is_floating_point() and t.shape[0] > 1)
        if attr:
            self.maybe_mutate("target.eval()", "training")
        return attr

    def m_buffer(self):
        """A buffer updated in place every call (like running statistics), then read."""
        a = self.value(lambda t: t.is_floating_point())
        if a is None:
            return False
        buf, name = self.fresh("buf"), self.fresh()
        shape = tuple(self.ns[a].shape)
        if not self.add_init(f"self.register_buffer('{buf}', torch.zeros({shape}, dtype={self.ns[a].dtype}))"):
            return False
        return self.commit([f"self.{buf}.mul_(0.5).add_({a})", f"{name} = self.{buf} * 2"], "module:buffer", [name])

    def m_param(self):
        """A parameter used directly (self.p * x)."""
        a = self.value(lambda t: t.is_floating_point())
        if a is None:
            return False
        p, name = self.fresh("p"), self.fresh()
        shape = tuple(self.ns[a].shape[-1:])
        if not self.add_init(f"self.{p} = nn.Parameter(torch.ones({shape}, dtype={self.ns[a].dtype}) * 0.5)"):
            return False
        self.maybe_mutate(f"target.{p}.add_(1)", "parameter")
        return self.commit([f"{name} = {a} * self.{p}"], "module:param", [name])

    def s_error(self):
        """A statement that raises on some calls (on purpose; rarely, else a unary op)."""
        a = self.value()
        if a is None or not self.chance(1):
            return self.s_unary()
        form = self.pick(["flag", "data", "assert", "index", "reshape"])
        if form == "flag":
            self.cfg_attr("fail", "False", ["True"])
            return self.commit(["if CFG.fail:", "    raise ValueError('requested failure')"], "raises:flag")
        if form == "data":
            return self.commit([f"if {a}.sum() > 0:", "    raise RuntimeError('positive sum')"], "raises:data",
                               check=[f"__c = bool({a}.sum() > 0)"])
        self.raising = True
        self.tags.add("raises:" + form)
        self.body.append({"assert": f"assert {a}.dim() == 99, 'rank'", "index": f"{a}.flatten()[10000]",
                          "reshape": f"{a}.reshape(-1, 10007)"}[form])
        return True

    def s_stitched(self):
        """State that lives across a call dynamo cannot record (x.tolist(): a stitch): an iterator
        of some kind, a generator, a loop's own iterator; next() on both sides of it."""
        a = self.value(lambda t: t.is_floating_point() and 0 < t.numel() <= 64)
        if a is None:
            return self.s_unary()
        name, it = self.fresh(), self.fresh("it")
        opaque = f"_ = len({a}.tolist())"
        form = self.pick(["tuple", "range", "list", "enumerate", "zip", "generator", "loop", "comprehension"])
        body = {
            "tuple": [f"{it} = iter((1.0, 2.0, 3.0, 4.0, 5.0))", f"{name} = {a} + next({it})", opaque,
                      f"{name} = {name} * next({it}) + next({it})"],
            "range": [f"{it} = iter(range(1, 9, 2))", f"{name} = {a} * next({it})", opaque,
                      f"{name} = {name} + sum({it})"],
            "list": [f"{it} = iter([{a}, {a} * 2, {a} - 1])", f"{name} = next({it})", opaque,
                     f"{name} = {name} + next({it}) * next({it})"],
            "enumerate": [f"{it} = enumerate((0.5, 1.5, 2.5))", "i, c = next(" + it + ")", f"{name} = {a} * c + i",
                          opaque, f"for i, c in {it}:", f"    {name} = {name} + c * i"],
            "zip": [f"{it} = zip((1, 2, 3), (0.5, 0.25, 2.0))", "p, q = next(" + it + ")", f"{name} = {a} * p + q",
                    opaque, f"for p, q in {it}:", f"    {name} = {name} * q + p"],
            "generator": [f"{it} = (c * 2 for c in (1.0, 2.0, 3.0))", f"{name} = {a} + next({it})", opaque,
                          f"{name} = {name} + sum({it})"],
            "loop": [f"{name} = {a}", "for k in (1, 2, 3):", f"    {name} = {name} + k", "    if k == 2:",
                     f"        _ = len({name}.tolist())"],
            "comprehension": [f"{name} = sum([{a} * len({a}.tolist()) * c for c in (1.0, 0.5)])"],
        }[form]
        return self.commit(body, "stitch:" + form, [name])

    def s_pyarg(self):
        """A Python object argument that changes between calls: a slice, range, functools.partial,
        dataclass, named tuple or enum member."""
        a = self.value(lambda t: t.dim() >= 1 and t.shape[0] >= 3 and t.is_floating_point())
        if a is None:
            return self.s_binary()
        form = self.pick(["slice", "range", "partial", "dataclass", "namedtuple", "enum"])
        need = {"partial": ("functools", "import functools"),
                "dataclass": ("DC", "import dataclasses\n@dataclasses.dataclass\nclass DC:\n    scale: float\n"
                                    "    shift: float\n"),
                "namedtuple": ("NT", "import collections\nNT = collections.namedtuple('NT', 'scale shift')"),
                "enum": ("MODE", "import enum\nclass MODE(enum.Enum):\n    A = 1\n    B = 2\n")}.get(form)
        if need:
            self.ensure_global(need[0], need[1], "state:" + form)
        arg = f"x{len(self.input_names)}"
        make = {"slice": f"{arg} = slice(seed % 2, 2 + seed % 2)", "range": f"{arg} = range(1 + seed % 3)",
                "partial": f"{arg} = functools.partial(torch.mul, other=1.0 + seed % 3)",
                "dataclass": f"{arg} = DC(1.0 + seed % 2, 0.5 * (seed % 3))",
                "namedtuple": f"{arg} = NT(1.0 + seed % 2, 0.5 * (seed % 3))",
                "enum": f"{arg} = MODE.A if seed % 3 else MODE.B"}[form]
        self.ns["seed"] = 0
        if not self.run(make):
            return False
        name = self.fresh()
        use = {"slice": f"{name} = {a}[{arg}] * 2", "range": f"{name} = sum([{a} * i for i in {arg}], {a} * 0)",
               "partial": f"{name} = {arg}({a})", "dataclass": f"{name} = {a} * {arg}.scale + {arg}.shift",
               "namedtuple": f"{name} = {a} * {arg}.scale + {arg}.shift",
               "enum": f"{name} = ({a} + 1) if {arg} is MODE.A else ({a} - 1)"}[form]
        if not self.run(use):
            return False
        self.inputs.append(make)
        self.input_names.append(arg)
        self.tags.add("input:" + form)
        return self.commit([use], "pyarg:" + form, [name])

    def s_rebound(self):
        """A function or number held by a module object or a class, rebound between calls."""
        a = self.value(lambda t: t.is_floating_point())
        if a is None:
            return self.s_unary()
        name = self.fresh()
        if self.chance(5):
            self.ensure_global("MODCFG", "import types\nMODCFG = types.ModuleType('modcfg')\nMODCFG.ACT = torch.relu\n"
                                         "MODCFG.K = 2.0", "state:module")
            self.maybe_mutate(f"MODCFG.ACT = {self.pick(['torch.tanh', 'torch.sigmoid', 'torch.relu'])}", "module-attr")
            self.maybe_mutate(f"MODCFG.K = {self.pick(VALUES)}", "module-attr")
            return self.commit([f"{name} = MODCFG.ACT({a}) * MODCFG.K"], "rebound:module", [name])
        self.ensure_cfg()
        if "KLASS" not in self.ns:
            self.ensure_global("KLASS", "KLASS = 1\nCfg.ACT = staticmethod(torch.relu)\nCfg.K = 2.0", "state:class")
            self.maybe_mutate(f"Cfg.ACT = staticmethod({self.pick(['torch.tanh', 'torch.sigmoid'])})", "class-attr")
            self.maybe_mutate(f"Cfg.K = {self.pick(VALUES)}", "class-attr")
        return self.commit([f"{name} = CFG.ACT({a}) + Cfg.K"], "rebound:class", [name])

    def s_with(self):
        """Recorded work inside a with block: no_grad, enable_grad, inference_mode, autocast, or a
        context manager of the program's that logs its enter and exit."""
        a = self.value(lambda t: t.is_floating_point())
        if a is None:
            return self.s_unary()
        form = self.pick(["no_grad", "enable_grad", "inference_mode", "autocast", "user"])
        if form == "user":
            self.ensure_global("LOG", "LOG = []", "state:log")
            self.ensure_global("CTX", "class CTX:\n    def __enter__(self):\n        LOG.append(1)\n        return self\n"
                                      "    def __exit__(self, *exc):\n        LOG.append(2)\n        return False\n",
                               "state:ctx")
        ctx = {"no_grad": "torch.no_grad()", "enable_grad": "torch.enable_grad()",
               "inference_mode": "torch.inference_mode()", "user": "CTX()",
               "autocast": "torch.autocast('cpu', dtype=torch.bfloat16)"}[form]
        name = self.fresh()
        return self.commit([f"with {ctx}:", f"    {name} = {self.fill(self.pick(UNARY), a)}"], "with:" + form, [name])

    def s_python(self):
        """Python's own semantics around a tensor value: a generator closed, thrown into or dropped
        unfinished inside its try/finally (also with the list or dict that held it), an exception chain read back, an object of a class
        with its own __new__ (a named tuple made in the call, a tuple subclass), the identity of
        an in-place op's result, torch.cond. Each result folds what Python did into a tensor."""
        a = self.value(lambda t: t.is_floating_point() and t.numel() > 0)
        if a is None or not self.chance(3):  # (rarer than the tensor statements: most of these stitch)
            return self.s_unary()
        form = self.pick(["gen_close", "gen_drop", "gen_throw", "gen_list_drop", "gen_dict_clear", "chain", "cause",
                          "namedtuple", "new_tuple", "identity", "cond"])
        name = self.fresh()
        if form.startswith("gen_"):
            self.ensure_global("LOG", "LOG = []", "state:log")
            self.ensure_global("GEN", "def GEN(v):\n    try:\n        yield v * 2\n        yield v + 1\n"
                                      "    except KeyError:\n        yield v - 3\n    finally:\n        LOG.append(1)\n",
                               "state:gen")
        it = self.fresh("it")
        body = {
            "gen_close": [f"{it} = GEN({a})", f"{name} = next({it})", f"{it}.close()",
                          f"{name} = {name} + len(LOG) + next({it}, 0.5)"],
            "gen_drop": [f"{it} = GEN({a})", f"{name} = next({it})", f"del {it}", f"{name} = {name} * (len(LOG) + 1)"],
            "gen_throw": [f"{it} = GEN({a})", f"{name} = next({it})", f"{name} = {name} + {it}.throw(KeyError('k'))"],
            "gen_list_drop": [f"{it} = [GEN({a}), 1]", f"{name} = next({it}[0])", f"del {it}",
                              f"{name} = {name} * (len(LOG) + 1)"],
            "gen_dict_clear": [f"{it} = {{'g': GEN({a})}}", f"{name} = next({it}['g'])", f"{it}.clear()",
                               f"{name} = {name} - len(LOG)"],
            "chain": ["try:", "    try:", "        raise ValueError(3)", "    except ValueError:", "        {}['k']",
                      "except KeyError as __e:", f"    {name} = {a} * __e.__context__.args[0]"],
            "cause": ["try:", "    try:", "        raise ValueError(2)", "    except ValueError as __v:",
                      "        raise TypeError(5) from __v", "except TypeError as __e:",
                      f"    {name} = {a} * __e.__cause__.args[0] + __e.__suppress_context__"],
            "namedtuple": ["__P = __import__('collections').namedtuple('__P', 'u w')", f"__p = __P({a}, 2.0)",
                           f"{name} = __P(__p.u * __p[1], __p.w)[0]"],
            "new_tuple": ["class __T(tuple):", "    def __new__(cls, u, w):", "        return super().__new__(cls, (u, w))",
                          f"__t = __T({a}, 3.0)", f"{name} = __t[0] * __t[1] + len(__t)"],
            "identity": [f"{name} = {a} * 1", f"__y = {name}.add_(1)", f"__z = torch.Tensor.mul_(__y, 2)",
                         f"{name} = {name} + (__y is {name}) + 2 * (__z is {name})"],
            "cond": [f"{name} = torch.cond({a}.sum() > 0, lambda __u: __u + 1, lambda __u: __u * 2, ({a},))"],
        }[form]
        return self.commit(body, "python:" + form, [name])

    STATEMENTS = ["unary", "binary", "reduce", "view", "binary", "matmul", "inplace", "setitem", "branch", "loop",
                  "helper", "cat", "module", "module", "side", "error", "global_fn", "kwargs", "unary", "reduce",
                  "stitched", "pyarg", "rebound", "with", "python"]

    def statements(self):
        """Draws the body's statements."""
        for _ in range(self.draw(st.integers(1, MAX_STATEMENTS))):
            kind = self.pick(self.STATEMENTS)
            getattr(self, "s_" + kind)()
            if self.raising:
                return

    def return_expr(self):
        """Source of the returned value: one to three live values in a container (one value if that fails)."""
        picks = [self.value() for _ in range(3)]
        expr = self.pick(RETURNS).format(*picks)
        return expr if self.run(f"__r = {expr}") else picks[0]

    # -- assembling the source --------------------------------------------------------------

    def source(self):
        """The whole program's text."""
        ret = self.return_expr()
        body = ([f"global {', '.join(sorted(self.decls))}"] if self.decls else []) + self.body + [f"return {ret}"]
        names, keywords = self.input_names, []
        if len(names) >= 2 and self.chance(3):
            # the last inputs passed by keyword into **kw and read out of it, as wrappers and
            # Hugging Face's forwards do
            keywords = names[len(names) - self.draw(st.integers(1, len(names) - 1)):]
            names = names[:len(names) - len(keywords)] + ["**kw"]
            body = [self.pick(KEYWORD_READS).format(n) for n in keywords] + body
            self.tags.add("input:kwargs")
        args = ", ".join(names)
        parts = [HEADER] + self.globals + ([f"KEYWORDS = {tuple(keywords)!r}"] if keywords else []) + \
            ["", self.make_inputs_src(), "", self.build_src(args, body), "", self.mutate_src()]
        return "\n".join(parts)

    def make_inputs_src(self):
        """def make_inputs(seed): ..."""
        lines = ["def make_inputs(seed):", "    g = torch.Generator().manual_seed(seed)"]
        lines += indent(self.inputs, 1)
        lines.append(f"    return ({''.join(n + ', ' for n in self.input_names)})")
        return "\n".join(lines)

    def build_src(self, args, body):
        """def build(): the closure state, the function or module class, setters; returns the target."""
        lines = ["def build():"] + indent(self.closure, 1)
        if self.module:
            if self.has_sub:
                lines += indent(SUB_CLASS.splitlines(), 1)
            lines += indent(["class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
                            + indent(self.init, 2) + ["", f"    def forward(self, {args}):"] + indent(body, 2), 1)
            lines.append("    target = Model()")
        else:
            lines += indent([f"def fn({args}):"] + indent(body, 1), 1)
            lines.append("    target = fn")
        for name in self.setters:
            lines += indent([f"def set_{name}(v):", f"    nonlocal {name}", f"    {name} = v"], 1)
        lines.append(f"    target.fuzz_set = {{{', '.join(f'{n!r}: set_{n}' for n in self.setters)}}}")
        lines.append(f"    target.fuzz_cells = {{{', '.join(f'{n!r}: {n}' for n in self.cells)}}}")
        lines.append("    return target")
        return "\n".join(lines)

    def mutate_src(self):
        """def mutate(call, target): the changes before each call."""
        lines = ["def mutate(call, target):"]
        decls = sorted({d for _, _, d in self.mutations if d})
        if decls:
            lines.append(f"    global {', '.join(decls)}")
        for call in range(1, CALLS):
            todo = [line for c, line, _ in self.mutations if c == call]
            if todo:
                lines += [f"    if call == {call}:"] + indent(todo, 2)
        if len(lines) == 1:
            lines.append("    pass")
        return "\n".join(lines)


def input_expr(shape, dtype, layout):
    """Source (with a {g} field for the generator) of an input tensor of shape/dtype/layout."""
    shape = tuple(shape)
    base, view = list(shape), ""
    if layout == "transposed" and len(shape) >= 2:
        base[-1], base[-2] = shape[-2], shape[-1]
        view = ".transpose(-1, -2)"
    elif layout == "sliced" and shape:
        base[-1] = shape[-1] * 2
        view = "[..., ::2]"
    elif layout == "expanded" and shape:
        base[0] = 1
        view = f".expand({', '.join(map(str, shape))})"
    elif layout == "offset" and shape:
        base[0] = shape[0] + 1
        view = "[1:]"
    dims = ", ".join(map(str, base)) + ("," if len(base) == 1 else "")
    if layout == "varying" and shape:  # the first dimension grows by one on odd calls
        dims = ", ".join([f"{base[0]} + seed % 2"] + list(map(str, base[1:]))) + ("," if len(base) == 1 else "")
    if layout == "growing" and shape:  # the first dimension one longer at every call (a decode cache)
        dims = ", ".join([f"{base[0]} + seed"] + list(map(str, base[1:]))) + ("," if len(base) == 1 else "")
    if layout == "restrided" and len(shape) >= 2:  # the same values, column-major on odd calls
        flip = "(lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2) if seed % 2 else t)"
        return f"{flip}({make_expr(dims, dtype)})"
    if layout == "retyped" and dtype == "float32":  # float64 on odd calls
        return f"{make_expr(dims, dtype)}.to(torch.float64 if seed % 2 else torch.float32)"
    if layout == "reranked":  # one more leading dim on odd calls (eager may raise on those: compared too)
        return f"(lambda t: t.unsqueeze(0) if seed % 2 else t)({make_expr(dims, dtype)})"
    return make_expr(dims, dtype) + view


def make_expr(dims, dtype):
    """Source (with a {g} field) of a fresh contiguous tensor of the given dims text and dtype."""
    return {"float32": f"torch.randn(({dims}), generator={{g}})",
            "float64": f"torch.randn(({dims}), generator={{g}}, dtype=torch.float64)",
            "float16": f"torch.randn(({dims}), generator={{g}}).half()",
            "bfloat16": f"torch.randn(({dims}), generator={{g}}).bfloat16()",  # (a matmul's weight for a bf16 value)
            "int64": f"torch.randint(-4, 5, ({dims}), generator={{g}})",
            "bool": f"(torch.randn(({dims}), generator={{g}}) > 0)"}[dtype]


def dtype_name(dtype):
    """'float32' for torch.float32, etc."""
    return str(dtype).replace("torch.", "")


def broadcasts(s1, s2):
    """Whether shapes s1 and s2 broadcast together."""
    try:
        torch.broadcast_shapes(s1, s2)
        return True
    except RuntimeError:
        return False


def kind_of(name):
    """What a value name is: an input, a global tensor, a captured tensor or a temporary."""
    return {"x": "input", "G": "global", "w": "closure"}.get(name[0], "temporary")


def is_compound(lines):
    """Whether a statement is a compound one (not kept when it fails: it may not fail on every call)."""
    return any(line.startswith(("if ", "for ", "while ", "def ", "with ")) for line in lines)


def initial_inputs(b):
    """One to three inputs of random rank, dtype and layout."""
    for _ in range(b.draw(st.integers(1, 3))):
        rank = b.draw(st.integers(0, 4)) if b.chance(8) else 2
        rank = 2 if rank == 0 and b.chance(5) else rank
        b.add_input(b.shape(rank), b.dtype())


@st.composite
def programs(draw, module=None):
    """A random program (a function, or an nn.Module with module=True/None)."""
    is_module = draw(st.integers(0, 9)) >= 7 if module is None else module
    b = Builder(draw, is_module)
    initial_inputs(b)
    b.statements()
    b.tags.add("module" if is_module else "function")
    if b.chance(5):  # side traces compiled after one exit (dynamo's default is 8, more than CALLS)
        b.globals.append("DYNAMO_CONFIG = {'hotexit': 1}")
        b.tags.add("config:hotexit=1")
    return Program(b.source(), b.tags, is_module)
