"""Python-level numbers for `make bench`, side by side with eager PyTorch in one run:

  1. per-call overhead of a compiled 2-input pointwise function on tiny tensors (target <= 5 us);
  2. the same kind of functions on large tensors (speedup);
  3. first-call latency, record + compile, of a 20-op trace (target <= 100 ms);
  4. a small transformer encoder block (target >= 1.3x over eager);
  5. side exits: a call whose branch leaves the trace through a natively linked side exit vs. one
     that stays on the recorded path, and a branchy program (two data-dependent branches) eager
     vs. JIT;
  6. a stitch: a function with one call dynamo cannot record in the middle (a dynamo.disable'd
     helper), run as native trace -> that call in Python -> native trace, per call, beside the
     same function without the call and eager;
  7. a Python number that changes every call (a scalar input of one trace);
  8. sizes that change between calls (size families): an encoder layer over 400 shapes, resnet18
     over batch sizes 1..16;
  9. attention: scaled_dot_product_attention over [1, 12 heads, L, 64] and nn.MultiheadAttention
     (768, 12 heads) self-attention at L = 128 and 512, eager (torch's CPU flash attention) vs.
     torch.compile vs. dynamo (its own fused kernel, dynamo::attention);
 10. training steps (forward, loss, backward, optimizer step) of an MLP with SGD and an encoder
     layer with AdamW, eager vs. compiled, losses compared every step (each side's fastest step
     over three rounds of 20-step blocks, the sides in turn); in a child process
     (`bench_python.py --training`).

Every case that a user could also hand to torch.compile gets its row: torch.compile with
Inductor's defaults (torch._inductor.config.freezing = True for inference, as PyTorch's CPU guide
recommends), its first call a cold compile (TORCHINDUCTOR_CACHE_DIR an empty directory per run);
"vs compile" is torch.compile's time over dynamo's (> 1: dynamo is faster).

The first line says what eager PyTorch runs with (BLAS, allocator: perf/baseline.py). Section 2
also times eager in child processes (`bench_python.py --eager-only NAME`) under jemalloc (LD_PRELOAD)
and under glibc tuned to keep freed memory (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_), and its
speedup is against the fastest eager.

Prints; asserts nothing (a wrong result is reported and makes the exit status non-zero).
"""
import copy
import os
import subprocess
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from baseline import allocator, describe, jemalloc_env  # noqa: E402

# The transformer block is the demo's (examples/python/demo.py): one definition for both. It and
# dynamo are imported in main(), so that an --eager-only child runs plain PyTorch.
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))

LARGE = 1 << 22  # elements of section 2's tensors
# glibc set to keep freed memory (no page faults per call): the environment of a child process.
GLIBC_TUNED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


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


