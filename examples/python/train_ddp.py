"""Data-parallel training with DistributedDataParallel and a dynamo-compiled model, one process
per rank. On one machine, two ranks on the CPU (gloo):

    PYTHONPATH=python_shim .venv/bin/torchrun --nproc-per-node 2 examples/python/train_ddp.py

Each rank trains the same small MLP on its own batches; DDP all-reduces the gradients, so the
ranks' weights stay equal. The model's forward and backward run as compiled code on every rank
(`--eager` runs plain DDP instead, for comparison: the losses agree within float rounding).
`--wrap outer` optimizes the DDP module itself, `dynamo.optimize(DDP(model))`, instead of
`DDP(dynamo.optimize(model))`: DDP's own forward then runs in CPython around the compiled model.

On several machines the script is the same: torchrun on each, with `--nnodes N --node-rank K
--rdzv-endpoint HOST:PORT`, and `--backend nccl` for GPUs (one process per GPU).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamo


def make_model():
    torch.manual_seed(0)  # every rank starts from the same weights (DDP checks it)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 8))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--wrap", choices=["inner", "outer"], default="inner")
    ap.add_argument("--eager", action="store_true", help="plain DDP, no dynamo")
    args = ap.parse_args()
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # no more threads than cores

    model = make_model()
    if args.eager:
        model = DDP(model)
    elif args.wrap == "inner":
        model = DDP(dynamo.optimize(model))
    else:
        model = dynamo.optimize(DDP(model))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    g = torch.Generator().manual_seed(rank)  # each rank its own data
    for step in range(args.steps):
        x = torch.randn(64, 32, generator=g)
        y = torch.sin(x[:, :8])
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step:2d}  loss {loss.item():.6f}", flush=True)
    if not args.eager:
        c = dynamo.counters()
        print(f"rank {rank}: {c['native_runs']} native run(s) of the compiled forward and backward graphs, "
              f"{c['aborts']} abort(s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
