"""Fuzzer reproducer: leaked exception (RuntimeError from the recording call; eager raises nothing).

Status: fixed (interpreter.py: a torch call that raises under the recorder runs again outside it).

    def fn(x0, x1, x2):            # x0: [1, 1]
        x2.relu_()                 # an effect: the call cannot simply be run again eagerly
        return F.max_pool1d(torch.exp(x0 + x1), 2)

Eager returns an empty [1, 0] tensor; under any Python dispatch mode torch 1.13's composite
max_pool1d takes its max_pool1d_with_indices path, which raises "Output size is too small".
"""
import torch
import torch.nn.functional as F
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((1, 1), generator=g)
    x1 = torch.randn((), generator=g)
    x2 = torch.randn((1, 4), generator=g)
    return (x0, x1, x2, )
def build():
    def fn(x0, x1, x2):
        t1 = torch.exp(x1)
        t2 = x0 + t1
        t3 = torch.exp(t2)
        x2.relu_()
        t6 = F.max_pool1d(t3, 2)
    target = fn
    return target
def mutate(call, target):
    pass


# -- reproducer: leaked exception (call 0)
# RuntimeError: Given input size: (1x1x1). Calculated output size: (1x1x0). Output size is too small
#   File "/work/main/python_shim/dynamo/interpreter.py", line 373, in call
#     r = self._concrete(fn, args, kwargs)
#         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
#   File "/work/main/python_shim/dynamo/interpreter.py", line 455, in _concrete
#     r = fn(*a, **k)
#         ^^^^^^^^^^^
#   File "/usr/lib/python3/dist-packages/torch/utils/_python_dispatch.py", line 101, in __torch_dispatch__
#     return old.__torch_dispatch__(func, types, args, kwargs)
#            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
#   File "/work/main/python_shim/dynamo/recorder.py", line 218, in __torch_dispatch__
#     out = func(*args, **kwargs)
#           ^^^^^^^^^^^^^^^^^^^^^
#   File "/usr/lib/python3/dist-packages/torch/_ops.py", line 257, in __call__
#     return self._op(*args, **kwargs or {})
#            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
# RuntimeError: Given input size: (1x1x1). Calculated output size: (1x1x0). Output size is too small
# 
if __name__ == "__main__":
    import os
    import sys
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), '/work/main/tests/fuzz_programs']
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
