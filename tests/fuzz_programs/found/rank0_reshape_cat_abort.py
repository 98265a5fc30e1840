"""Fuzzer reproducer: crash (SIGABRT: a C++ exception escapes libdynamo during a native run).

Status: fixed by commit 78deca5 (jit/fuse.cpp); kept as a regression reproducer.

    def fn(x0):                    # x0 = torch.randn(())
        t1 = x0.reshape(-1)
        return torch.cat([t1, t1 * 2], 0)

The first native call (call 1) aborts the process: "terminate called after throwing an instance of
'c10::Error': dimensionality of sizes (2) must match dimensionality of strides (1)" from
at::TensorMaker (computeStorageNbytes) called from libdynamo -- an exception crossing the C API,
which promises none. Same likely root as rank0_view_slice_crash.py (a rank-0 source's reshape gets
no proper strides in jit/fuse.cpp, Planner::fold_view / reshape_strides), here surfacing when the
view is handed to an extern (aten::cat) at run time. Seen once, in the fuzzer's long-lived worker
process (after ~150 other programs); it never reproduced in a fresh process (valgrind: no invalid
access in libdynamo), consistent with a heap-dependent out-of-bounds read of the empty strides.
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g)
    return (x0, )


def build():
    def fn(x0):
        t1 = x0.reshape(-1)
        t2 = torch.cat([t1, t1 * 2], 0)
        return t2
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
