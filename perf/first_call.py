"""First calls of a torchvision model through dynamo.optimize, one process: the time of each of
the first --calls calls (call 1 records and compiles; the next one or two time each convolution
and matrix product both ways), the native compile time, and eager's calls for comparison.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/first_call.py resnet50
    (DYNAMO_CACHE_DIR=off for a cold compile every time; run twice with the default cache to see a
    second process, which runs the trace stored by the first; DYNAMO_TRACE_STORE=0 records it again
    with the compile cache warm)
"""
import argparse
import time

import torch
import torchvision

import dynamo


def timed_calls(fn, x, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--size", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(2)
    model = getattr(torchvision.models, args.model)().eval()
    x = torch.randn(1, 3, args.size, args.size)
    with torch.no_grad():
        jit = timed_calls(dynamo.optimize(model), x, args.calls)
        eager = timed_calls(getattr(torchvision.models, args.model)().eval(), x, args.calls)
    ms = lambda ts: " ".join(f"{t:.0f}" for t in ts)  # noqa: E731
    print(f"{args.model}: dynamo calls {ms(jit)} ms; eager calls {ms(eager)} ms; "
          f"compile {dynamo.counters()['compile_seconds'] * 1e3:.0f} ms "
          f"({dynamo.counters()['cache_hits']} from the compile cache, "
          f"{dynamo.counters()['traces_from_store']} from the trace store)")


if __name__ == "__main__":
    main()
