"""Demo: unmodified PyTorch models run eagerly and through dynamo.optimize, with correctness,
speedup and what was compiled printed. The model code below is plain PyTorch: nothing in it
knows about dynamo. Inference under torch.no_grad(), float32. The speedups are against eager
PyTorch as this process runs it: the first lines say with which BLAS and allocator
(perf/baseline.py)."""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
try:
    import baseline
except ImportError:  # a copy of the demo without the repository's perf/
    baseline = None


class NormActBlock(nn.Module):
    """A pre-norm residual block's memory-bound half, as people write it (matmuls, which
    dynamo calls in LibTorch, are left out: on this CPU they would dominate both sides)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x, bias):
        h = F.gelu(self.norm(x) + bias)
        h = x + self.gamma * h
        return torch.softmax(h, dim=-1), h.mean(dim=-1)


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block: multi-head self-attention, then an MLP."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // h), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyEncoder(nn.Module):
    """A small transformer encoder classifier: blocks in a ModuleList, mean pooling, a head."""

    def __init__(self, dim=256, heads=4, hidden=1024, layers=2, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class SmallCNN(nn.Module):
    """A small image classifier: conv-batchnorm-relu stages, pooling, a linear head."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        x = self.features(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))




def activations(x):
    """A function of pointwise work: one fused loop instead of nine passes over memory."""
    y = torch.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x))
    return 0.5 * x * (1 + y) + torch.sigmoid(x) * torch.exp(-x.abs())


def median_ms(fn, reps=11):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def _fallback_reasons(fast):
    of = fast.forward if isinstance(fast, nn.Module) else fast
    return [a.reason for a in getattr(of, "attempts", []) if a.compiled is None]


def compare(name, eager_fn, fast_fn, *args):
    before = dynamo.counters()
    want = eager_fn(*args)
    t0 = time.perf_counter()
    got = fast_fn(*args)        # first call: recorded (and run) by the interpreter, then compiled
    #                             (or, in a later run, the trace an earlier one stored: no recording)
    first_ms = (time.perf_counter() - t0) * 1e3
    got = fast_fn(*args)        # native from here on
    flat_w = want if isinstance(want, tuple) else (want,)
    flat_g = got if isinstance(got, tuple) else (got,)
    err = max((g - w).abs().max().item() for g, w in zip(flat_g, flat_w))
    ok = all(g.shape == w.shape and torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(flat_g, flat_w))
    openblas = baseline is not None and baseline.openblas_threads.available()
    t_eager = median_ms(lambda: eager_fn(*args))
    setting = "OpenBLAS's threads" if openblas else f"{torch.get_num_threads()} threads"
    if openblas:
        # A user's remedy for OpenBLAS's threads fighting ATen's spinning OpenMP threads on few
        # cores (OPENBLAS_NUM_THREADS=1): eager is timed that way too, and the faster counts.
        with baseline.openblas_threads(1):
            t_one = median_ms(lambda: eager_fn(*args))
        if t_one < t_eager:
            t_eager, setting = t_one, "OpenBLAS on 1 thread"
    t_jit = median_ms(lambda: fast_fn(*args))
    after = dynamo.counters()
    delta = {k: after[k] - before[k] for k in ("traces_compiled", "native_runs", "aborts", "eager_runs",
                                                   "traces_from_store")}
    how = "from the trace store" if delta["traces_from_store"] else "incl. recording + compile"
    print(f"{name}")
    print(f"  max |dynamo - eager| = {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  eager {t_eager:8.2f} ms ({setting})   dynamo {t_jit:8.2f} ms   speedup vs eager {t_eager / t_jit:5.2f}x "
          f"(first call {how}: {first_ms:.0f} ms)")
    print(f"  traces compiled {delta['traces_compiled']}, from the trace store {delta['traces_from_store']}, "
          f"native runs {delta['native_runs']}, fallbacks {delta['aborts']}")
    for r in dict.fromkeys(_fallback_reasons(fast_fn)):
        print(f"    fell back: {r}")
    return ok


def keep_freed_memory():
    """glibc: serve every block from the heap and keep what is freed (mallopt M_MMAP_MAX = 0,
    M_TRIM_THRESHOLD = 1 GiB). False where that is not glibc or it refuses."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(max(torch.get_num_threads(), 2))
    print(f"dynamo demo: torch {torch.__version__}, {torch.get_num_threads()} thread(s), float32, inference")
    if baseline is not None:
        blas, alloc, line = baseline.blas(), baseline.allocator(), baseline.describe()
        if alloc.startswith("glibc malloc (default") and keep_freed_memory():
            # glibc's defaults hand large freed blocks back to the kernel, so every eager
            # intermediate of a few MB is page-faulted in again and a speedup would mostly measure
            # that; the settings PyTorch's CPU tuning guide suggests avoid it.
            tuned = "glibc malloc, tuned as MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824 (freed memory kept)"
            line = line.replace(alloc, tuned)
        print("eager:", line)
        print('(every "speedup vs eager" below is against eager PyTorch with this BLAS and allocator'
              + (', its\n matrix products on OpenBLAS\'s threads or on one thread, whichever is faster)'
                 if baseline.openblas_threads.available() else ')'))
    else:
        blas = "unknown"
        print(f"eager: torch {torch.__version__}, {torch.get_num_threads()} threads, BLAS and allocator unknown "
              "(perf/baseline.py not found); every speedup below is against it")
    if blas.startswith("reference BLAS"):
        print("(this eager PyTorch multiplies matrices with the reference BLAS; dynamo's own GEMM then wins every\n"
              " product -- most of the transformer's speedup is that: install libopenblas0-pthread for a fair baseline)")
    print()
    ok = True
    with torch.no_grad():
        def twins(cls, *a):
            m, ref = cls(*a).eval(), cls(*a).eval()
            ref.load_state_dict(m.state_dict())
            return dynamo.optimize(m), ref

        enc, enc_ref = twins(TinyEncoder)
        ok &= compare("TinyEncoder: 2 pre-norm transformer blocks (dim 256, 4 heads), batch 8 x 128 tokens",
                      enc_ref, enc, torch.randn(8, 128, 256))
        print()
        cnn, cnn_ref = twins(SmallCNN)
        ok &= compare("SmallCNN: conv-BN-ReLU-pool x2, avg pool, linear; batch 32 x 3 x 32 x 32",
                      cnn_ref, cnn, torch.randn(32, 3, 32, 32))
        print()
        block, block_ref = twins(NormActBlock, 1024)
        x, bias = torch.randn(4096, 1024), torch.randn(1024)
        ok &= compare("NormActBlock (LayerNorm, GELU, residual, softmax, mean) on [4096, 1024]",
                      block_ref, block, x, bias)
        print()
        xa = torch.randn(4096, 2048)
        ok &= compare("activations(x): 9 pointwise ops on [4096, 2048]", activations, dynamo.optimize(activations), xa)
        print()
        print(dynamo.explain(block_ref, x, bias))
    c = dynamo.counters()
    print(f"\ncounters: {c['calls']} calls, {c['native_runs']} native, {c['interpreted_runs']} recorded, "
          f"{c['traces_compiled']} traces compiled, {c['traces_from_store']} from the trace store (an earlier run's), "
          f"{c['compile_seconds'] * 1e3:.0f} ms compiling, {c['aborts']} fallbacks")
    if not ok:
        raise SystemExit("demo: dynamo's result differs from eager")


if __name__ == "__main__":
    main()
