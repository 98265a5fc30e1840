"""Python-level numbers for `make bench`, side by side with eager PyTorch in one run:

  1. per-call overhead of a compiled 2-input pointwise function on tiny tensors (target <= 5 us);
  2. the same kind of functions on large tensors (speedup);
  3. first-call latency, record + compile, of a 20-op trace (target <= 100 ms);
  4. a small transformer encoder block (target >= 1.3x over eager);
  5. side exits: a call whose branch leaves the trace through a natively linked side exit vs. one
     that stays on the recorded path, and a branchy program (two data-dependent branches) eager
     vs. JIT.

Prints; asserts nothing (a wrong result is reported and makes the exit status non-zero).
"""
import os
import sys
import time

import torch

import dynamo

# The transformer block is the demo's (examples/python/demo.py): one definition for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from demo import EncoderBlock  # noqa: E402


def per_call_us(fn, args, n):
    for _ in range(50):
        fn(*args)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def median_ms(fn, args, reps=9):
    for _ in range(2):
        fn(*args)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def axpy(x, y):
    return x * 2.0 + y


def gelu_tanh(x, y):
    a = x + y
    return 0.5 * a * (1 + torch.tanh(0.7978845608 * (a + 0.044715 * a * a * a)))


def twenty_ops(x, y):
    a = x * y + 1.0
    b = torch.sigmoid(a) * x
    c = torch.tanh(b - y) + a
    d = torch.exp(-c.abs()) * 0.5
    e = torch.relu(d + b) - torch.clamp(a, -1.0, 1.0)
    f = torch.where(e > 0, e, d) * 3.0
    g = (f - f.mean(-1, keepdim=True)) / (f.std(-1, keepdim=True) + 1e-5)
    return torch.softmax(g + x, dim=-1)


def branch(x, w):
    h = x * w
    if h.sum() > 0:
        return torch.relu(h) + 1
    return torch.tanh(h) - 1


def branchy(x, b):
    h = torch.nn.functional.gelu(x + b)
    if h.mean() > 0.2:                  # data-dependent branch 1
        h = h * torch.sigmoid(h)
    else:
        h = torch.tanh(h) * 0.5
    if (h.amax(-1) > 2.0).any():        # data-dependent branch 2
        h = torch.softmax(h, dim=-1)
    else:
        h = h - h.mean(-1, keepdim=True)
    return h


def check(name, got, want):
    ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    if not ok:
        print(f"  !! {name}: dynamo differs from eager (max diff {(got - want).abs().max().item():.2e})")
    return ok


