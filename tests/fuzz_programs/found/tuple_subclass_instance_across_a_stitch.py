"""Fuzzer reproducer: leaked exception (RuntimeError: dynamo: cannot rebuild the frames at ...:
TypeError: object.__new__(__T) is not safe, use tuple.__new__()) on the first call.

Status: fixed (python_shim/dynamo/snapshot.py, _plain_object); kept as a regression reproducer.

A class statement inside the function is interpreted now (LOAD_BUILD_CLASS), so an instance of a
tuple subclass made in the call reached the snapshot of a later stitch (`tolist()`), which
carried it as "a plain object: its class and __dict__" and rebuilt it with object.__new__. A
subclass of a builtin keeps its contents outside __dict__: such an object keeps the stitch from
being made (the recording ends there; the call goes on correctly).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0,)


def build():
    def fn(x0):
        class __T(tuple):
            def __new__(cls, u, w):
                return super().__new__(cls, (u, w))
        __t = __T(x0, 3.0)
        t1 = __t[0] * __t[1] + len(__t)
        _ = len(t1.tolist())
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
