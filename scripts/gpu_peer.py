"""The peer on the same GPU: the computations of gpu_check's benchmark cases, plus a transformer
encoder block and an MLP block, run by torch eagerly and through torch.compile (Inductor /
Triton), timed with CUDA events in one run, printed beside dynamo's times from gpu_check's
output. Part of the GPU bundle (make gpu-bundle); run.sh calls it after gpu_check when the
machine's python3 has a torch with CUDA.

    python3 peer.py [--gpu-check-log FILE] [--iters N] [--no-compile] [--device cpu] [--small]

--device cpu --no-compile --small: a dry run on a machine without a GPU (torch 1.13 has no
torch.compile), which checks the script itself."""
import argparse
import re
import sys
import time

import torch
import torch.nn.functional as F

# name in gpu_check's table -> (label, bytes moved once each; filled in by the case builders)
CASES = []


def case(name, label, gpu_check_name=None):
    def wrap(build):
        CASES.append((name, label, gpu_check_name, build))
        return build
    return wrap


# The bench cases of tests/gpu/cases.h, the same formulas and sizes (--small divides them).

@case("chain", "6-op pointwise chain, 2 x 2^26 f32", "bench_chain")
def _chain(dev, dt, small):
    n = (1 << 26) // small
    a, b = torch.randn(n, device=dev, dtype=dt), torch.randn(n, device=dev, dtype=dt)

    def f(a, b):
        return (torch.sigmoid(a * b + 1.0) * a - b) * 0.5
    return f, (a, b), 3 * n * a.element_size(), 0


