"""The model zoo: every torchvision classification, segmentation and detection model, eager vs.
dynamo.optimize, correctness first.

For each model: random weights (weights=None, weights_backbone=None: nothing is downloaded;
weight matrices initialized to zeros, like ViT's head, get random values too, or the output
would be all zeros), eval mode, batch 1, torch.no_grad(); detection models keep every box (score
threshold 0) and, but for SSD, work at the input's size instead of resizing to 800. The model and a deep copy are built; the copy goes through dynamo.optimize.
Each of --calls calls feeds both the same fresh random input (generated once per call, cloned
per side) and compares every output (nested tuples/lists/dicts of tensors): float tensors with
allclose(rtol 1e-3, atol 1e-3 * max|eager output|), everything else exactly.

Per model: status, largest error over the calls, largest |eager output|, native runs and traces
compiled (dynamo.counters() deltas), the first fallback reason (dynamo.report()), and the time
ratio eager / dynamo (best call of each, interleaved: >1 means dynamo is faster).

Status: ok; WRONG (an output differs); LEAKED (dynamo raised, or the process died, where eager
did not); eager-fails (building the model or the eager call raised: nothing to compare);
skipped (over --timeout).

--mode hook calls the copy inside `with dynamo.optimize():` instead, so that the submodules'
forwards compile on their own where the whole forward cannot (counters and fallbacks then cover
every compiled frame).

Every model runs in its own child process (`--run-one NAME`, which can be run by hand to debug
one model), so that a timeout or a crash costs only that model. The exit status is 1 when any
model is WRONG or LEAKED.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 /usr/bin/python3 perf/models.py \
        [--models resnet18,swin_t] [--family classification,detection] [--calls 5] [--size 64] \
        [--timeout 900] [--mode module|hook] [--json results.json]
"""
import argparse
import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping

FAMILIES = ("classification", "segmentation", "detection")
RESULT_TAG = "@result "
PHASE_TAG = "@phase "


# ---------------------------------------------------------------------------------------------
# Which models, built how, at which input size


def _family_module(family):
    """The torchvision module whose registered builders form a family."""
    import torchvision.models as tvm
    return {"classification": tvm, "segmentation": tvm.segmentation, "detection": tvm.detection}[family]


def list_models(families=FAMILIES):
    """(name, family) for every registered builder of the families (torchvision 0.14 registry)."""
    from torchvision.models import list_models as registered
    return [(name, fam) for fam in families for name in registered(module=_family_module(fam))]


def _maxvit_fits(s):
    """MaxViT's block inputs (stem stride 2, then 4 blocks of stride 2) divide its partition 7."""
    for _ in range(5):
        s = (s - 1) // 2 + 1
        if s % 7:
            return False
    return True


def _size_rule(name):
    """(predicate on the image side, why) for models that cannot take any size, else None."""
    if name == "inception_v3":
        return (lambda s: s >= 75), "inception_v3 needs >= 75x75"
    if name == "maxvit_t":
        return _maxvit_fits, "maxvit_t: every block input must divide by its partition size 7"
    if name.startswith("vit_"):
        patch = int(name.rsplit("_", 1)[1])
        return (lambda s: s % patch == 0), f"{name}: image_size must divide by its patch {patch}"
    return None


def model_size(name, size):
    """The smallest image side >= size that the model accepts, and a note when it is not size."""
    rule = _size_rule(name)
    if rule is None:
        return size, ""
    fits, why = rule
    s = size
    while not fits(s):
        s += 1
    return s, (f"{s}x{s} ({why})" if s != size else "")


def _detection_kwargs(name, size):
    """No score threshold (random weights score everything low: the outputs would be empty),
    and, but for SSD (fixed 300/320), the transform's size at the input's (it would resize
    to 800)."""
    if name.startswith("ssd"):
        return {"score_thresh": 0.0}
    thresh = "box_score_thresh" if "rcnn" in name else "score_thresh"
    return {thresh: 0.0, "min_size": size, "max_size": size}