def main():
    torch.manual_seed(0)
    torch.set_num_threads(max(torch.get_num_threads(), 2))
    print(f"dynamo Python-level benchmarks: torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    ok = True
    with torch.no_grad():
        print("\n1. per-call overhead, compiled 2-input pointwise function, 16 elements")
        x, y = torch.randn(16), torch.randn(16)
        fast = dynamo.optimize(axpy)
        fast(x, y)
        ok &= check("axpy", fast(x, y), axpy(x, y))
        e, j = per_call_us(axpy, (x, y), 20000), per_call_us(fast, (x, y), 20000)
        print(f"   eager {e:6.2f} us/call   dynamo {j:6.2f} us/call   (target <= 5 us)")

        print("\n2. the same kinds of functions on large tensors (2^22 float32 elements)")
        big_x, big_y = torch.randn(1 << 22), torch.randn(1 << 22)
        for fn in (axpy, gelu_tanh):
            fast = dynamo.optimize(fn)
            fast(big_x, big_y)
            ok &= check(fn.__name__, fast(big_x, big_y), fn(big_x, big_y))
            e, j = median_ms(fn, (big_x, big_y)), median_ms(fast, (big_x, big_y))
            print(f"   {fn.__name__:10s} eager {e:8.2f} ms   dynamo {j:8.2f} ms   {e / j:6.1f}x")

        print("\n3. first call of a 20-op function (record + compile + run), [256, 512]")
        sx, sy = torch.randn(256, 512), torch.randn(256, 512)
        lat = []
        for _ in range(5):
            dynamo.reset()
            fast = dynamo.optimize(twenty_ops)
            t0 = time.perf_counter()
            fast(sx, sy)
            lat.append((time.perf_counter() - t0) * 1e3)
        ops = len(dynamo.explain(twenty_ops, sx, sy).traces[0].ops)
        ok &= check("twenty_ops", fast(sx, sy), twenty_ops(sx, sy))
        e = median_ms(twenty_ops, (sx, sy))
        print(f"   {ops} ATen ops recorded; first call median {sorted(lat)[2]:.1f} ms "
              f"(target <= 100 ms); later calls: eager {e:.3f} ms, dynamo {median_ms(fast, (sx, sy)):.3f} ms")

        print("\n4. transformer encoder block (dim 256, 4 heads, MLP 1024), batch 8 x 128 tokens")
        block = EncoderBlock(256, 4, 1024).eval()
        ref = EncoderBlock(256, 4, 1024).eval()
        ref.load_state_dict(block.state_dict())
        xt = torch.randn(8, 128, 256)
        fast = dynamo.optimize(block)
        fast(xt)
        ok &= check("EncoderBlock", fast(xt), ref(xt))
        e, j = median_ms(ref, (xt,), 21), median_ms(fast, (xt,), 21)
        c = dynamo.counters()
        print(f"   eager {e:.2f} ms   dynamo {j:.2f} ms   {e / j:.2f}x (target >= 1.3x); "
              f"native runs {c['native_runs']}, aborts {c['aborts']}")
        if c["native_runs"] == 0:
            print(dynamo.explain(ref, xt))

        print("\n5. side exits (64-element inputs; then [256, 1024] for the branchy program)")
        dynamo.reset()
        fast = dynamo.optimize(branch)
        pos, neg, w = torch.ones(64) * 2, -torch.ones(64) * 2, torch.ones(64)
        for _ in range(dynamo.config.hotexit + 2):  # record, then make the exit hot: a side trace
            fast(pos, w)
            fast(neg, w)
        ok &= check("branch+", fast(pos, w), branch(pos, w)) & check("branch-", fast(neg, w), branch(neg, w))
        linked = "linked natively" in dynamo.report()
        t_straight, t_exit = per_call_us(fast, (pos, w), 5000), per_call_us(fast, (neg, w), 5000)
        print(f"   straight trace {t_straight:6.2f} us/call   taken side exit -> side trace {t_exit:6.2f} us/call "
              f"({'linked natively' if linked else 'dispatched from Python'}); eager {per_call_us(branch, (pos, w), 5000):.2f} us")
        dynamo.reset()
        fast = dynamo.optimize(branchy)
        g = torch.Generator().manual_seed(0)
        base = [torch.randn(256, 1024, generator=g) * s + m for s, m in ((1.0, 1.0), (0.3, -1.0), (0.05, 1.0),
                                                                           (0.3, -1.0))]
        base[3][0, 0] = 5.0  # mean low with one large value
        inputs = [(x, torch.zeros(1024)) for x in base]
        for _ in range(3 * dynamo.config.hotexit):  # nested exits get hot one after another
            for a in inputs:
                fast(*a)
        resumed = dynamo.counters()["exits_resumed"]
        for a in inputs:
            ok &= check("branchy", fast(*a), branchy(*a))
        e = sum(median_ms(branchy, a) for a in inputs) / len(inputs)
        j = sum(median_ms(fast, a) for a in inputs) / len(inputs)
        c = dynamo.counters()
        print(f"   branchy program (2 data-dependent branches), 4 inputs: eager {e:.2f} ms   dynamo {j:.2f} ms   {e / j:.2f}x "
              f"({c['side_traces_compiled']} side traces; exits resumed in the interpreter while timing: "
              f"{c['exits_resumed'] - resumed})")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
