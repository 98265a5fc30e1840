"""Program fuzzer driver: random programs (gen.py) run eagerly and through dynamo.optimize, compared call by call.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python tests/fuzz_programs/run.py \\
        [--programs N] [--seed S] [--save DIR] [--stop-on-first] [--module|--function] [--time-limit SECONDS]
        [--no-shrink] [--no-fork] [--max-classes-per-kind K]

Each program runs gen.CALLS times eagerly and compiled (each from its own copy of the program's source, so
globals, closures and modules are separate), with the program's state mutations between calls, under
torch.no_grad(). Compared after every call: outputs (values, dtypes, shapes), the inputs (in-place
writes), the program's state (UPPER-CASE globals, CFG attributes, captured tensors, module state and
attributes) and its side-effect counts; exceptions by type; at the end, every earlier result again.
Programs run in a forked worker process, so a crash or a hang is a failure like any other.
A failure of a new class is shrunk by hypothesis, then lines are deleted while it persists; a later
failure of the same kind whose program has every feature of a shrunk one is counted in that class.
"""
import argparse
import enum
import faulthandler
import functools
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402

import dynamo  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2), torch.float32: (1e-4, 1e-3),
              torch.float64: (1e-7, 1e-9), torch.complex64: (1e-4, 1e-5)}
# Results of programs that compute in lower precision somewhere carry its rounding: float64 results
# after float32 math (a float32 exp, then .double()) get float32's tolerance; any float result of a
# program with float16 values gets float16's (fused kernels need not round every float16 step).
MIXED = {**TOLERANCES, torch.float64: TOLERANCES[torch.float32]}
HALF = {dt: TOLERANCES[torch.float16] for dt in TOLERANCES}
LOW_PRECISION = ("float32", "float16", ".float()", ".half()", "nn.", "torch.zeros(", "torch.ones(")
HANG_SECONDS = 120


class Failure:
    """How a compiled program differed from eager: a kind, details, the call, and a key for its class."""

    def __init__(self, kind, detail, call, extra=""):
        """kind and extra make the key; detail says what differed; call is the call index (-1: none)."""
        self.kind, self.detail, self.call, self.extra = kind, detail, call, extra

    @property
    def key(self):
        """What identifies the class of this failure (with the program's features)."""
        return f"{self.kind}{': ' + self.extra if self.extra else ''}"

    def __str__(self):
        """One line (plus details) for the report."""
        return f"{self.key} (call {self.call}): {self.detail}"


class FuzzFailure(Exception):
    """Raised in the hypothesis test so that hypothesis shrinks the program."""

    def __init__(self, prog, failure):
        """The program and its Failure."""
        super().__init__(str(failure))
        self.prog, self.failure = prog, failure


class Outcome:
    """What running one program gave: a failure (or None), whether native code ran, why it fell back."""

    def __init__(self, failure, native, fallback, prog=None):
        """failure: a Failure or None; native: native code ran; fallback: why not, if it did not."""
        self.failure, self.native, self.fallback, self.prog = failure, native, fallback, prog


# -- comparing -------------------------------------------------------------------------------

def tolerances(source):
    """The (rtol, atol) table for a program, by the lowest float precision it computes in."""
    if "float16" in source or ".half()" in source:
        return HALF
    low = any(word in source for word in LOW_PRECISION) or any(
        "randn(" in line and "float64" not in line and "> 0)" not in line for line in source.splitlines())
    return MIXED if low else TOLERANCES