def interleaved_ms(f, g, args, reps=15):
    """Median ms per call of f and of g, called in turns (each warmed first): on a shared
    machine both see the same load."""
    for _ in range(5):
        f(*args)
        g(*args)
    tf, tg = [], []
    for _ in range(reps):
        for fn, ts in ((f, tf), (g, tg)):
            t0 = time.perf_counter()
            fn(*args)
            ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(tf)[reps // 2], sorted(tg)[reps // 2]


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


LARGE_FUNCTIONS = {"axpy": axpy, "gelu_tanh": gelu_tanh}


def _bump(counter):
    counter[0] += 1


_ticks = [0]
_tick = _bump  # marked dynamo.disable in main(), after dynamo is imported


def stitched(x, y):
    h = x * y + 1
    _tick(_ticks)  # not recordable (dynamo.disable): the trace stops before it, goes on after it
    return torch.tanh(h) * x


def unstitched(x, y):
    h = x * y + 1
    return torch.tanh(h) * x


def set_threads():
    torch.set_num_threads(max(torch.get_num_threads(), 2))


def cold_inductor_cache():
    """An empty TORCHINDUCTOR_CACHE_DIR for this process (removed at exit), unless one is set:
    torch.compile's first calls are then cold compiles, as a user's first run."""
    import atexit
    import shutil
    import tempfile
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        d = tempfile.mkdtemp(prefix="bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
        atexit.register(shutil.rmtree, d, True)


def inductor(fn, **kw):
    """torch.compile(fn) with Inductor's defaults and weight freezing (used under no_grad only):
    the peer a user would pick."""
    import torch._inductor.config as config
    config.freezing = True
    return torch.compile(fn, **kw)


def first_call_s(fn, args):
    """Seconds of fn's first call (a compile for torch.compile)."""
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def large_inputs():
    torch.manual_seed(0)
    return torch.randn(LARGE), torch.randn(LARGE)


def eager_only(name):
    """Child process: eager time of a section-2 function, printed as '<ms>\t<allocator>'."""
    set_threads()
    x, y = large_inputs()
    with torch.no_grad():
        ms = median_ms(LARGE_FUNCTIONS[name], (x, y))
    print(f"{ms:.6f}\t{allocator()}")


def eager_in_child(name, env):
    """(ms, allocator) of eager `name` timed in a child process with `env`; (None, why) if it failed."""
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--eager-only", name], env=env,
                           capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        return None, str(e)
    fields = r.stdout.strip().split("\t", 1)
    if r.returncode != 0 or len(fields) != 2:
        return None, (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return float(fields[0]), fields[1]


def check(name, got, want):
    ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    if not ok:
        print(f"  !! {name}: dynamo differs from eager (max diff {(got - want).abs().max().item():.2e})")
    return ok


def main():
    import dynamo
    from demo import EncoderBlock

    torch.manual_seed(0)
    set_threads()
    cold_inductor_cache()
    print(f"dynamo Python-level benchmarks: torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print("eager:", describe())
    ok = True
    with torch.no_grad():
        print("\n1. per-call overhead, compiled 2-input pointwise function, 16 elements")
        x, y = torch.randn(16), torch.randn(16)
        fast = dynamo.optimize(axpy)
        fast(x, y)
        ok &= check("axpy", fast(x, y), axpy(x, y))
        e, j = per_call_us(axpy, (x, y), 20000), per_call_us(fast, (x, y), 20000)
        peer = inductor(axpy)
        ok &= check("axpy (torch.compile)", peer(x, y), axpy(x, y))
        c = per_call_us(peer, (x, y), 20000)
        print(f"   eager {e:6.2f} us/call   torch.compile {c:6.2f} us/call   dynamo {j:6.2f} us/call   "
              f"(target <= 5 us)")

        print("\n2. the same kinds of functions on large tensors (2^22 float32 elements)")
        here = allocator()
        here_label = "glibc" if here.startswith("glibc") else here.split(" ")[0]
        jem_env = jemalloc_env()
        if "jemalloc" in here:
            jem_env = None
            print(f"   eager with {here} (this process already runs jemalloc: one eager column)")
        elif jem_env is None:
            print("   jemalloc: not installed (apt install libjemalloc2)")
            print(f"   eager with {here} only")
        else:
            print(f"   eager with {here} in this process, and in child processes with jemalloc (LD_PRELOAD) and with\n"
                  f"   glibc tuned ({' '.join(f'{k}={v}' for k, v in GLIBC_TUNED.items())}); speedup vs the fastest eager")
        big_x, big_y = large_inputs()
        for name, fn in LARGE_FUNCTIONS.items():
            fast = dynamo.optimize(fn)
            fast(big_x, big_y)
            ok &= check(name, fast(big_x, big_y), fn(big_x, big_y))
            e, j = median_ms(fn, (big_x, big_y)), median_ms(fast, (big_x, big_y))
            best, cols = e, f"eager {e:8.2f} ms ({here_label})"
            if jem_env is not None:
                ej, child_alloc = eager_in_child(name, jem_env)
                if ej is None:
                    cols += f"   jemalloc child failed: {child_alloc}"
                elif "jemalloc" not in child_alloc:
                    cols += f"   jemalloc not in effect in the child ({child_alloc}): not used"
                else:
                    best = min(e, ej)
                    cols += f" {ej:8.2f} ms (jemalloc)"
            if here.startswith("glibc malloc (default"):
                eg, child_alloc = eager_in_child(name, dict(os.environ, **GLIBC_TUNED))
                if eg is not None:
                    best = min(best, eg)
                    cols += f" {eg:8.2f} ms (glibc tuned)"
            peer = inductor(fn)
            peer(big_x, big_y)
            ok &= check(name + " (torch.compile)", peer(big_x, big_y), fn(big_x, big_y))
            c = median_ms(peer, (big_x, big_y))
            print(f"   {name:10s} {cols}   torch.compile {c:8.2f} ms   dynamo {j:8.2f} ms   {best / j:6.1f}x vs best "
                  f"eager, {c / j:5.2f}x vs compile")

        print("\n3. first call of a 20-op function (record + compile + run), [256, 512]")
        sx, sy = torch.randn(256, 512), torch.randn(256, 512)

        def first_calls(store):
            """Five first calls; store False records each time (the trace store off: after a reset,
            a stored trace would be run instead), True runs the trace an earlier call stored."""
            saved, dynamo.config.trace_store = dynamo.config.trace_store, store
            lat = []
            try:
                for _ in range(5):
                    dynamo.reset()
                    f = dynamo.optimize(twenty_ops)
                    t0 = time.perf_counter()
                    f(sx, sy)
                    lat.append((time.perf_counter() - t0) * 1e3)
            finally:
                dynamo.config.trace_store = saved
            return f, sorted(lat)[2]

        fast, first_ms = first_calls(False)
        _, stored_ms = first_calls(True)
        ops = len(dynamo.explain(twenty_ops, sx, sy).traces[0].ops)
        ok &= check("twenty_ops", fast(sx, sy), twenty_ops(sx, sy))
        e = median_ms(twenty_ops, (sx, sy))
        peer = inductor(twenty_ops)
        peer_first = first_call_s(peer, (sx, sy))
        ok &= check("twenty_ops (torch.compile)", peer(sx, sy), twenty_ops(sx, sy))
        print(f"   {ops} ATen ops recorded; first call median {first_ms:.1f} ms (target <= 100 ms; from the "
              f"trace store, as a later process runs it: {stored_ms:.1f} ms; torch.compile's cold first call "
              f"{peer_first:.1f} s); later calls: eager {e:.3f} ms, torch.compile {median_ms(peer, (sx, sy)):.3f} ms, "
              f"dynamo {median_ms(fast, (sx, sy)):.3f} ms")

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
        peer = inductor(copy.deepcopy(ref))
        peer_first = first_call_s(peer, (xt,))
        ok &= check("EncoderBlock (torch.compile)", peer(xt), ref(xt))
        tc = median_ms(peer, (xt,), 21)
        print(f"   eager {e:.2f} ms   torch.compile {tc:.2f} ms (first call {peer_first:.1f} s)   dynamo {j:.2f} ms   "
              f"{e / j:.2f}x vs eager (target >= 1.3x), {tc / j:.2f}x vs compile; native runs {c['native_runs']}, "
              f"aborts {c['aborts']}")
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
        peer = inductor(branchy)
        for a in inputs:
            ok &= check("branchy (torch.compile)", peer(*a), branchy(*a))
        tc = sum(median_ms(peer, a) for a in inputs) / len(inputs)
        print(f"   branchy program (2 data-dependent branches), 4 inputs: eager {e:.2f} ms   torch.compile {tc:.2f} ms "
              f"(graph breaks at the branches)   dynamo {j:.2f} ms   {e / j:.2f}x vs eager, {tc / j:.2f}x vs compile "
              f"({c['side_traces_compiled']} side traces; exits resumed in the interpreter while timing: "
              f"{c['exits_resumed'] - resumed})")

        print("\n6. a stitch (64-element inputs): native -> one call in Python -> native")
        dynamo.reset()
        dynamo.disable(_bump)
        a, b = torch.randn(64), torch.randn(64)
        st, plain = dynamo.optimize(stitched), dynamo.optimize(unstitched)
        for _ in range(3):
            st(a, b)
            plain(a, b)
        ok &= check("stitch", st(a, b), stitched(a, b))
        c0 = dynamo.counters()
        t_st, t_plain = per_call_us(st, (a, b), 5000), per_call_us(plain, (a, b), 5000)
        c = dynamo.counters()
        interpreted = c["interpreted_runs"] - c0["interpreted_runs"] + c["exits_resumed"] - c0["exits_resumed"]
        peer = inductor(stitched)
        ok &= check("stitch (torch.compile)", peer(a, b), stitched(a, b))
        print(f"   stitched {t_st:6.2f} us/call   without the call {t_plain:6.2f} us/call   stitch point "
              f"{t_st - t_plain:5.2f} us   eager {per_call_us(stitched, (a, b), 5000):.2f} us   torch.compile "
              f"{per_call_us(peer, (a, b), 5000):.2f} us (it traces the helper)  "
              f"(stitches {c['stitches']}, interpreted while timing: {interpreted})")

        print("\n7. a Python number that changes every call: softmax(x * scale) over 50 scales, [256, 1024]")
        dynamo.reset()
        xs = torch.randn(256, 1024)
        fast = dynamo.optimize(scaled_softmax)
        scales = [0.02 * (i + 1) for i in range(50)]
        for s in scales[:2]:
            fast(xs, s)
        ok &= all(check("scaled_softmax", fast(xs, s), scaled_softmax(xs, s)) for s in scales[::7])

        def sweep(fn):
            t0 = time.perf_counter()
            for s in scales:
                fn(xs, s)
            return (time.perf_counter() - t0) / len(scales) * 1e6

        e = min(sweep(scaled_softmax) for _ in range(5))
        j = min(sweep(fast) for _ in range(5))
        c = dynamo.counters()
        peer = inductor(scaled_softmax)
        t0 = time.perf_counter()
        ok &= all(check("scaled_softmax (torch.compile)", peer(xs, s), scaled_softmax(xs, s)) for s in scales)
        peer_first = time.perf_counter() - t0
        tc = min(sweep(peer) for _ in range(5))
        print(f"   eager {e:7.2f} us/call   torch.compile {tc:7.2f} us/call (its first sweep {peer_first:.1f} s)   "
              f"dynamo {j:7.2f} us/call   {e / j:.2f}x vs eager, {tc / j:.2f}x vs compile   (traces compiled "
              f"{c['traces_compiled']}, eager fallbacks {c['eager_runs']}; each scale is a scalar input)")

        print("\n8. sizes that change between calls: nn.TransformerEncoderLayer(256, 4 heads, ff 1024), "
              "batch sizes 1, 2, 4, 8 x 100 sequence lengths 1..512 (400 shapes, each called once per sweep)")
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True).eval()
        lengths = sorted({1 + (511 * k) // 99 for k in range(100)})
        order = [(b, n) for n in lengths for b in (2, 1, 4, 8)]  # lengths grow; batch sizes alternate
        ok &= size_sweep(("encoder layer", "shape"), layer, [torch.randn(b, n, 256) for b, n in order], 2)
        try:
            import torchvision
        except ImportError:
            torchvision = None
        if torchvision is None:
            print("   (resnet18 over batch sizes: torchvision is not installed; make deps installs it)")
        else:
            print("   torchvision resnet18, 64x64 images, batch sizes 1..16")
            torch.manual_seed(0)
            net = torchvision.models.resnet18().eval()
            ok &= size_sweep(("resnet18", "batch size"), net, [torch.randn(b, 3, 64, 64) for b in range(1, 17)], 3)

    with torch.no_grad():
        ok &= attention_section()

    with torch.no_grad():
        neighbour_section()

    print("\n10. training steps (grad on): forward, loss, backward and the optimizer step; eager vs. the forward "
          "and backward compiled and the optimizer step compiled (dynamo.optimize(opt.step); training.py);\n"
          "   in a fresh process (after sections 1-9 both sides ran 1.3-1.6x slower here)", flush=True)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--training"], timeout=900)
    ok &= r.returncode == 0

    print("\n12. data-parallel training: a 2-rank DistributedDataParallel step (two processes, gloo), eager vs. "
          "torch.compile vs. dynamo with its backward split at DDP's buckets and without", flush=True)
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_ddp.py")],
                       timeout=1800)
    ok &= r.returncode == 0

    print("\n13. language-model generate() with a KV cache (perf/decode.py): six decoder families at 6 layers, "
          "hidden 512, 8 heads, vocabulary 32000, 32 new tokens after 16, batch 1 in float32 and bfloat16, then batch "
          "8 in float32; eager vs. torch.compile (and with a StaticCache at batch 1) vs. dynamo, prefill and decode "
          "step, the decode step against the triad bandwidth", flush=True)
    # (bf16: this CPU's AVX512-BF16 products where it has them, float32 FMAs on widened bf16 on AVX2)
    # (static: torch.compile with transformers' StaticCache, at batch 1)
    for dtype, batch in (("float32", 1), ("bfloat16", 1), ("float32", 8)):
        sides = "eager,compile,static,dynamo" if batch == 1 else "eager,compile,dynamo"
        r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.py"),
                            "--families", "llama,qwen2,gpt2,opt,gpt_neox,phi3", "--sides", sides,
                            "--layers", "6", "--hidden", "512", "--heads", "8", "--vocab", "32000", "--new-tokens",
                            "32", "--prompt", "16", "--repeat", "3", "--dtype", dtype, "--batch", str(batch)],
                           timeout=3600)
        ok &= r.returncode == 0
    if not ok:
        sys.exit(1)


def attention_section():
    """Section 9."""
    import dynamo
    import torch.nn.functional as F
    print("\n9. attention, batch 1 (eager: torch's CPU flash attention; dynamo: its own fused kernel)")
    ok = True
    for n in (128, 512):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 12, n, 64) for _ in range(3))

        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)
        mha = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()

        def self_attention(x):
            return mha(x, x, x, need_weights=False)[0]
        x = torch.randn(1, n, 768)
        for name, fn, args in ((f"scaled_dot_product_attention [1, 12, {n}, 64]", sdpa, (q, k, v)),
                               (f"nn.MultiheadAttention(768, 12 heads), {n} tokens", self_attention, (x,))):
            dynamo.reset()
            fast, peer = dynamo.optimize(fn), inductor(fn)
            fast(*args)
            ok &= check(name, fast(*args), fn(*args)) & check(name + " (torch.compile)", peer(*args), fn(*args))
            own = "dynamo::attention" in dynamo.explain(fn, *args).traces[0].ops
            e, c, j = median_ms(fn, args, 15), median_ms(peer, args, 15), median_ms(fast, args, 15)
            print(f"   {name:48s} eager {e:7.3f} ms   torch.compile {c:7.3f} ms   dynamo {j:7.3f} ms   "
                  f"{e / j:5.2f}x vs eager, {c / j:5.2f}x vs compile" + ("" if own else "   (NOT the own kernel)"))
    return ok