def builder_kwargs(name, family, size):
    """Keyword arguments for a builder: random weights, nothing downloaded, sized for `size`."""
    kw = {"weights": None}
    if family != "classification":
        kw["weights_backbone"] = None  # the default would download ImageNet weights
    if family == "detection":
        kw.update(_detection_kwargs(name, size))
    if name in ("googlenet", "inception_v3"):
        kw.update(aux_logits=False, init_weights=True)
    if name.startswith("vit_"):
        kw["image_size"] = size
    if name == "maxvit_t":
        kw["input_size"] = (size, size)
    return kw


def family_note(name, family):
    """What the model does to its input that the table should say."""
    if family == "detection" and name.startswith("ssd"):
        return "resized to %s inside the model" % ("300x300" if name.startswith("ssd300") else "320x320")
    return ""


def _unzero(model):
    """Random values for weight matrices initialized to zeros (ViT's head): the output would
    be all zeros, and comparing zeros with zeros proves nothing."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(std=0.02)
    return model


def build_model(name, family, size):
    """The model in eval mode, with seeded random weights (none left all zero)."""
    import torch
    from torchvision.models import get_model_builder
    torch.manual_seed(0)
    return _unzero(get_model_builder(name)(**builder_kwargs(name, family, size))).eval()


def make_input(family, size, seed):
    """One call's input: an image batch (classification/segmentation) or a list of one image
    in [0, 1] (detection)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    if family == "detection":
        return [torch.rand(3, size, size, generator=gen)]
    return torch.randn(1, 3, size, size, generator=gen)


def clone_input(x):
    """A copy a model may write into without touching the other side's input."""
    return [t.clone() for t in x] if isinstance(x, list) else x.clone()


# ---------------------------------------------------------------------------------------------
# Comparing outputs


class Mismatch(Exception):
    """The two outputs differ in structure, shape, dtype or value (message says where)."""


def _leaves(v, path="out"):
    """(path, leaf) for every non-container leaf of a nested output."""
    if isinstance(v, Mapping):
        for k, x in v.items():
            yield from _leaves(x, f"{path}[{k!r}]")
    elif isinstance(v, (tuple, list)):
        for i, x in enumerate(v):
            yield from _leaves(x, f"{path}[{i}]")
    else:
        yield path, v


def _structure(v):
    """The container skeleton of an output (types, keys, lengths), leaves erased."""
    if isinstance(v, Mapping):
        return ("dict", tuple(v.keys()), tuple(_structure(x) for x in v.values()))
    if isinstance(v, (tuple, list)):
        return ("seq", tuple(_structure(x) for x in v))
    return "leaf"


def _compare_tensor(path, want, got, rtol, atol_rel):
    """(max abs error, max |want|) of two tensors; raises Mismatch when not close."""
    import torch
    if got.shape != want.shape or got.dtype != want.dtype:
        raise Mismatch(f"{path}: {tuple(got.shape)} {got.dtype} vs eager {tuple(want.shape)} {want.dtype}")
    if want.numel() == 0:
        return 0.0, 0.0
    if not want.is_floating_point():
        if not torch.equal(got, want):
            raise Mismatch(f"{path}: {int((got != want).sum())} of {want.numel()} elements differ")
        return 0.0, 0.0  # labels, indices, masks: exact, and no part of the output scale
    w, g = want.double(), got.double()
    both_nan = w.isnan() & g.isnan()
    scale = float(w.abs().nan_to_num(0.0, 0.0, 0.0).max())
    err = float((g - w).abs().masked_fill(both_nan, 0.0).nan_to_num(math.inf).max())
    if not torch.allclose(g, w, rtol=rtol, atol=atol_rel * scale, equal_nan=True):
        raise Mismatch(f"{path}: max abs error {err:.3g} at output scale {scale:.3g}", err, scale)
    return err, scale


