"""One rank of the torch.distributed tests (test_distributed.py starts two of these as real
processes on the gloo backend over 127.0.0.1). Prints one JSON line with what it saw.

    python distributed_worker.py <rank> <world> <port> train|fsdp|killed

train:  20 SGD steps of a small MLP under DistributedDataParallel three ways -- eager,
        DDP(dynamo.optimize(model)) and dynamo.optimize(DDP(model)) -- each from the same
        weights and data; per way: the losses, the rank's dynamo counters and how often a
        communication hook (counting, then all-reducing as DDP's default) ran.
fsdp:   20 steps of a two-block residual MLP sharded with FSDP2 (fully_shard on each block and on
        the root), eager and with dynamo.optimize on the root (before or after sharding): per
        way the losses and counters.
killed: rank 1 ends itself (os._exit) in the middle of step 3, after its forward; rank 0 goes
        on into the backward's all-reduce and must get torch's error, not wait forever.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamo

STEPS = 20


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


class Block(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_sharded(way):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), Block(), Block(), nn.Linear(32, 4))
    if way == "dynamo_then_shard":
        dynamo.optimize(model)
    for block in (model[1], model[2]):
        fully_shard(block)
    fully_shard(model)
    if way == "shard_then_dynamo":
        dynamo.optimize(model)
    return model


def train_sharded(rank, way):
    dynamo.reset()
    model = make_sharded(way)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(2000 + rank)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    c = dynamo.counters()
    return {"losses": losses, "native_runs": c["native_runs"], "backward_native_runs": c["backward_native_runs"],
            "aborts": c["aborts"], "report": dynamo.report()}


def counting_hook(calls):
    def hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(None, bucket)
    return hook


def wrap(way, m, calls):
    if way == "eager":
        model = DDP(m)
    elif way in ("ddp_of_dynamo", "ddp_of_dynamo_split"):
        model = DDP(dynamo.optimize(m))
    else:  # dynamo_of_ddp
        ddp = DDP(m)
        model = dynamo.optimize(ddp)
    model.register_comm_hook(None, counting_hook(calls))
    return model


def train(rank, way, kill_at=None):
    dynamo.reset()
    # ddp_of_dynamo_split: the trace split at a "bucket" of 12 KiB of parameters (after the
    # second Linear), each part's backward its own autograd node (config.ddp_bucket_mb)
    dynamo.config.ddp_bucket_mb = 12 / 1024 if way == "ddp_of_dynamo_split" else 25
    calls = [0]
    model = wrap(way, make_model(), calls)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        if kill_at is not None and step == kill_at and rank == 1:
            os._exit(3)  # a rank that dies mid-step, its peers inside a collective
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    c = dynamo.counters()
    return {"losses": losses, "hook_calls": calls[0], "native_runs": c["native_runs"], "report": dynamo.report(),
            "backward_native_runs": c["backward_native_runs"], "aborts": c["aborts"],
            "weights": [p.detach().sum().item() for p in model.parameters()]}


def main():
    rank, world, port, what = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    out = {"rank": rank}
    if what == "train":
        for way in ("eager", "ddp_of_dynamo", "dynamo_of_ddp", "ddp_of_dynamo_split"):
            out[way] = train(rank, way)
    elif what == "fsdp":
        for way in ("eager", "shard_then_dynamo", "dynamo_then_shard"):
            out[way] = train_sharded(rank, way)
    else:
        try:
            train(rank, "ddp_of_dynamo", kill_at=3)
            out["error"] = None
        except Exception as e:  # noqa: BLE001 -- reported to the test
            out["error"] = f"{type(e).__name__}: {e}"[:400]
    print(json.dumps(out), flush=True)
    if what != "killed":
        dist.barrier()  # both ranks are done with every collective
    sys.stderr.flush()
    # No teardown: gloo's process group destroyed while the peer exits can abort the process
    # ("terminate called without an active exception", rc -6) after the results are out (seen
    # once in a clean-clone CI run); the killed case's group has lost a rank and would wait.
    os._exit(0)


if __name__ == "__main__":
    main()
