"""The zoo's models on several Pythons at once, timed in interleaved blocks: is dynamo as fast on
3.12 and 3.13 as on 3.11?

Two zoo runs one after the other cannot answer that on a machine whose speed drifts (single
models read up to 2x apart between runs here, eager as much as dynamo). This script starts one
worker process per Python (each its own venv, the same dynamo source) and gives them the same
model; only one worker runs at a time, and the timed blocks go round the versions, the order
rotating every block, so a slow spell touches every version alike. Per model and version it
prints the median block of dynamo's calls (and of eager's, the control), and their ratio to the
first version's.

  PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 DYNAMO_CACHE_DIR=off \\
      .venv/bin/python perf/versions.py --pythons .venv,.venv-3.12,.venv-3.13 [--models a,b]

Each worker loads the extension built for its own Python (build/python/, as `make` builds them).
Rows: model, dynamo ms on each Python, dynamo's ratio to the first, eager's ratio to the first
(what the machine and torch do on their own), native runs / calls. The row `overhead` is a call
of `(x @ w).relu() + 1` at 8x64, where the per-call path is most of the time.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
TAG = "@versions "
OVERHEAD = "overhead"


# ---------------------------------------------------------------------------------------------
# The worker: one per Python, reads one JSON command per line, answers with one tagged line


def _overhead_model():
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64))

        def forward(self, x):
            return (x @ self.w).relu() + 1

    torch.manual_seed(0)
    return Small().eval(), torch.randn(8, 64)


class Worker:
    def __init__(self):
        import models
        models.setup_torch()
        self.models = models
        self.sides = {}
        self.x = None

    def load(self, name):
        """Builds the model, checks dynamo's first calls against eager, warms it up."""
        import dynamo
        import torch
        m = self.models
        dynamo.reset()
        self.sides = {}
        if name == OVERHEAD:
            eager, self.x = _overhead_model()
        else:
            fam = dict(m.list_models()).get(name)
            if fam is None:
                return dict(status="unknown model")
            inp = m.model_input(name, fam, 64)
            eager = m.build_model(name, fam, 64)
            self.x = m.make_input(inp.kind, inp.shape, 1000)
        opt = m.side_callable("dynamo", eager)
        err = 0.0
        with torch.no_grad():
            want = eager(m.clone_input(self.x))
            before = dynamo.counters()
            t0 = time.perf_counter()
            got = opt(m.clone_input(self.x))
            first = time.perf_counter() - t0
            try:
                err = m.compare(want, got)[0]
            except m.Mismatch as e:
                return dict(status=f"WRONG: {e.args[0]}")
            for _ in range(11):
                opt(m.clone_input(self.x))
            after = dynamo.counters()
        self.sides = {"eager": eager, "dynamo": opt}
        return dict(status="ok", err=err, first_s=first,
                    native=f"{after['native_runs'] - before['native_runs']}/12")

    def block(self, side, calls, repeat):
        """The median over `calls` samples, each the mean of `repeat` calls, after two warm calls."""
        import torch
        fn, x, clone = self.sides[side], self.x, self.models.clone_input
        with torch.no_grad():
            fn(clone(x))
            fn(clone(x))
            samples = []
            for _ in range(calls):
                inputs = [clone(x) for _ in range(repeat)]
                t0 = time.perf_counter()
                for xi in inputs:
                    fn(xi)
                samples.append((time.perf_counter() - t0) / repeat)
        return dict(seconds=statistics.median(samples))

    def serve(self):
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                if cmd["op"] == "load":
                    out = self.load(cmd["model"])
                else:
                    out = self.block(cmd["side"], cmd["calls"], cmd["repeat"])
            except Exception as e:  # noqa: BLE001 -- reported to the coordinator as the model's row
                out = dict(status=f"{type(e).__name__}: {e}")
            print(TAG + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# The coordinator


class Remote:
    def __init__(self, venv):
        py = os.path.join(venv, "bin", "python")
        ver = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
        self.label = ver
        self.proc = subprocess.Popen([py, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError(f"the {self.label} worker ended")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def measure(workers, name, blocks, calls):
    """One model on every worker: its load results and, per worker and side, the median block."""
    loaded = [w.ask(op="load", model=name) for w in workers]
    if any(r.get("status") != "ok" for r in loaded):
        return loaded, None
    # calls per sample from the first worker's eager block: the same on every Python
    t = workers[0].ask(op="block", side="eager", calls=3, repeat=1)["seconds"]
    repeat = max(1, min(50, int(0.02 / t))) if t > 0 else 1
    times = {(w.label, s): [] for w in workers for s in ("eager", "dynamo")}
    n = len(workers)
    for b in range(blocks):
        order = workers[b % n:] + workers[:b % n]
        if b % 2:
            order = order[::-1]
        for w in order:
            for side in (("eager", "dynamo") if b % 2 == 0 else ("dynamo", "eager")):
                times[(w.label, side)].append(w.ask(op="block", side=side, calls=calls, repeat=repeat)["seconds"])
    return loaded, {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pythons", default=".venv,.venv-3.12,.venv-3.13",
                    help="comma-separated venvs; the first is the reference (default %(default)s)")
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: the overhead row and every zoo model)")
    ap.add_argument("--blocks", type=int, default=6, help="timed blocks per version and side (default 6)")
    ap.add_argument("--calls", type=int, default=5, help="samples per block (default 5)")
    ap.add_argument("--limit", type=float, default=1.10, help="slowest ratio to the first Python that passes (default 1.10)")
    ap.add_argument("--json", default="", help="also write every row here")
    args = ap.parse_args()
    if args.worker:
        Worker().serve()
        return
    import models
    names = args.models.split(",") if args.models else [OVERHEAD] + [n for n, _ in models.list_models()]
    workers = [Remote(v) for v in args.pythons.split(",")]
    ref = workers[0].label
    labels = [w.label for w in workers]
    print(f"# dynamo's time per call on {', '.join(labels)}; ratios to {ref}; blocks interleaved "
          f"({args.blocks} per version and side, {args.calls} samples each)", flush=True)
    head = f"{'model':40} " + " ".join(f"{lb + ' ms':>9}" for lb in labels) + " " + \
        " ".join(f"{'dyn ' + lb:>9}" for lb in labels[1:]) + " " + " ".join(f"{'eag ' + lb:>9}" for lb in labels[1:])
    print(head, flush=True)
    rows, t_start = [], time.time()
    try:
        for i, name in enumerate(names):
            loaded, med = measure(workers, name, args.blocks, args.calls)
            row = dict(model=name, loaded=dict(zip(labels, loaded)))
            if med is None:
                bad = "; ".join(f"{lb}: {r.get('status')}" for lb, r in zip(labels, loaded) if r.get("status") != "ok")
                print(f"{name:40} not timed ({bad})", flush=True)
            else:
                row["ms"] = {lb: {s: med[(lb, s)] * 1e3 for s in ("eager", "dynamo")} for lb in labels}
                row["dynamo_ratio"] = {lb: med[(lb, "dynamo")] / med[(ref, "dynamo")] for lb in labels[1:]}
                row["eager_ratio"] = {lb: med[(lb, "eager")] / med[(ref, "eager")] for lb in labels[1:]}
                native = " ".join(r["native"] for r in loaded)
                print(f"{name:40} " + " ".join(f"{row['ms'][lb]['dynamo']:9.3f}" for lb in labels) + " " +
                      " ".join(f"{row['dynamo_ratio'][lb]:9.3f}" for lb in labels[1:]) + " " +
                      " ".join(f"{row['eager_ratio'][lb]:9.3f}" for lb in labels[1:]) + f"  native {native}"
                      f"  [{i + 1}/{len(names)}, {time.time() - t_start:.0f} s]", flush=True)
            rows.append(row)
    finally:
        for w in workers:
            w.close()
    timed = [r for r in rows if "ms" in r]
    print(f"\n{len(timed)} of {len(rows)} models timed on every Python.")
    for lb in labels[1:]:
        d = [r["dynamo_ratio"][lb] for r in timed]
        e = [r["eager_ratio"][lb] for r in timed]
        slow = [f"{r['model']} {r['dynamo_ratio'][lb]:.2f}" for r in timed if r["dynamo_ratio"][lb] > args.limit]
        print(f"{lb}: dynamo's time / {ref}'s geomean {_geomean(d):.3f} (eager {_geomean(e):.3f}); "
              f"{len(d) - len(slow)} of {len(d)} within {args.limit:.2f}x" + (f"; above: {', '.join(slow)}" if slow else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