def training_section():
    """Section 10, in its own process (main() runs it so)."""
    import dynamo
    cold_inductor_cache()
    torch.manual_seed(0)
    set_threads()
    ok = True
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                              torch.nn.GELU(), torch.nn.Linear(1024, 10))
    ok &= train_steps("MLP 784-1024-1024-10, batch 64, SGD with momentum", mlp, torch.randn(64, 784),
                      torch.randint(0, 10, (64,)), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    for p in (0.0, 0.1):  # 0.1: nn.TransformerEncoderLayer's default (masks drawn in eager's order: same losses)
        torch.manual_seed(0)
        enc = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=p, batch_first=True)
        ok &= train_steps(f"nn.TransformerEncoderLayer(256, 4 heads, ff 1024, dropout {p}), batch 8 x 64 tokens, "
                          "AdamW", enc, torch.randn(8, 64, 256), torch.randn(8, 64, 256),
                          lambda p: torch.optim.AdamW(p, lr=1e-3), same_masks=p == 0.0)
    try:
        import torchvision
    except ImportError:
        torchvision = None
    for whole in (False, True) if torchvision is not None else ():  # (chaotic in float32: 4 steps compared)
        torch.manual_seed(0)
        net = torchvision.models.resnet18(num_classes=10).train()
        dynamo.config.training_batch_norm = whole
        try:
            ok &= train_steps("torchvision resnet18 (train mode), 64x64, batch 8, SGD with momentum, "
                              + ("config.training_batch_norm = True: compiled whole" if whole else
                                 "by default: batch norm in training mode eager, the rest compiled apart"),
                              net, torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,)),
                              lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), compare_steps=4, peer=not whole)
        finally:
            dynamo.config.training_batch_norm = False
    sys.exit(0 if ok else 1)


