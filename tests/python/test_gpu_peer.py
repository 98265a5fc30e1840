"""scripts/gpu_peer.py, the GPU bundle's torch.compile peer (docs/GPU.md), in its dry run: on
the CPU, eager only, small sizes. It must run every case and read dynamo's times from a
gpu_check table."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_peer.py")


def test_dry_run_times_every_case_and_reads_dynamos_table(tmp_path):
    log = tmp_path / "gpu_check.log"
    log.write_text("bandwidth (bytes ...)\n  case  ms  GB/s  % of copy\n"
                   "  device copy (D2D)                              4183       100%\n"
                   "  bench_chain                       0.230       3509        84%\n"
                   "  bench_chain unroll 1              0.300       2509        64%\n"
                   "  bench_softmax                     0.133       4039        97%\n"
                   "  block_mlp_f32                     1.500         90         2%\n")
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--no-compile", "--small", "--iters", "1",
                        "--gpu-check-log", str(log)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    timed = [line for line in r.stdout.splitlines() if re.search(r"\s\d+\.\d{3}\s", line)]
    assert len(timed) == 8 and "FAILED" not in r.stdout, r.stdout
    chain = next(x for x in r.stdout.splitlines() if "6-op pointwise chain" in x)
    assert "0.230" in chain, chain  # dynamo's time from the table (its default-knob row)
    mlp = next(x for x in r.stdout.splitlines() if "MLP block" in x)
    assert "1.500" in mlp, mlp