@case("softmax", "softmax rows, 16384 x 4096 f32", "bench_softmax")
def _softmax(dev, dt, small):
    x = torch.randn(16384 // small, 4096, device=dev, dtype=dt)
    return (lambda x: torch.softmax(x, 1)), (x,), 2 * x.numel() * x.element_size(), 0


@case("layer_norm", "layer norm (affine), 65536 x 1024 f32", "bench_layer_norm")
def _layer_norm(dev, dt, small):
    x = torch.randn(65536 // small, 1024, device=dev, dtype=dt)
    w, b = torch.randn(1024, device=dev, dtype=dt), torch.randn(1024, device=dev, dtype=dt)
    return (lambda x, w, b: F.layer_norm(x, [1024], w, b, 1e-5)), (x, w, b), 2 * x.numel() * x.element_size(), 0


@case("bias_gelu", "bias + GELU, 16384 x 4096 f32", "bench_bias_gelu")
def _bias_gelu(dev, dt, small):
    x, b = torch.randn(16384 // small, 4096, device=dev, dtype=dt), torch.randn(4096, device=dev, dtype=dt)
    return (lambda x, b: F.gelu(x + b)), (x, b), 2 * x.numel() * x.element_size(), 0


@case("sum_amax", "sum + amax of 2^26 f32", "bench_sum")
def _sum(dev, dt, small):
    x = torch.randn((1 << 26) // small, device=dev, dtype=dt)
    return (lambda x: (x.sum(), x.amax())), (x,), x.numel() * x.element_size(), 0


def _encoder(dt_name):
    @case(f"encoder_{dt_name}", f"encoder block fwd, dim 1024, 16 heads, 8 x 512, {dt_name}",
          f"block_encoder_{dt_name}")
    def build(dev, _dt, small):
        dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dt_name]
        layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
        layer = layer.to(device=dev, dtype=dt).eval()
        x = torch.randn(8 // min(small, 8), 512 // small, 1024, device=dev, dtype=dt)
        tokens, seq = x.shape[0] * x.shape[1], x.shape[1]
        # per token: the QKV, output and two feed-forward products, and the two attention products
        flops = tokens * (2 * 1024 * 3072 + 2 * 1024 * 1024 + 2 * 2 * 1024 * 4096 + 2 * 2 * seq * 1024)
        return layer, (x,), 0, flops
    return build


_encoder("f32")
_encoder("bf16")


@case("mlp", "MLP block fwd, 8 x 512 x 1024 -> 4096 -> 1024, GELU, f32", "block_mlp_f32")
def _mlp(dev, dt, small):
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    mlp = mlp.to(device=dev, dtype=dt).eval()
    x = torch.randn(8 * 512 // small, 1024, device=dev, dtype=dt)
    return mlp, (x,), 0, x.shape[0] * 2 * 2 * 1024 * 4096


def timed_ms(fn, args, iters, dev):
    """Median-free: CUDA events around `iters` back-to-back calls after 5 warm-ups (wall clock
    on the CPU); milliseconds per call."""
    with torch.no_grad():
        for _ in range(5):
            fn(*args)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn(*args)
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        return (time.perf_counter() - t0) * 1e3 / iters


def device_limits(dev, small, iters):
    """What this device does at best, measured here: a device-to-device copy (GB/s, bytes read
    and written) and square matrix products in float32 (full precision, no TF32) and bfloat16
    (TFLOP/s), the ceilings the cases' rates are read against."""
    n = (1 << 28) // (small * small)
    a = torch.empty(n, device=dev)
    b = torch.empty_like(a)
    copy_ms = timed_ms(lambda: b.copy_(a), (), iters, dev)
    out = {"copy": f"{2 * a.numel() * 4 / (copy_ms * 1e6):.0f} GB/s"}
    del a, b
    m = 8192 // small
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dt, key in ((torch.float32, "f32 matmul"), (torch.bfloat16, "bf16 matmul")):
            x, y = torch.randn(m, m, device=dev, dtype=dt), torch.randn(m, m, device=dev, dtype=dt)
            ms = timed_ms(torch.mm, (x, y), max(iters // 5, 1), dev)
            out[key] = f"{2 * m ** 3 / (ms * 1e9):.1f} TFLOP/s"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def rate(ms, nbytes, flops):
    """A case's rate: GB/s for the memory-bound ones, TFLOP/s for the blocks."""
    if not ms:
        return "-"
    if nbytes:
        return f"{nbytes / (ms * 1e6):.0f} GB/s"
    return f"{flops / (ms * 1e9):.1f} TFLOP/s" if flops else "-"


def dynamo_times(path):
    """{gpu_check case name: ms} from gpu_check's bandwidth table (its first row per case, the
    default knobs)."""
    out = {}
    if not path:
        return out
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        m = re.match(r"\s+((?:bench|block)_\w+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = float(m.group(2))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-check-log", help="gpu_check's output (its table gives dynamo's times)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true", help="eager only (no torch.compile)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="sizes divided by 64 (a dry run)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("peer: SKIPPED: this torch has no CUDA device")
        return 3
    compile_ok = not a.no_compile and hasattr(torch, "compile")
    if not a.no_compile and not compile_ok:
        print(f"peer: torch {torch.__version__} has no torch.compile: eager only")
    small = 64 if a.small else 1
    ours = dynamo_times(a.gpu_check_log)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"peer: torch {torch.__version__} on {name}; CUDA events over {a.iters} calls after 5 warm-ups")
    limits = device_limits(dev, small, a.iters)
    print("peer: this device at best: " + ", ".join(f"{k} {v}" for k, v in limits.items()))
    print(f"  {'case':58s} {'eager ms':>9s} {'compile ms':>10s} {'dynamo ms':>9s} {'dynamo/compile':>14s} "
          f"{'dynamo rate':>15s} {'compile rate':>15s}")
    for key, label, ours_name, build in CASES:
        try:
            fn, args, nbytes, flops = build(dev, torch.float32, small)
            eager = timed_ms(fn, args, a.iters, dev)
            comp = None
            if compile_ok:
                torch._dynamo.reset()
                cfn = torch.compile(fn)
                comp = timed_ms(cfn, args, a.iters, dev)
            mine = ours.get(ours_name) if ours_name else None
            ratio = f"{comp / mine:.2f}x" if comp and mine else "-"
            print(f"  {label:58s} {eager:9.3f} {comp if comp is not None else float('nan'):10.3f} "
                  f"{mine if mine is not None else float('nan'):9.3f} {ratio:>14s} "
                  f"{rate(mine, nbytes, flops):>15s} {rate(comp, nbytes, flops):>15s}")
        except Exception as e:  # noqa: BLE001 -- one case failing says why and the others still run
            print(f"  {label:58s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print("  (dynamo/compile: torch.compile's time over dynamo's, above 1 dynamo is faster; dynamo's blocks are "
          "the Python front end's CPU recordings, tests/gpu/traces, run by gpu_check with inputs scaled by 0.02)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
