"""Fuzzer reproducer: leaked exception (IndexError in sizes.py text_at, on a later call).

Status: fixed (python_shim/dynamo/sizes.py, tokens); kept as a regression reproducer.

    def fn(x0, x1, x2):         # x0 = torch.randn(()), x1 varies in size, x2 a transposed view
        torch.floor(x0)
        return x2, {"k": [x1]}

A 0-dim input has no number in its IR line (`input f32[]{}`): the size family tokenizer did not
count it as a slot, so the dims of every later input were taken for the input before it, and an
instance at another size indexed the 0-dim tensor's shape (or bound a variable to the wrong one).
"""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g)
    x1 = torch.randn((4 + seed % 2, 1), generator=g, dtype=torch.float64)
    x2 = torch.randn((1, 8, 1), generator=g).transpose(-1, -2)
    return (x0, x1, x2, )
def build():
    def fn(x0, x1, x2):
        t3 = torch.floor(x0)
        return x2, {'k': [x1]}
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