def train_steps(name, model, x, target, make_opt, steps=20, rounds=3, compare_steps=None, same_masks=True, peer=True):
    """Section 10: training steps of model (an optimized copy) beside eager on the same data;
    losses compared every step; time per step (the fastest of the later steps: `rounds` rounds in
    which each side runs `steps` steps in a block, the sides in turn); the first steps' time.
    Then torch.compile's steps (the model and opt.step compiled, as PyTorch's tutorials do), its
    losses compared too where it draws the same dropout masks as eager (same_masks; Inductor
    draws its own); peer=False leaves it out."""
    import dynamo
    import torch.nn.functional as F
    dynamo.reset()
    eager, jit = model, dynamo.optimize(copy.deepcopy(model))
    peer_model = torch.compile(copy.deepcopy(model))
    loss_of = (lambda y: F.cross_entropy(y, target)) if target.dtype == torch.int64 else \
        (lambda y: F.mse_loss(y, target))

    def runner(m, compiled):
        opt = make_opt(m.parameters())
        update = {"dynamo": lambda: dynamo.optimize(opt.step),  # each group's update one trace
                  "compile": lambda: torch.compile(opt.step)}.get(compiled, lambda: opt.step)()
        count = [0]

        def step():
            torch.manual_seed(count[0])  # step k of either side draws the same dropout masks
            count[0] += 1
            loss = loss_of(m(x))
            opt.zero_grad()
            loss.backward()
            update()
            return loss.item()
        return step

    e_step, j_step = runner(eager, None), runner(jit, "dynamo")
    c_step = runner(peer_model, "compile") if peer else (lambda: float("nan"))
    e_losses, j_losses, c_losses, first, e_first, c_first = [], [], [], 0.0, 0.0, 0.0
    ok = True
    for _ in range(4):  # recording; then AOTAutograd and both graphs' recordings and compiles; timings
        t0 = time.perf_counter()
        j_losses.append(j_step())
        t1 = time.perf_counter()
        e_losses.append(e_step())
        t2 = time.perf_counter()
        c_losses.append(c_step())
        t3 = time.perf_counter()  # (torch.compile's first steps: its compiles, cold)
        first, e_first, c_first = first + (t1 - t0) * 1e3, e_first + (t2 - t1) * 1e3, c_first + (t3 - t2)

    def block(fn, n=steps):
        ts, out = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            out.append(fn())
            ts.append(time.perf_counter() - t0)
        return min(ts) * 1e3, out

    e = j = tc = float("inf")
    for _ in range(rounds):  # (blocks in turns: a burst of noise from a neighbour on the machine
        be, el = block(e_step)  # slows one block, not one side's every step)
        bj, jl = block(j_step)
        bc, cl = block(c_step)
        e, j, tc = min(e, be), min(j, bj), min(tc, bc)
        e_losses += el
        j_losses += jl
        c_losses += cl
    n = compare_steps or len(e_losses)

    def worst(losses):
        return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses[:n], e_losses[:n]))
    if worst(j_losses) > 1e-3:
        print(f"   WRONG: {name}: losses differ by {worst(j_losses):.2e} (relative)")
        ok = False
    peer_losses = "not run here" if not peer else \
        f"losses within {worst(c_losses):.1e} of eager's" if same_masks else "its own dropout masks"
    c = dynamo.counters()
    peer_text = f"torch.compile {tc:.2f} ms/step   " if peer else "torch.compile: above   "
    vs_peer = f", {tc / j:.2f}x vs compile" if peer else ""
    print(f"   {name}:\n     eager {e:.2f} ms/step   {peer_text}dynamo {j:.2f} ms/step   "
          f"{e / j:.2f}x vs eager{vs_peer}; first 4 steps {first:.0f} ms (eager {e_first:.0f}"
          + (f", torch.compile {c_first:.1f} s" if peer else "") + f"); losses equal over {n} steps (largest relative difference "
          f"{worst(j_losses):.1e}; torch.compile: {peer_losses}); backward traces {c['backward_traces_compiled']}, "
          f"native backward runs {c['backward_native_runs']}")
    return ok