def compare(want, got, rtol=1e-3, atol_rel=1e-3):
    """(max abs error, max |want|) over every leaf; raises Mismatch at the first difference
    (its args carry the error and scale when the values, not the structure, differ)."""
    import torch
    if _structure(want) != _structure(got):
        raise Mismatch(f"output structure differs: {_structure(got)} vs eager {_structure(want)}")
    err = scale = 0.0
    for (path, w), (_, g) in zip(_leaves(want), _leaves(got)):
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor):
            e, s = _compare_tensor(path, w, g, rtol, atol_rel)
            err, scale = max(err, e), max(scale, s)
        elif type(w) is not type(g) or w != g:
            raise Mismatch(f"{path}: {g!r} vs eager {w!r}")
    return err, scale


# ---------------------------------------------------------------------------------------------
# One model (the child process)


def _phase(text):
    """Tells the parent where the child is (what a timeout or crash interrupted)."""
    print(PHASE_TAG + text, flush=True)


def first_fallback(report_text):
    """The first 'fell back' / 'not compiled' reason in dynamo.report(), or ''."""
    for line in report_text.splitlines():
        line = line.strip()
        for tag in ("fell back: ", "not compiled: "):
            if line.startswith(tag):
                return line[len(tag):]
    return ""


def _under_hook(model):
    """model called inside `with dynamo.optimize():`: every frame it starts is a candidate, so
    submodules compile on their own where the whole forward cannot."""
    import dynamo

    def call(x):
        with dynamo.optimize():
            return model(x)
    return call


def _timed(fn, x):
    """(result, seconds) of fn(x)."""
    t0 = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - t0


class ModelRun:
    """Eager and dynamo side by side on one model; fills a result dict as it goes."""

    def __init__(self, name, family, size, calls, mode="module"):
        self.size, note = model_size(name, size)
        self.family, self.calls, self.mode = family, calls, mode
        self.r = dict(name=name, family=family, size=self.size, note=note or family_note(name, family),
                      status="ok", reason="", traceback="", max_err=0.0, max_abs=0.0, calls_done=0,
                      eager_s=[], dynamo_s=[], eager_best=None, dynamo_best=None, first_call_s=None)

    def _fail(self, status, reason, tb=""):
        self.r.update(status=status, reason=reason, traceback=tb)

    def _build(self):
        """(eager model, optimized copy), or None after recording eager-fails."""
        import dynamo
        _phase("building the model")
        try:
            eager = build_model(self.r["name"], self.family, self.size)
        except Exception as e:  # noqa: BLE001 -- any builder failure is the model's, not ours
            self._fail("eager-fails", f"build: {type(e).__name__}: {e}", traceback.format_exc())
            return None
        jit = copy.deepcopy(eager)
        return eager, (dynamo.optimize(jit) if self.mode == "module" else _under_hook(jit))

    def _side(self, k, which, fn, x):
        """((output, seconds), None) of one side's call k, or (None, (reason, traceback))."""
        _phase(f"{which} call {k + 1}" + (" (recording and compiling)" if which == "dynamo" and k == 0 else ""))
        try:
            return _timed(fn, clone_input(x)), None
        except Exception as e:  # noqa: BLE001 -- whatever the model raises is the finding
            return None, (f"{which} call {k + 1}: {type(e).__name__}: {e}", traceback.format_exc())

    def _one_call(self, k, eager, jit):
        """Call k on both sides with one input (eager first on even calls, dynamo first on odd
        ones, so that neither always runs on a warm cache); False when the run must stop: eager
        raised (eager-fails), or dynamo raised where eager did not (LEAKED)."""
        x = make_input(self.family, self.size, seed=1000 + k)
        order = [("eager", eager), ("dynamo", jit)]
        done = dict((which, self._side(k, which, fn, x)) for which, fn in (order[::-1] if k % 2 else order))
        (e, e_fail), (j, j_fail) = done["eager"], done["dynamo"]
        if e_fail:
            self._fail("eager-fails", *e_fail)
        elif j_fail:
            self._fail("LEAKED", *j_fail)
        else:
            self._account(k, e[0], j[0], e[1], j[1])
        return not (e_fail or j_fail)

    def _account(self, k, want, got, te, tj):
        """Compares call k's outputs and keeps the error, scale and best times."""
        r = self.r
        r["calls_done"] = k + 1
        r["eager_s"].append(te)
        r["dynamo_s"].append(tj)
        r["eager_best"], r["dynamo_best"] = min(r["eager_s"]), min(r["dynamo_s"])
        if k == 0:
            r["first_call_s"] = tj
        try:
            err, scale = compare(want, got)
        except Mismatch as m:
            err, scale = (m.args[1], m.args[2]) if len(m.args) == 3 else (math.inf, 0.0)
            if r["status"] == "ok":
                self._fail("WRONG", f"call {k + 1}: {m.args[0]}")
        r["max_err"], r["max_abs"] = max(r["max_err"], err), max(r["max_abs"], scale)

    def run(self):
        """Builds, calls both sides, and returns the result dict with dynamo's counters."""
        import dynamo
        import torch
        dynamo.reset()
        before = dynamo.counters()
        models = self._build()
        if models is not None:
            with torch.no_grad():
                for k in range(self.calls):
                    if not self._one_call(k, *models):
                        break
        after = dynamo.counters()
        self.r["counters"] = {k: after[k] - before[k] for k in after}
        self.r["fallback"] = first_fallback(dynamo.report())
        return self.r


