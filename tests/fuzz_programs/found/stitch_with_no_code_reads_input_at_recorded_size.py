"""Fuzzer reproducer (issue 40, seed 8080): a trace that recorded nothing before a stitch (x1.tolist())
has no native code, so no native entry checked its input's sizes; the step read the input through
the recorded call's geometry (3 rows of a 4-row tensor) and len() of the list was 3 where eager's
was 4. A trace without native code now checks its tensor inputs' sizes, strides, dtype and device
in Python."""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g)
    x1 = torch.randn((3 + seed % 2, 3), generator=g)
    x2 = torch.randn((), generator=g)
    return (x0, x1, x2, )
def build():
    def fn(x0, x1, x2):
        t1 = sum([x1 * len(x1.tolist()) * c for c in (1.0, 0.5)])
        return t1
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