def size_sweep(name_what, model, inputs, reps):
    """Section 8: model optimized, called once at each of the inputs' shapes in order (a recording,
    or an instance of a size family: no recording), checked against eager (a copy of the module
    made before optimizing it in place), then timed over all shapes beside eager (fastest of reps
    sweeps each), and at a few shapes beside a trace specialized to that shape alone (a
    recording of its own, config.dynamic = False). Prints three lines; False if a check failed."""
    import dynamo
    name, what = name_what
    dynamo.reset()
    eager = copy.deepcopy(model)
    fast = dynamo.optimize(model)
    t0 = time.perf_counter()
    not_native = []  # calls after the first two that ran no native code
    for k, x in enumerate(inputs):
        before = dynamo.counters()["native_runs"]
        fast(x)
        if k >= 2 and dynamo.counters()["native_runs"] == before:
            not_native.append(list(x.shape))
    first = (time.perf_counter() - t0) / len(inputs) * 1e3
    c_first = dynamo.counters()
    ok = all(check(name, fast(x), eager(x)) for x in inputs[::max(1, len(inputs) // 8)])

    def sweep(fn):
        t0 = time.perf_counter()
        for x in inputs:
            fn(x)
        return (time.perf_counter() - t0) / len(inputs) * 1e3

    for _ in range(2):  # warm eager's per-shape state too
        sweep(eager)
    c0 = dynamo.counters()
    e, j = 1e30, 1e30
    for _ in range(reps):
        e, j = min(e, sweep(eager)), min(j, sweep(fast))
    c = dynamo.counters()
    peer = inductor(copy.deepcopy(eager))
    t0 = time.perf_counter()
    ok = ok and all(check(name + " (torch.compile)", peer(x), eager(x)) for x in inputs)  # (its compiles)
    peer_first = time.perf_counter() - t0
    tc = min(sweep(peer) for _ in range(reps))
    print(f"   later calls: eager {e:6.3f} ms/call   torch.compile {tc:6.3f} ms/call (its first sweep "
          f"{peer_first:.1f} s)   dynamo {j:6.3f} ms/call   {e / j:.2f}x vs eager, {tc / j:.2f}x vs compile   "
          f"({(c['native_runs'] - c0['native_runs']) * 100 // max(1, c['calls'] - c0['calls'])}% native)")
    llvm = c_first["traces_compiled"] + c_first["size_instances"] - c_first["code_shared"]
    print(f"   first call of each {what}: {first:.1f} ms; traces recorded {c_first['traces_compiled']} (size probes "
          f"on fake tensors {c_first['size_probes']}), size-family instances (no recording) "
          f"{c_first['size_instances']}, LLVM compiles {llvm} (the others share machine code); eager fallbacks "
          f"{c_first['eager_runs']}; calls after the first two without native code: {len(not_native)}"
          + (f" {not_native[:4]}" if not_native else ""))
    # beside traces specialized to one shape each (recorded alone, every size a constant)
    picks = inputs[len(inputs) // 5::max(1, len(inputs) // 4)][:4]
    rows = []
    old = dynamo.config.dynamic
    for x in picks:
        alone = dynamo.optimize(copy.deepcopy(eager))
        dynamo.config.dynamic = False
        try:
            alone(x)
            alone(x)
        finally:
            dynamo.config.dynamic = old
        t_fam, t_one = interleaved_ms(fast, alone, (x,), 15)
        rows.append(f"{list(x.shape)} {t_fam:.2f} vs {t_one:.2f} ms ({t_one / t_fam:.2f}x)")
    print("   the same calls vs a trace specialized to that shape (medians, interleaved): " + "; ".join(rows))
    return ok


def _spectrogram(wave, window, mel):
    """An eager mel spectrogram (the neighbour timed after a model call): STFT, power, filterbank."""
    spec = torch.stft(wave, 400, 160, window=window, return_complex=True).abs().pow(2)
    return torch.log(mel @ spec + 1e-6)


def neighbour_section(calls=60):
    """11. A good neighbour: an eager op timed right after a model call, the model run eagerly or
    compiled (threads a compiled call leaves spinning would slow it), and after 5 ms of idle."""
    import dynamo
    try:
        import torchvision
    except ImportError:
        print("\n11. good neighbour: torchvision is not installed; make deps installs it")
        return
    print("\n11. good neighbour: an eager mel spectrogram (1 s of 16 kHz audio) timed right after a resnet18 call "
          "(64x64, batch 1), the call eager or compiled; median of", calls, "(ms)")
    torch.manual_seed(0)
    net = torchvision.models.resnet18().eval()
    img = torch.randn(1, 3, 64, 64)
    wave, window, mel = torch.randn(16000), torch.hann_window(400), torch.rand(80, 201)
    fast = dynamo.optimize(net)
    for _ in range(3):
        fast(img), net(img), _spectrogram(wave, window, mel)

    def after(model):
        times = []
        for _ in range(calls):
            if model is None:
                time.sleep(0.005)
            else:
                model(img)
            t = time.perf_counter()
            _spectrogram(wave, window, mel)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    rounds = [(after(None), after(net), after(fast)) for _ in range(3)]
    idle, eager, compiled = (statistics.median(r[k] for r in rounds) for k in range(3))
    print(f"   after idle {idle:.3f}   after an eager call {eager:.3f}   after a compiled call {compiled:.3f}   "
          f"(compiled / eager {compiled / eager:.2f}x; target <= 1.10x)")


def scaled_softmax(x, scale):
    return torch.softmax(x * scale, -1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--eager-only":
        eager_only(sys.argv[2])
    elif sys.argv[1:] == ["--training"]:
        training_section()
    elif sys.argv[1:] == ["--neighbour"]:
        set_threads()
        with torch.no_grad():
            neighbour_section()
    else:
        main()
