"""Fuzzer reproducer: wrong result (result dtype, from call 0 on).

Status: fixed by commit 72cc231 (F.linear with a bias of another dtype is not recorded); kept as a regression reproducer.

    w, b = torch.randn(4, 3), torch.randn(4, dtype=torch.float64)
    def fn(x0):                                # x0: float32 [2, 3, 3, 3] (any rank > 2 except
        return F.linear(x0, w, b)              #     contiguous 3-D)

Eager returns float32 (torch's composite linear runs matmul, then output.add_(bias) in place).
dynamo returns float64, on the recording call and on native runs. The fuzzer found it as a float16
input of size 0 through an nn.Linear (eager float16, dynamo float32).
Likely cause: the recorder is a TorchDispatchMode (python_shim/dynamo/recorder.py); while a Python
dispatch mode is active, torch 1.13's at::linear takes its "tensor-subclass-like" branch and adds
the bias out of place (aten::add.Tensor, which type-promotes) instead of add_. Plain torch under
a no-op TorchDispatchMode gives float64 too. The recording call itself runs under the mode, so even
call 0 differs. Other composite ops with such composite-compliance branches may differ the same way.
"""
import torch
import torch.nn.functional as F


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((2, 3, 3, 3), generator=g)
    return (x0, )


def build():
    w = torch.randn((4, 3), generator=torch.Generator().manual_seed(1))
    b = torch.randn((4,), generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def fn(x0):
        return F.linear(x0, w, b)
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