def diff(a, b, path="result", tol=TOLERANCES):
    """None when a (compiled) equals b (eager) structurally and numerically, else a description."""
    if isinstance(b, torch.Tensor):
        return diff_tensor(a, b, path, tol)
    if isinstance(b, (tuple, list)):
        if not same_class(a, b) or len(a) != len(b):
            return f"{path}: {type(a).__name__} of {len_or(a)} vs eager {type(b).__name__} of {len(b)}"
        return first(diff(x, y, f"{path}[{i}]", tol) for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(b, dict):
        if type(a) is not dict or list(a) != list(b):
            return f"{path}: keys {list(a) if isinstance(a, dict) else type(a).__name__} vs eager {list(b)}"
        return first(diff(a[k], b[k], f"{path}[{k!r}]", tol) for k in b)
    if not same_class(a, b):
        return f"{path}: {type(a).__name__} {a!r} vs eager {type(b).__name__} {b!r}"
    if isinstance(b, float) and math.isnan(b) and math.isnan(a):
        return None
    if isinstance(b, functools.partial):  # (each side's partial object is its own)
        return diff((a.func, a.args, a.keywords), (b.func, b.args, b.keywords), path, tol)
    if type(a) is not type(b):  # the program's own class, defined once per copy of the program
        if isinstance(b, enum.Enum):
            return None if a.name == b.name else f"{path}: {a!r} vs eager {b!r}"
        if hasattr(b, "__dict__"):
            return diff(vars(a), vars(b), path, tol)
    return None if a == b else f"{path}: {a!r} vs eager {b!r}"


def same_class(a, b):
    """Whether a and b are of one class, or of the class of one name in the two copies of a
    program (each copy defines its own dataclasses, named tuples and enums)."""
    ta, tb = type(a), type(b)
    return ta is tb or (ta.__qualname__ == tb.__qualname__ and ta.__module__ == tb.__module__ == "fuzz_program")


def diff_tensor(a, b, path, tol):
    """diff() for an eager tensor b."""
    if not isinstance(a, torch.Tensor):
        return f"{path}: {type(a).__name__} vs eager tensor"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{path}: {a.dtype}{list(a.shape)} vs eager {b.dtype}{list(b.shape)}"
    if b.is_floating_point() or b.is_complex():
        rtol, atol = tol.get(b.dtype, (1e-4, 1e-5))
        a64, b64 = a.double(), b.double()
        finite = b64[torch.isfinite(b64)]
        scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
        if torch.allclose(a64, b64, rtol=rtol, atol=atol * scale, equal_nan=True):
            return None
        bad = ~torch.isclose(a64, b64, rtol=rtol, atol=atol * scale, equal_nan=True)
    else:
        if torch.equal(a, b):
            return None
        bad = a != b
    i = tuple(int(v) for v in bad.nonzero()[0]) if bad.dim() else ()
    return (f"{path}: {b.dtype}{list(b.shape)} differs at {int(bad.sum())} element(s), e.g. [{', '.join(map(str, i))}]: "
            f"{a[i].item()!r} vs eager {b[i].item()!r}")


def first(items):
    """The first item that is not None, or None."""
    return next((x for x in items if x is not None), None)


def len_or(v):
    """len(v), or '?' for things without one."""
    try:
        return len(v)
    except TypeError:
        return "?"


def observe(ns, target):
    """The program's state outside its arguments and result: what the driver compares after each call."""
    state = {}
    for k, v in ns.items():
        if k.isupper() and isinstance(v, (list, dict, int, float, bool, torch.Tensor)):
            state[k] = v
        elif k == "CFG":
            state[k] = {a: x for a, x in vars(v).items()}
    state["cells"] = dict(getattr(target, "fuzz_cells", {}))
    if isinstance(target, torch.nn.Module):
        state["module"] = dict(target.state_dict())
        state["module attrs"] = {k: v for k, v in vars(target).items()
                                 if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
    return state


def side_effect_counts(state):
    """The side-effect counters in an observed state (LOG length, STATE, COUNT, CFG.count, self.calls)."""
    return {"LOG": len(state.get("LOG", ())), "STATE": state.get("STATE"), "COUNT": state.get("COUNT"),
            "CFG.count": state.get("CFG", {}).get("count"), "self.calls": state.get("module attrs", {}).get("calls")}


# -- running one program ----------------------------------------------------------------------

def instantiate(prog):
    """(namespace, target) of a fresh copy of the program: its module-level state and build()'s result."""
    ns = {"__name__": "fuzz_program"}
    exec(compile(prog.source, "<fuzz-program>", "exec"), ns)  # noqa: S102 -- generated by gen.py
    torch.manual_seed(1234)  # module parameters: the same in both copies
    return ns, ns["build"]()


def attempt(fn, args, keywords=()):
    """(result, None) or (None, the exception fn raised). The last len(keywords) arguments are
    passed by keyword, under those names (the program's KEYWORDS)."""
    try:
        if keywords:
            n = len(args) - len(keywords)
            return fn(*args[:n], **dict(zip(keywords, args[n:]))), None
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 -- any exception is compared with eager's
        # The frames' locals go now: a generator the call left suspended is collected (its
        # finally runs) here on both sides, not whenever the traceback happens to be dropped
        # (CPython keeps the caller's frame alive through it; dynamo's traceback has none).
        traceback.clear_frames(e.__traceback__)
        return None, e


def where_raised(e):
    """file:function of the innermost frame of e's traceback inside dynamo (or the program)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "dynamo" in f.filename] or frames[-1:]
    return f"{os.path.basename(ours[-1].filename)}:{ours[-1].name}" if ours else "?"


def compare_exceptions(got_err, want_err, call):
    """A Failure if the compiled call raised differently from eager, else None."""
    if want_err is None:
        return Failure("leaked exception", f"{type(got_err).__name__}: {got_err}\n"
                       + "".join(traceback.format_exception(got_err)[-6:]), call,
                       f"{type(got_err).__name__} at {where_raised(got_err)}")
    if got_err is None:
        return Failure("missing exception", f"eager raised {type(want_err).__name__}: {want_err}", call,
                       type(want_err).__name__)
    if type(got_err) is not type(want_err):
        return Failure("wrong exception type", f"{type(got_err).__name__}: {got_err} vs eager "
                       f"{type(want_err).__name__}: {want_err}", call,
                       f"{type(got_err).__name__} for {type(want_err).__name__}")
    return None


def compare_call(call, got, want, inputs, state, tol=TOLERANCES):
    """The first difference after one call: (got, want) results or exceptions, inputs and state pairs."""
    (g, g_err), (w, w_err) = got, want
    if g_err is not None or w_err is not None:
        f = compare_exceptions(g_err, w_err, call)
        if f is not None:
            return f
    else:
        d = diff(g, w, tol=tol)
        if d is not None:
            return Failure("wrong result", d, call)
    d = diff(*inputs, path="inputs", tol=tol)
    if d is not None:
        return Failure("wrong input mutation", d, call)
    counts = diff(side_effect_counts(state[0]), side_effect_counts(state[1]), "side effects")
    if counts is not None:
        return Failure("wrong side-effect count", counts, call)
    d = diff(*state, path="state", tol=tol)
    return Failure("wrong state", d, call) if d is not None else None


def fallback_reason(opt):
    """Why an optimized function ran no native code (its last abort or disable reason)."""
    f = opt.forward if isinstance(opt, torch.nn.Module) else opt
    reasons = [a.reason for a in getattr(f, "attempts", []) if a.reason] + [getattr(f, "disabled_reason", None)]
    reasons = [r for r in reasons if r]
    return reasons[0][:90] if reasons else "no trace ran natively"


def check_program(prog, calls=gen.CALLS):
    """Runs prog eagerly and compiled for `calls` calls; an Outcome (exceptions outside the calls are failures too)."""
    try:
        return run_program(prog, calls)
    except Exception as e:  # noqa: BLE001 -- optimize(), mutate() or the comparison itself raised
        return Outcome(Failure("exception outside the calls", f"{type(e).__name__}: {e}", -1,
                               f"{type(e).__name__} at {where_raised(e)}"), False, "harness exception")


def run_program(prog, calls):
    """check_program's work (with the program's DYNAMO_CONFIG settings, if any)."""
    dynamo.reset()
    ns_e, eager = instantiate(prog)
    ns_c, target = instantiate(prog)
    saved = {k: getattr(dynamo.config, k) for k in ns_c.get("DYNAMO_CONFIG", {})}
    for k, v in ns_c.get("DYNAMO_CONFIG", {}).items():
        setattr(dynamo.config, k, v)
    try:
        return compare_calls(ns_e, eager, ns_c, target, calls, tolerances(prog.source), prog)
    finally:
        for k, v in saved.items():
            setattr(dynamo.config, k, v)
        dynamo.reset()


class RoundingProbe(torch.overrides.TorchFunctionMode):
    """Watches an eager call for float comparisons that rounding decides: a comparison (>, <, >=,
    <=, ==, !=) whose answer changes when a float operand moves by a relative 1e-4 and an absolute
    1e-5 x (its largest magnitude + 1) -- the margin gen.robust() gives the branch conditions on the
    inputs the program was generated with. (A sum of values that cancel, compared with 0: its sign
    is its rounding error's, and a compiled kernel with an exp or a sum one ulp off picks the other
    branch.)"""

    COMPARISONS = {torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne, torch.Tensor.gt, torch.Tensor.lt,
                   torch.Tensor.ge, torch.Tensor.le, torch.Tensor.eq, torch.Tensor.ne, torch.Tensor.__gt__,
                   torch.Tensor.__lt__, torch.Tensor.__ge__, torch.Tensor.__le__, torch.Tensor.__eq__,
                   torch.Tensor.__ne__}

    def __init__(self):
        super().__init__()
        self.decided_by_rounding = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in self.COMPARISONS and not self.decided_by_rounding and isinstance(out, torch.Tensor):
            for k, a in enumerate(args[:2]):
                if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel()):
                    continue
                scale = float(a.detach().abs().nan_to_num().max()) + 1
                for sign in (1.0, -1.0):
                    moved = list(args)
                    moved[k] = a * (1 + sign * 1e-4) + sign * 1e-5 * scale
                    if not torch.equal(func(*moved, **kwargs), out):
                        self.decided_by_rounding = True
        return out


def decided_by_rounding(prog, call):
    """Whether eager's own run of call `call` (a fresh copy of prog, calls 0..call-1 replayed first)
    hinges on a float comparison within rounding of flipping (RoundingProbe): such a call's result
    cannot be held to eager's."""
    try:
        ns, fn = instantiate(prog)
        probe = RoundingProbe()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for k in range(call + 1):
                ns["mutate"](k, fn)
                args = ns["make_inputs"](k)
                if k < call:
                    attempt(fn, args, ns.get("KEYWORDS", ()))
                else:
                    with probe:
                        attempt(fn, args, ns.get("KEYWORDS", ()))
        return probe.decided_by_rounding
    except Exception:  # noqa: BLE001 -- a replay that fails judges nothing
        return False


def compare_calls(ns_e, eager, ns_c, target, calls, tol, prog=None):
    """Calls eager and compiled copies `calls` times; an Outcome. Results are compared after every call and
    again after the last one (a later native run must not clobber an earlier result). A call whose
    eager run rounding decides (decided_by_rounding) ends the comparison without a verdict on it."""
    opt = dynamo.optimize(target)
    failure, kept = None, []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in range(calls):
            ns_e["mutate"](call, eager)
            ns_c["mutate"](call, target)
            args_e, args_c = ns_e["make_inputs"](call), ns_c["make_inputs"](call)
            want = attempt(eager, args_e, ns_e.get("KEYWORDS", ()))
            got = attempt(opt, args_c, ns_c.get("KEYWORDS", ()))
            failure = compare_call(call, got, want, (args_c, args_e), (observe(ns_c, target), observe(ns_e, eager)),
                                   tol)
            if failure is not None:
                if failure.kind == "wrong result" and prog is not None and decided_by_rounding(prog, call):
                    failure = None
                break
            kept.append((got[0], want[0]))
    failure = failure or recheck(kept, tol)
    native = dynamo.counters()["native_runs"] > 0
    return Outcome(failure, native, None if native else fallback_reason(opt))


def recheck(kept, tol):
    """A Failure if an earlier compiled result no longer equals eager's (a later native run reused its memory).
    Results aliasing inputs or state change alike in both copies, so they still agree."""
    for call, (got, want) in enumerate(kept):
        d = diff(got, want, f"result of call {call}, re-read after the last call", tol)
        if d is not None:
            return Failure("result changed by a later call", d, call)
    return None


def check_source(source, module=None):
    """Runs a reproducer's source (gen's format); the Failure, or None."""
    return check_program(gen.Program(source, (), module)).failure


# -- the worker process (crashes and hangs do not take the fuzzer down) --------------------------

class Worker:
    """A forked child that runs programs (check_program) until it dies; restarted after a crash or hang."""

    def __init__(self, hang_seconds=HANG_SECONDS):
        """A worker that answers within hang_seconds (started on first use)."""
        self.hang_seconds, self.proc, self.conn = hang_seconds, None, None
        self.crash_log = tempfile.NamedTemporaryFile(prefix="fuzz-programs-crash-", suffix=".txt", delete=False).name

    def start(self):
        """Forks the child."""
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=self.serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def serve(self, conn):
        """The child's loop: (source, module) in, Outcome out."""
        torch.set_num_threads(1)  # OpenMP is not fork-safe; the tensors are tiny anyway
        log = open(self.crash_log, "w")
        os.dup2(log.fileno(), 2)  # C++ messages (std::terminate's what()) land in the crash log too
        faulthandler.enable(file=log)
        while True:
            try:
                source, module = conn.recv()
            except EOFError:
                os._exit(0)
            o = check_program(gen.Program(source, (), module))
            f = o.failure and (o.failure.kind, o.failure.detail, o.failure.call, o.failure.extra)
            conn.send((f, o.native, o.fallback))  # plain data: this module may be loaded under another name

    def check(self, prog):
        """The Outcome of prog, run in the child (a crash or a hang is a Failure)."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send((prog.source, prog.module))
        if self.conn.poll(self.hang_seconds):
            try:
                f, native, fallback = self.conn.recv()
                return Outcome(f and Failure(*f), native, fallback)
            except EOFError:
                pass
        else:
            self.proc.kill()
        self.proc.join()
        return Outcome(self.death(), False, "crashed")

    def death(self):
        """The Failure for a child that died (by a signal, or killed after hang_seconds)."""
        code = self.proc.exitcode
        self.proc = None
        if code == -signal.SIGKILL:
            return Failure("hang", f"no answer in {self.hang_seconds} s", -1)
        name = signal.Signals(-code).name if code is not None and code < 0 else f"exit {code}"
        with open(self.crash_log) as f:
            trace = f.read()
        where = [line.split('"')[1].split("/")[-1] + ":" + line.split(" in ")[-1].strip()
                 for line in trace.splitlines() if line.strip().startswith("File") and "dynamo" in line]
        lines = trace.splitlines()
        fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), 0)
        what = [line.strip() for line in lines if "what():" in line][:1]
        innermost = "\n".join(what + lines[fatal:fatal + 8])  # faulthandler prints the innermost frame first
        return Failure("crash", f"{name}\n{innermost}", -1, f"{name} in {where[0] if where else '?'}")

    def stop(self):
        """Ends the child."""
        if self.proc is not None and self.proc.is_alive():
            self.conn.close()
            self.proc.join(5)


# -- the hypothesis loop ---------------------------------------------------------------------

class Known:
    """A shrunk failure class: its key, the shrunk program's features and source, and how often it was seen."""

    def __init__(self, key, prog, failure):
        """A class made from a shrunk program and its failure."""
        self.key, self.tags, self.prog, self.failure, self.seen = key, prog.tags, prog, failure, 1
        self.small = prog  # the program after line reduction

    def covers(self, prog, failure):
        """Whether a failing program belongs to this class (same key, all the features of the shrunk one)."""
        return failure.key == self.key and self.tags <= prog.tags


class Fuzzer:
    """Runs programs through hypothesis; shrinks one new failure class at a time."""

    def __init__(self, args):
        """A fuzzer for the parsed command line."""
        self.args = args
        self.known, self.fallbacks = [], Counter()
        self.programs = self.failures = self.native = 0
        self.target = None  # the key being shrunk in the current batch
        self.first = None   # the (program, failure) that started it
        self.started = time.time()
        self.strategy = gen.programs(module=args.module)
        self.worker = None if args.no_fork else Worker()

    def count(self, outcome):
        """Counts one program of the generation phase."""
        self.programs += 1
        self.native += outcome.native
        if outcome.fallback:
            self.fallbacks[outcome.fallback] += 1
        if self.programs % 100 == 0:
            self.progress()

    def progress(self):
        """A progress line."""
        dt = time.time() - self.started
        print(f"  {self.programs} programs, {self.failures} failures ({len(self.known)} distinct), "
              f"{self.native} native, {self.programs / dt:.1f} programs/s", flush=True)

    def test_one(self, prog):
        """The body of the hypothesis test: run one program; raise FuzzFailure to shrink a new class."""
        save_current(prog, self.args.save)
        outcome = self.worker.check(prog) if self.worker else check_program(prog)
        outcome.prog = prog
        if self.wanted(outcome):
            raise FuzzFailure(prog, outcome.failure)  # one raise site: hypothesis tells failures apart by it

    def wanted(self, outcome):
        """Whether this outcome's failure is to be shrunk (a new class, or the class being shrunk); counts it."""
        f = outcome.failure
        if self.target is not None:  # shrinking (or finishing the batch): only the target class matters
            return f is not None and f.key == self.target
        self.count(outcome)
        if f is None:
            return False
        self.failures += 1
        same_key = [k for k in self.known if k.key == f.key]
        for k in same_key:
            if k.covers(outcome.prog, f) or len(same_key) >= self.args.max_classes_per_kind:
                k.seen += 1
                if self.args.save and k.seen <= 6:  # a few unshrunk members of each class, to audit the grouping
                    save_reproducer(outcome.prog, f, self.args.save, f"class_{self.known.index(k) + 1}_also_{k.seen}")
                return False
        self.target, self.first = f.key, (outcome.prog, f)
        print(f"  new failure class: {f.key}; shrinking ...", flush=True)
        return True

    def batch(self, seed, budget):
        """One hypothesis run of up to budget programs; returns a shrunk (program, failure) or None."""
        self.target = None

        @hypothesis.seed(seed)
        @settings(max_examples=budget, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck),
                  phases=[Phase.generate] if self.args.no_shrink else [Phase.generate, Phase.shrink],
                  report_multiple_bugs=False, verbosity=Verbosity.quiet)
        @given(self.strategy)
        def test(prog):
            """One generated program."""
            self.test_one(prog)

        try:
            test()
        except FuzzFailure as e:
            return e.prog, e.failure
        except hypothesis.errors.Flaky as e:
            print(f"  (hypothesis: {str(e).splitlines()[0]}; keeping the program unshrunk)")
            return self.first
        return None

    def run(self):
        """Batches until --programs programs ran (or the time limit, or the first failure with --stop-on-first)."""
        batch = 0
        while self.programs < self.args.programs and not self.out_of_time():
            found = self.batch(self.args.seed * 1000 + batch, self.args.programs - self.programs)
            batch += 1
            if found is None:
                if self.target is None:
                    break  # hypothesis ran its examples without a new failure
                continue
            self.report_new(*found)
            if self.args.stop_on_first:
                break
        self.summary()
        if self.worker:
            self.worker.stop()
        return self.failures, len(self.known)

    def out_of_time(self):
        """Whether --time-limit has passed."""
        return self.args.time_limit and time.time() - self.started > self.args.time_limit

    def report_new(self, prog, failure):
        """Reduces, prints (and saves) a shrunk failure; remembers its class (merged into a known one whose
        reduced program is the same)."""
        known = Known(failure.key, prog, failure)
        if not self.args.no_shrink:
            small = reduce_lines(prog, failure.key, self.worker.check if self.worker else check_program)
            failure = (self.worker.check(small) if self.worker else check_program(small)).failure or failure
            prog = known.small = gen.Program(small.source, prog.tags, prog.module)
            twin = next((k for k in self.known if k.key == known.key and k.small.source == small.source), None)
            if twin is not None:
                twin.tags, twin.seen = twin.tags & known.tags, twin.seen + 1  # covers both feature sets from now on
                print(f"  (the same reduced program as class {self.known.index(twin) + 1})", flush=True)
                return
        self.known.append(known)
        print(f"\n=== failure class {len(self.known)}: {failure}\n--- shrunk program:\n{prog.source}\n", flush=True)
        if self.args.save:
            path = save_reproducer(prog, failure, self.args.save, f"failure_{len(self.known)}")
            print(f"    saved {path}")

    def summary(self):
        """The final lines: classes, fallbacks, and the one-line result."""
        dt = time.time() - self.started
        for i, k in enumerate(self.known, 1):
            print(f"class {i}: {k.key}: seen {k.seen} time(s); features {sorted(k.tags)}")
        if self.fallbacks:
            print("programs that ran no native code, by reason:")
            for reason, n in self.fallbacks.most_common(12):
                print(f"  {n:5d}  {reason}")
        print(f"fuzz-programs: {self.programs} programs, {self.failures} failures ({len(self.known)} distinct); "
              f"{self.native} ran native code ({100 * self.native / max(self.programs, 1):.0f}%); "
              f"{dt:.0f} s, {self.programs / max(dt, 1e-9):.1f} programs/s", flush=True)