def run_one(name, family, size, calls, mode):
    """The child's work: one model, its result printed as one tagged JSON line."""
    import warnings
    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    print(RESULT_TAG + json.dumps(ModelRun(name, family, size, calls, mode).run()), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: one child per model, the table


def _last_phase(stdout):
    """The last phase line a child printed, or 'starting'."""
    phases = [ln[len(PHASE_TAG):] for ln in (stdout or "").splitlines() if ln.startswith(PHASE_TAG)]
    return phases[-1] if phases else "starting"


def _empty_result(name, family, size, status, reason, tb=""):
    """A result for a model whose child gave none (timeout, crash)."""
    return dict(name=name, family=family, size=size, note="", status=status, reason=reason,
                traceback=tb, max_err=None, max_abs=None, calls_done=0, counters={}, fallback="",
                eager_best=None, dynamo_best=None, first_call_s=None)


def _signal_name(rc):
    """'SIGSEGV' for a child killed by signal 11, else 'exit status N'."""
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _crash_result(name, family, size, rc, stdout, stderr):
    """A child that ended without a result: LEAKED when it died inside a dynamo call."""
    phase = _last_phase(stdout)
    status = "LEAKED" if phase.startswith("dynamo") else "eager-fails"
    return _empty_result(name, family, size, status, f"process died ({_signal_name(rc)}) in {phase}",
                         (stderr or "")[-4000:])


def run_isolated(name, family, args):
    """Runs one model in a child process under args.timeout; returns its result dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", name, "--family", family,
           "--size", str(args.size), "--calls", str(args.calls), "--mode", args.mode]
    size = model_size(name, args.size)[0]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout or None)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout
        r = _empty_result(name, family, size, "skipped", f"over the {args.timeout:g} s timeout in {_last_phase(out)}")
    else:
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        r = json.loads(lines[-1][len(RESULT_TAG):]) if lines else \
            _crash_result(name, family, size, p.returncode, p.stdout, p.stderr)
    r["wall_s"] = time.perf_counter() - t0
    return r


def _fmt(v, spec=".2g"):
    return "-" if v is None else format(v, spec)


def _native(r):
    c = r.get("counters") or {}
    return f"{c.get('native_runs', 0)}/{r['calls_done']}" if c else "-"


def _ratio(r):
    e, d = r.get("eager_best"), r.get("dynamo_best")
    return f"{e / d:.2f}x" if e and d else "-"


def _why(r):
    """The table's reason column: a failure's reason, else the first fallback (or guard misses)."""
    if r["status"] != "ok":
        return r["reason"]
    if r.get("fallback"):
        return "fallback: " + r["fallback"]
    misses = (r.get("counters") or {}).get("guard_misses", 0)
    return f"{misses} guard miss(es)" if misses else ""


COLUMNS = ("model", "size", "status", "max err", "max |out|", "native", "traces", "reason / first fallback",
           "eager/dynamo")


def table_row(r, width=90):
    """One row of the results table (the reason cut to width)."""
    c = r.get("counters") or {}
    traces = f"{c.get('traces_compiled', 0)}+{c.get('side_traces_compiled', 0)}" if c else "-"
    why = _why(r).replace("\n", " ")
    why = why if len(why) <= width else why[:width - 3] + "..."
    return (r["name"], str(r.get("size") or "-"), r["status"], _fmt(r.get("max_err")), _fmt(r.get("max_abs")),
            _native(r), traces, why, _ratio(r))


def print_table(results, out=sys.stdout):
    """The results table, columns padded to their widest cell."""
    rows = [COLUMNS] + [table_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)


def progress_line(i, n, r):
    """The line printed as a model finishes."""
    name, size, status, err, scale, native, traces, why, ratio = table_row(r, width=120)
    return (f"[{i:>3}/{n}] {name:<36} {status:<11} err {err:<8} |out| {scale:<8} native {native:<5} "
            f"traces {traces:<5} {ratio:>7}  {r['wall_s']:6.1f} s  {why}")


def summary_line(results):
    """zoo: N models, ok X, WRONG Y, LEAKED Z, native in W (W: models with a native run)."""
    count = lambda s: sum(r["status"] == s for r in results)  # noqa: E731
    native = sum((r.get("counters") or {}).get("native_runs", 0) > 0 for r in results)
    extra = "".join(f", {s} {count(s)}" for s in ("eager-fails", "skipped") if count(s))
    return (f"zoo: {len(results)} models, ok {count('ok')}, WRONG {count('WRONG')}, LEAKED {count('LEAKED')}, "
            f"native in {native}{extra}")


def print_notes(results, out=sys.stdout):
    """Models run at another size than asked, or that resize internally."""
    notes = [f"  {r['name']}: {r['note']}" for r in results if r.get("note")]
    if notes:
        print("\nnotes:", *notes, sep="\n", file=out)


def print_failures(results, out=sys.stdout):
    """Every WRONG / LEAKED model with its reason and traceback."""
    for r in results:
        if r["status"] in ("WRONG", "LEAKED"):
            print(f"\n== {r['name']}: {r['status']}: {r['reason']}", file=out)
            if r.get("traceback"):
                print(r["traceback"].rstrip(), file=out)


def select(args):
    """The (name, family) pairs to run, in registry order, filtered by --models / --family."""
    families = [f for f in args.family.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            sys.exit(f"models.py: unknown family {f!r} (have {', '.join(FAMILIES)})")
    chosen = list_models(families)
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        known = dict(list_models())
        unknown = [m for m in wanted if m not in known]
        if unknown:
            sys.exit(f"models.py: unknown model(s) {', '.join(unknown)}")
        chosen = [(m, known[m]) for m in wanted]
    return chosen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated model names (default: all of --family)")
    p.add_argument("--family", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    p.add_argument("--calls", type=int, default=5, help="calls per model, each with a fresh input (default 5)")
    p.add_argument("--size", type=int, default=64, help="image side (default 64; larger where a model needs it)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per model before it is skipped "
                                                              "(default 900; 0: none)")
    p.add_argument("--mode", choices=("module", "hook"), default="module",
                   help="module: dynamo.optimize(model) (default); hook: the call runs inside "
                        "`with dynamo.optimize():`, so submodules compile where the forward cannot")
    p.add_argument("--json", default="", help="also write every result (full reasons, tracebacks) here")
    p.add_argument("--run-one", default="", help=argparse.SUPPRESS)  # the child process
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.run_one:
        run_one(args.run_one, args.family, args.size, args.calls, args.mode)
        return 0
    chosen = select(args)
    results = []
    print(f"zoo: {len(chosen)} models, {args.calls} calls each, {args.size}x{args.size}, batch 1, "
          f"random weights, eval, no_grad; {args.mode} mode; timeout {args.timeout:g} s", flush=True)
    for i, (name, family) in enumerate(chosen, 1):
        results.append(run_isolated(name, family, args))
        print(progress_line(i, len(chosen), results[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    print()
    print_table(results)
    print_notes(results)
    print_failures(results)
    print()
    print(summary_line(results))
    return 1 if any(r["status"] in ("WRONG", "LEAKED") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
