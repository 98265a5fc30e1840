"""Where dynamo does not help yet: the known gaps of docs/PERFORMANCE.md, each timed eager vs.
dynamo in one process (2 threads, the median of the timed calls after warm-up ones).

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/gaps.py [--cases generate,bf16,...]

- generate: a LLaMA-style decoder from a small config (transformers; 4 layers, hidden 256,
  vocabulary 32000, random weights), greedy generate() of 32 new tokens with its KV cache, the
  model's forward optimized (`model.forward = dynamo.optimize(model.forward)`); the native runs
  per generate() are counted.
- bf16: torchvision's resnet18 in bfloat16 (`model.to(torch.bfloat16)`), 224x224, batch 1.
- depthwise: torchvision's efficientnet_b0 (depthwise convolutions, squeeze-excite), float32,
  224x224, batch 8; also torch.compile (Inductor with weight freezing), the best a user has here.
- newton: a square root by Newton's iteration until a tensor condition holds
  (`while (x * x - a).abs().max() > tol`), over 40 inputs of 1,000 elements whose iteration
  counts differ; the first pass (recording included) and a later pass.
"""
import argparse
import copy
import statistics
import sys
import time

import torch

import dynamo

CASES = ("generate", "bf16", "depthwise", "newton")


def median_ms(fn, warm, timed):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def row(name, eager_ms, dynamo_ms, note="", against="eager"):
    print(f"{name:<44} {against} {eager_ms:9.2f} ms  dynamo {dynamo_ms:9.2f} ms  "
          f"{eager_ms / dynamo_ms:5.2f}x of {against}" + (f"  ({note})" if note else ""), flush=True)


def case_generate():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16))
    kw = dict(max_new_tokens=32, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        eager = median_ms(lambda: model.generate(ids, **kw), 1, 5)
        model.forward = dynamo.optimize(model.forward)
        got = model.generate(ids, **kw)
        before = dynamo.counters()["native_runs"]
        jit = median_ms(lambda: model.generate(ids, **kw), 1, 5)
        native = (dynamo.counters()["native_runs"] - before) / 6
    assert torch.equal(got, want), "tokens differ from eager's"
    row("generate(), LLaMA-style, 32 new tokens", eager, jit, f"{native:.0f} native runs per generate")


def eager_and_dynamo(model, x, warm, timed):
    """(eager ms, dynamo ms, max difference) of an inference model, eager first (dynamo.optimize
    changes the module it is given)."""
    with torch.no_grad():
        want = model(x)
        eager = median_ms(lambda: model(x), warm, timed)
        fast = dynamo.optimize(model)
        got = fast(x)
        jit = median_ms(lambda: fast(x), warm, timed)
    return eager, jit, (got.float() - want.float()).abs().max().item()


def case_bf16():
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().to(torch.bfloat16)
    eager, jit, err = eager_and_dynamo(model, torch.randn(1, 3, 224, 224, dtype=torch.bfloat16), 3, 20)
    row("resnet18 bfloat16, 224x224, batch 1", eager, jit, f"max difference {err:.3g}")


def case_depthwise():
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0().eval()
    plain = copy.deepcopy(model)  # torch.compile's
    x = torch.randn(8, 3, 224, 224)
    eager, jit, err = eager_and_dynamo(model, x, 2, 10)
    # the best a user has here besides: Inductor, with weight freezing (PyTorch's CPU advice)
    import torch._inductor.config as inductor
    inductor.freezing = True
    with torch.no_grad():
        compiled = torch.compile(plain)
        compiled(x)
        best = median_ms(lambda: compiled(x), 2, 10)
    row("efficientnet_b0 float32, 224x224, batch 8", eager, jit, f"max difference {err:.3g}")
    row("efficientnet_b0 float32, 224x224, batch 8", best, jit, against="torch.compile")


def newton_sqrt(a, tol=1e-4):
    x = a.clone()
    while (x * x - a).abs().max() > tol:
        x = 0.5 * (x + a / x)
    return x


def case_newton():
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.rand(1000, generator=gen) * (1 + i / 4) + 0.5 for i in range(40)]

    def run(f):
        return [f(a) for a in inputs]
    want = run(newton_sqrt)
    eager = median_ms(lambda: run(newton_sqrt), 1, 5)
    fast = dynamo.optimize(newton_sqrt)
    t0 = time.perf_counter()
    got = run(fast)
    first = (time.perf_counter() - t0) * 1e3
    jit = median_ms(lambda: run(fast), 1, 5)
    assert all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want)), "results differ from eager's"
    row("Newton iteration, 40 inputs of 1,000", eager, jit, f"first pass {first:.0f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {time.strftime('%Y-%m-%d')}")
    for name in args.cases.split(","):
        if name not in CASES:
            sys.exit(f"gaps.py: unknown case {name!r} (have {', '.join(CASES)})")
        dynamo.reset()
        globals()[f"case_{name}"]()


if __name__ == "__main__":
    main()
