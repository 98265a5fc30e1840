"""Fuzzer reproducer: wrong result (call 2: 1.5550564e+35 where eager gave inf).

Status: fixed (jit/kernel.cpp, KernelEmitter::cast); kept as a regression reproducer.

    def fn(x0, x1):             # x0 a float16 number, x1 a float32 number
        t4 = exp(exp(exp(exp(x0))))
        return t4 + x1

A float16 chain is computed in float32 in the fused kernel and rounded where it is stored. The
float32 add read the chain's float32 value, never rounded to float16: eager's half had overflowed
to inf. A conversion of a half value (to float32, an int, a bool, the other half type) now rounds
it to its own type first.
"""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g).half()
    x1 = torch.randn((), generator=g)
    return (x0, x1, )
def build():
    def fn(x0, x1):
        t1 = torch.exp(x0)
        t2 = torch.exp(t1)
        t3 = torch.exp(t2)
        t4 = torch.exp(t3)
        t6 = t4 + x1
        return t6
    target = fn
    target.fuzz_set = {}
    target.fuzz_cells = {}
    return target

def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
