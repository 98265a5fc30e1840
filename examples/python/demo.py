"""Demo: a PyTorch function run eagerly and through dynamo's native engine, with correctness and
speedup printed. The recording front end that turns the function into a trace by itself is
issue 4; until it lands, this demo gives the engine the trace that front end would record."""
import time

import torch

from dynamo import native


def gelu_bias_residual(x, bias, residual):
    """An unmodified PyTorch function: the MLP tail of a transformer block."""
    return torch.nn.functional.gelu(x + bias, approximate="tanh") * 0.5 + residual


# The ATen-level trace of gelu_bias_residual on f32[4096,1024] inputs and a [1024] bias.
TRACE = """trace @gelu_bias_residual {
  %0 = input f32[4096,1024]
  %1 = input f32[1024]
  %2 = input f32[4096,1024]
  %3 = add(%0, %1)
  %4 = gelu_tanh(%3)
  %5 = mul(%4, 0.5)
  %6 = add(%5, %2)
  return %6
}
"""


def median_ms(fn, reps=15):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def main():
    torch.manual_seed(0)
    x, bias, res = torch.randn(4096, 1024), torch.randn(1024), torch.randn(4096, 1024)
    engine = native.Engine()
    frame = native.Frame(engine, "gelu_bias_residual")
    t0 = time.perf_counter()
    entry = frame.compile(native.Trace(TRACE))
    compile_ms = (time.perf_counter() - t0) * 1e3

    eager = gelu_bias_residual(x, bias, res)
    (jit,) = frame.run(x, bias, res)
    err = (jit - eager).abs().max().item()
    ok = torch.allclose(jit, eager, rtol=1e-5, atol=1e-5)
    t_eager = median_ms(lambda: gelu_bias_residual(x, bias, res))
    t_jit = median_ms(lambda: frame.run(x, bias, res))
    print(f"gelu_bias_residual on [4096,1024] float32 ({torch.get_num_threads()} thread(s))")
    print(f"  compiled in {compile_ms:.1f} ms: {entry.stats().num_kernels} fused kernel(s), "
          f"{entry.stats().num_externs} extern call(s)")
    print(f"  correctness: max |jit - eager| = {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  eager {t_eager:.2f} ms, dynamo {t_jit:.2f} ms (incl. Python call overhead): {t_eager / t_jit:.1f}x")
    frame.close()
    engine.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