def block_end(lines, i):
    """The index after line i's block (the line and the more-indented lines that follow it)."""
    depth = len(lines[i]) - len(lines[i].lstrip())
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > depth):
        j += 1
    return j


def reduce_lines(prog, key, check):
    """prog with lines (and blocks) deleted while check(program) still fails with this key (after shrinking:
    hypothesis cannot drop a statement without changing the draws after it)."""
    lines = prog.source.splitlines()
    changed = True
    while changed:
        changed = False
        i = 0
        while i < len(lines):
            cand = lines[:i] + lines[block_end(lines, i):]
            trial = gen.Program("\n".join(cand) + "\n", prog.tags, prog.module)
            f = check(trial).failure
            if f is not None and f.key == key:
                lines, changed = cand, True
            else:
                i += 1
    return gen.Program("\n".join(lines) + "\n", prog.tags, prog.module)


REPRO_FOOTER = '''

# -- reproducer: {kind} (call {call})
# {detail}
if __name__ == "__main__":
    import os
    import sys
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), {here!r}]
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
'''


def save_reproducer(prog, failure, directory, name):
    """Writes a standalone reproducer (the program plus a main that runs the check); its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name + ".py")
    detail = str(failure.detail).replace("\n", "\n# ")
    with open(path, "w") as f:
        f.write(f'"""Fuzzer reproducer: {failure.key}."""\n' + prog.source +
                REPRO_FOOTER.format(kind=failure.kind, call=failure.call, detail=detail, here=HERE))
    return path


def save_current(prog, directory):
    """Writes the program about to run (a crash or hang leaves it behind) when --save is given."""
    if directory:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "last_program.py"), "w") as f:
            f.write(prog.source)


def parse(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", type=int, default=200, help="programs to run (default 200)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    p.add_argument("--save", metavar="DIR", help="write each distinct shrunk failure as DIR/failure_<k>.py")
    p.add_argument("--stop-on-first", action="store_true", help="stop after the first failure class")
    p.add_argument("--time-limit", type=float, default=0, help="stop after this many seconds")
    p.add_argument("--max-classes-per-kind", type=int, default=3, metavar="K",
                   help="failures of a kind (e.g. 'crash: SIGSEGV in native.py:compile') shrunk at most K times")
    p.add_argument("--no-shrink", action="store_true", help="report failing programs as generated (faster)")
    p.add_argument("--no-fork", action="store_true", help="run programs in this process (a crash ends the run)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--module", dest="module", action="store_true", default=None, help="only nn.Module programs")
    kind.add_argument("--function", dest="module", action="store_false", help="only function programs")
    return p.parse_args(argv)


def main(argv=None):
    """Runs the fuzzer; exit status 1 if anything failed."""
    faulthandler.enable()
    torch.set_num_threads(1)  # tiny tensors; and no OpenMP pool in the process the worker is forked from
    failures, _ = Fuzzer(parse(argv)).run()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
