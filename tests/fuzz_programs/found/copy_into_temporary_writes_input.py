"""Fuzzer reproducer: wrong input mutation (calls 1..3); no side exit involved.

Status: fixed by commit 72cc231 (python_shim/dynamo/recorder.py); kept as a regression reproducer.

    def fn(x0, x1):
        t1 = x0[0] * 0             # a temporary
        t1.copy_(x1)               # same shape and dtype as x1
        t1.zero_()                 # eager: writes t1 only
        return t1

dynamo's native runs zero the INPUT x1 (and t1.add_(1) adds to x1, etc.). Trace:
%3 = extern aten::zero(%1); %4 = copy_(%1, %3) -- a write into input %1.
Likely cause (python_shim/dynamo/recorder.py, Recorder._record_inplace, the aten::copy_ branch):
with the same shape and dtype, res is the source's own IR name (%1), and the temporary is rebound
to it (self.vals[id(base)] = new); %1 is in self.input_names, so the next in-place op on the
temporary is recorded as copy_(%1, ...), i.e. into the input. The copy needs a value of its own
(or the rebinding must not make the temporary count as the input's memory).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3, 3), generator=g)
    x1 = torch.randn((3, 3), generator=g)
    return (x0, x1, )


def build():
    def fn(x0, x1):
        t1 = x0[0] * 0
        t1.copy_(x1)
        t1.zero_()
        return t1
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
