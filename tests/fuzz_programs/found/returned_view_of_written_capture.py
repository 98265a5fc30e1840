"""Fuzzer reproducer: a returned view lost its aliasing (call 1's result, re-read after later calls).

Status: fixed (recorder.py: views written through are views of the new contents again).

    w2 = torch.randn(3, 3, 3)
    def fn(x0):
        t3 = w2.reshape(-1)        # a view of a captured tensor
        t3.mul_(2.0)               # written through
        return t3                  # eager: a view of w2, which later calls double again

The view was bound to the values written, so dynamo returned a fresh tensor, not a view of w2.
"""
"""Fuzzer reproducer: result changed by a later call."""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3, 3), generator=g)
    return (x0, )
def build():
    w2 = torch.randn((3, 3, 3), generator=torch.Generator().manual_seed(2))
    def fn(x0):
        t3 = w2.reshape(-1)
        t3.mul_(2.0)
        return t3
    target = fn
    return target
def mutate(call, target):
    pass


# -- reproducer: result changed by a later call (call 1)
# result of call 1, re-read after the last call: torch.float32[27] differs at 27 element(s), e.g. [0]: -4.163204669952393 vs eager -16.65281867980957
if __name__ == "__main__":
    import os
    import sys
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), '/work/main/tests/fuzz_programs']
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
