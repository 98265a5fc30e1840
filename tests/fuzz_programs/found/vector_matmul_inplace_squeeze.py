"""Fuzzer reproducer: wrong result (every compiled call).

Status: fixed (python_shim/dynamo/recorder.py, Recorder._inplace_view); kept as a regression reproducer.

    def fn(x2):                 # x2 = torch.randn(3), w1 a (3, 4) closure tensor
        return x2 @ w1          # compiled: shape [1, 4], eager: [4]

torch 2.x computes vector @ matrix as mm(x.unsqueeze(0), w).squeeze_(0): the in-place squeeze_
was recorded as an extern call of the view op squeeze.dim, whose result the engine took for the
mm product itself. In-place view ops (squeeze_, unsqueeze_, t_, transpose_, detach_) on a
temporary are now recorded as the view they make; on an input or a view they abort (eager).
"""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    x1 = torch.randn((3, 3), generator=g)
    x2 = torch.randn((3,), generator=g)
    return (x0, x1, x2, )
def build():
    w1 = torch.randn((3, 4), generator=torch.Generator().manual_seed(1))
    def fn(x0, x1, x2):
        t2 = x2 @ w1
        return t2
    target = fn
    return target
def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
