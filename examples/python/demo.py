"""Demo: an unmodified PyTorch model run eagerly and through dynamo.optimize, with correctness,
speedup and what was compiled printed. The model code below is plain PyTorch: nothing in it
knows about dynamo."""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo


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


def compare(name, eager_fn, fast_fn, *args):
    want = eager_fn(*args)
    t0 = time.perf_counter()
    got = fast_fn(*args)        # first call: recorded (and run) by the interpreter, then compiled
    first_ms = (time.perf_counter() - t0) * 1e3
    got = fast_fn(*args)        # native from here on
    flat_w = want if isinstance(want, tuple) else (want,)
    flat_g = got if isinstance(got, tuple) else (got,)
    err = max((g - w).abs().max().item() for g, w in zip(flat_g, flat_w))
    ok = all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(flat_g, flat_w))
    t_eager = median_ms(lambda: eager_fn(*args))
    t_jit = median_ms(lambda: fast_fn(*args))
    print(f"{name}")
    print(f"  correctness: max |dynamo - eager| = {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  eager {t_eager:.2f} ms, dynamo {t_jit:.2f} ms: {t_eager / t_jit:.1f}x "
          f"(first call incl. recording + compile: {first_ms:.0f} ms)")
    return ok


def main():
    torch.manual_seed(0)
    torch.set_num_threads(max(torch.get_num_threads(), 2))
    print(f"dynamo demo: torch {torch.__version__}, {torch.get_num_threads()} thread(s), float32")
    print("(eager times include its fresh allocation per intermediate -- page faults on large tensors --\n"
          " which fused code avoids; dynamo's outputs come from recycled buffers)\n")
    ok = True
    with torch.no_grad():
        model = NormActBlock(1024).eval()
        reference = NormActBlock(1024).eval()
        reference.load_state_dict(model.state_dict())
        x, bias = torch.randn(4096, 1024), torch.randn(1024)
        fast_model = dynamo.optimize(model)
        ok &= compare("NormActBlock (LayerNorm, GELU, residual, softmax, mean) on [4096, 1024]",
                      reference, fast_model, x, bias)
        print()
        xa = torch.randn(4096, 2048)
        ok &= compare("activations(x): 9 pointwise ops on [4096, 2048]", activations, dynamo.optimize(activations), xa)
        print()
        print(dynamo.explain(model, x, bias))
    c = dynamo.counters()
    print(f"\ncounters: {c['calls']} calls, {c['native_runs']} native, {c['interpreted_runs']} recorded, "
          f"{c['traces_compiled']} traces compiled in {c['compile_seconds'] * 1e3:.0f} ms, {c['aborts']} aborts")
    if not ok:
        raise SystemExit("demo: dynamo's result differs from eager")


if __name__ == "__main__":
    main()
