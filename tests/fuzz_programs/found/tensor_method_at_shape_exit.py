"""Fuzzer reproducer: wrong result (every call that takes the data-dependent size exit).

Status: fixed by commit d7bfbe4 (python_shim/dynamo/snapshot.py); kept as a regression reproducer.

    def fn(x0):                                # x0 = torch.randn(3, 3)
        return x0.masked_select(x0 > 0).sum()

Call 0 records, with a side exit on the mask's count ("output size of a data-dependent op"). A later
call with another count resumes in the interpreter and returns the sum of CALL 0's x0 at this
call's mask (e.g. call 1: 0.4752 instead of 1.9930). torch.masked_select(x0, x0 > 0) is right; the
method form is wrong (also y = x0 * 1; y.masked_select(y > 0): the old temporary is used).
Likely cause: python_shim/dynamo/snapshot.py, encode(): the bound method x0.masked_select on the
value stack is a builtin_function_or_method, which is in _CONST_TYPES (types.BuiltinFunctionType),
so it is kept as ("const", method) -- with __self__ the recording call's tensor. A builtin method
bound to a tensor (or any object that is not a module) must be encoded through its __self__.
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0, )


def build():
    def fn(x0):
        t1 = x0.masked_select(x0 > 0).sum()
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
