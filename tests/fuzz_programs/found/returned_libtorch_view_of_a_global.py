"""Fuzzer reproducer (issue 40, seed 40404): a global's diagonal (`GT2.diagonal()`, an op the
IR runs through LibTorch) returned: the native call handed out a copy where eager returns a view
of the global, so after the program scaled the global the first call's result no longer matched
(seen through the trace store, whose first call runs natively). Such views are now made again
from the call's input ("IV" results)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
GT2 = torch.randn((3, 3, 3, 3), generator=torch.Generator().manual_seed(2))
GT4 = torch.randn((3, 3, 3, 3), generator=torch.Generator().manual_seed(4))
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3, 3, 3), generator=g)
    return (x0, )
def build():
    def fn(x0):
        t1 = torch.exp(x0)
        t3 = F.mse_loss(GT2, GT4)
        t5 = torch.exp(t3)
        t6 = torch.tanh(t5)
        t8 = GT2.diagonal()
        t9 = torch.exp(t8)
        t10 = t9.sum(0)
        t11 = torch.exp(t10)
        return (t11, t8, t11)
    target = fn
    return target
def mutate(call, target):
    if call == 1:
        GT2.mul_(2)


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
