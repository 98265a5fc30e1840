"""Compiled models under torch.distributed, with real processes: two ranks on the gloo backend
over 127.0.0.1 (distributed_worker.py), each time-bounded. DistributedDataParallel wrapped
around an optimized module and optimized itself both train as eager DDP does (losses and
weights equal), their compiled parts run natively on every rank, DDP's communication hooks run;
FSDP2 (fully_shard on each block and the root) trains with the blocks compiled, losses equal to
eager FSDP's; a rank that dies mid-step ends its peer with torch's error instead of a hang."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not in this torch build")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(what, timeout):
    """Starts both ranks; (per rank: its JSON line or None, its return code, its stderr tail),
    and the seconds they took. Ranks still running at the timeout are killed (a hang fails)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"), DYNAMO_CACHE_DIR="off",
               OMP_NUM_THREADS="1")
    port = str(_free_port())
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_worker.py"), str(r), "2", port, what],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {procs.index(p)} still running after {timeout} s (a hang)")
        line = next((s for s in reversed(out.splitlines()) if s.startswith("{")), None)
        results.append((json.loads(line) if line else None, p.returncode, err[-2000:]))
    return results, time.monotonic() - t0


def _close(got, want, rtol=1e-5, atol=1e-7):
    return len(got) == len(want) and all(abs(a - b) <= atol + rtol * abs(b) for a, b in zip(got, want))


@pytest.fixture(scope="module")
def trained():
    results, _ = _run_ranks("train", timeout=240)
    for out, rc, err in results:
        assert rc == 0 and out is not None, err
    return [out for out, _, _ in results]


@pytest.mark.parametrize("way", ["ddp_of_dynamo", "dynamo_of_ddp", "ddp_of_dynamo_split"])
def test_ddp_trains_as_eager_ddp_on_two_ranks(trained, way):
    for out in trained:
        eager, got = out["eager"], out[way]
        assert len(got["losses"]) == 20
        assert _close(got["losses"], eager["losses"]), (out["rank"], got["losses"], eager["losses"])
        # gradients were all-reduced as eager's: the weights after 20 steps agree
        assert _close(got["weights"], eager["weights"], rtol=1e-4, atol=1e-5), (got["weights"], eager["weights"])
        # the forward and the backward ran compiled on this rank, nothing fell back
        assert got["native_runs"] >= 18 and got["backward_native_runs"] >= 18, got
        assert got["aborts"] == 0, got
        # DDP's communication hook ran once per bucket per step, as under eager DDP
        assert got["hook_calls"] == eager["hook_calls"] >= 20, (got["hook_calls"], eager["hook_calls"])
        if way == "ddp_of_dynamo_split":  # two parts, each compiled with its own backward
            assert "trace cut (a DDP bucket's parameters)" in got["report"], got["report"]
            assert got["backward_native_runs"] >= 2 * 17, got
    # ranks saw different data, and all-reduced gradients kept their weights equal
    assert trained[0][way]["losses"] != trained[1][way]["losses"]
    assert _close(trained[0][way]["weights"], trained[1][way]["weights"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("way", ["shard_then_dynamo", "dynamo_then_shard"])
def test_fsdp2_sharded_blocks_train_compiled_as_eager(way, fsdp_trained):
    for out in fsdp_trained:
        eager, got = out["eager"], out[way]
        assert _close(got["losses"], eager["losses"]), (out["rank"], got["losses"], eager["losses"])
        # each sharded block's forward and backward ran compiled on this rank (FSDP's hooks, which
        # gather the parameters before and free them after, run around it in CPython)
        assert got["backward_native_runs"] >= 2 * 16 and got["native_runs"] >= 4 * 16, got["report"]
        assert "Block.forward" in got["report"] and "backward graph: Block.forward.backward_graph" in got["report"]


@pytest.fixture(scope="module")
def fsdp_trained():
    results, _ = _run_ranks("fsdp", timeout=240)
    for out, rc, err in results:
        assert rc == 0 and out is not None, err
    return [out for out, _, _ in results]


def test_a_killed_rank_ends_its_peer_with_an_error():
    results, took = _run_ranks("killed", timeout=90)
    (r0, rc0, err0), (r1, rc1, _) = results
    assert rc1 == 3 and r1 is None  # rank 1 died mid-step
    assert r0 is not None and r0["error"], (rc0, r0, err0)
    assert took < 60, f"the surviving rank took {took:.1f} s to fail"


_KEEPS_OPS = r'''
import torch
import torch.distributed.tensor  # registers DTensor's sharding strategies, keyed by OpOverload
before = {}
for pname in dir(torch.ops.aten):
    packet = torch.ops.aten.__dict__.get(pname)
    if isinstance(packet, torch._ops.OpOverloadPacket):
        for oname, ov in packet.__dict__.items():
            if isinstance(ov, torch._ops.OpOverload):
                before[(pname, oname)] = ov
import dynamo
f = dynamo.optimize(lambda x: (x.t().squeeze() * 2).detach().unsqueeze(0))
for _ in range(2):
    f(torch.randn(3, 4))
changed = [k for k, ov in before.items() if getattr(getattr(torch.ops.aten, k[0]), k[1]) is not ov]
print(len(before), changed)
assert len(before) > 100 and not changed, changed
'''


def test_importing_dynamo_keeps_torchs_op_objects():
    """Importing and using dynamo must not replace the OpOverload objects torch already made:
    DTensor (and so FSDP2) finds its sharding strategies by them; one replaced aten.detach.default
    and broke eager FSDP2 in any program that imported dynamo."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"), DYNAMO_CACHE_DIR="off")
    r = subprocess.run([sys.executable, "-c", _KEEPS_OPS], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
