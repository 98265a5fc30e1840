"""2-rank DistributedDataParallel training step, side by side: eager DDP, DDP over torch.compile
(Inductor), and DDP over dynamo with the backward split at DDP's bucket boundaries
(config.ddp_bucket_mb, so all-reduce of the last layers' bucket overlaps the backward of the
earlier ones) and without the split (one backward node: every all-reduce waits for its end).
Two real processes on the gloo backend over 127.0.0.1, one thread each (2 cores here).

    PYTHONPATH=python_shim .venv/bin/python perf/bench_ddp.py [--steps N] [--sides eager,compile,...]

Prints per side the median step time on rank 0 (forward, loss, backward with its all-reduce,
SGD step), its ratio to eager DDP, and how long before the end of `loss.backward()` the first
bucket was handed to the all-reduce (the window in which communication overlaps the backward:
near zero when the gradients all come at the backward's end); every side's losses are checked
against eager's.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SIDES = ("eager", "compile", "dynamo", "dynamo_unsplit")
BUCKET_MB = 4  # DDP's bucket size here, and dynamo's split size (the model has ~24 MiB of weights)


def make_model():
    import torch
    from torch import nn
    torch.manual_seed(0)
    layers = [nn.Linear(256, 1024), nn.GELU()]
    for _ in range(5):
        layers += [nn.Linear(1024, 1024), nn.GELU()]
    layers.append(nn.Linear(1024, 16))
    return nn.Sequential(*layers)


def rank_main(rank, port, sides, steps, warmup):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=600))
    import dynamo
    out = {}
    for side in sides:
        m = make_model()
        if side == "eager":
            model = DDP(m, bucket_cap_mb=BUCKET_MB)
        elif side == "compile":
            model = DDP(torch.compile(m), bucket_cap_mb=BUCKET_MB)
        else:
            dynamo.reset()
            dynamo.config.ddp_bucket_mb = BUCKET_MB if side == "dynamo" else 0
            model = DDP(dynamo.optimize(m), bucket_cap_mb=BUCKET_MB)
        first_hook = []  # when the step's first bucket was handed to the all-reduce

        def hook(state, bucket):
            if not first_hook or first_hook[-1] is None:
                first_hook[-1:] = [time.perf_counter()]
            return default_hooks.allreduce_hook(None, bucket)
        model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        times, losses, ahead = [], [], []
        for step in range(warmup + steps):
            x, y = torch.randn(64, 256, generator=g), torch.randn(64, 16, generator=g)
            dist.barrier()
            t0 = time.perf_counter()
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            first_hook.append(None)
            loss.backward()  # (returns once every bucket's all-reduce is done)
            t_end = time.perf_counter()
            opt.step()
            losses.append(loss.item())
            if step >= warmup:
                times.append(time.perf_counter() - t0)
                ahead.append(t_end - first_hook[-1])
        # how long before the backward's end the first all-reduce started (the overlap window)
        out[side] = {"ms": statistics.median(times) * 1e3, "losses": losses, "ahead_ms": statistics.median(ahead) * 1e3}
        if side.startswith("dynamo"):
            c = dynamo.counters()
            out[side]["native"] = c["native_runs"]
            out[side]["backward_native"] = c["backward_native_runs"]
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=12)  # (dynamo's continuation after a cut: recorded on the 9th)
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sides = args.sides.split(",")
    if args.rank is not None:
        return rank_main(args.rank, args.port, sides, args.steps, args.warmup)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"2-rank DDP training step (gloo, 1 thread per rank, MLP 256-1024x6-16 = 24 MiB of weights, "
          f"batch 64 per rank, DDP buckets of {BUCKET_MB} MiB), median of {args.steps} steps after {args.warmup}:",
          flush=True)
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--sides", args.sides,
                               "--steps", str(args.steps), "--warmup", str(args.warmup)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        line = next((s for s in reversed(out.splitlines()) if s.startswith("{")), None)
        if p.returncode != 0 or line is None:
            print(f"  rank {procs.index(p)} failed (exit {p.returncode})")
            return 1
        results.append(json.loads(line))
    r0 = results[0]
    base = r0["eager"]["ms"] if "eager" in r0 else None
    names = {"eager": "eager DDP", "compile": "DDP(torch.compile(model))",
             "dynamo": f"DDP(dynamo.optimize(model)), backward split at {BUCKET_MB} MiB",
             "dynamo_unsplit": "DDP(dynamo.optimize(model)), one backward (ddp_bucket_mb=0)"}
    ok = True
    for side in sides:
        row = r0[side]
        same = "eager" not in r0 or all(abs(a - b) <= 1e-4 * abs(b) + 1e-6 for rr in results
                                        for a, b in zip(rr[side]["losses"], rr["eager"]["losses"]))
        ok &= same
        extra = f", {row['backward_native']} compiled backward runs" if "backward_native" in row else ""
        ratio = f"{base / row['ms']:.2f}x eager" if base else ""
        print(f"  {names[side]:<62} {row['ms']:8.2f} ms/step  {ratio:>12}  first all-reduce {row['ahead_ms']:6.2f} ms "
              f"before the backward's end  losses {'= eager' if same else 'DIFFER'}{extra}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
