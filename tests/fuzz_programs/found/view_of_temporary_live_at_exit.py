"""Fuzzer reproducer: wrong result (calls that take the data-dependent size exit).

Status: fixed (snapshot.py: a view of a live temporary is made again from its base, "liveview").

    def fn(x0):
        t1 = x0 + x0
        t2 = t1.reshape(-1)                      # a view of a temporary, live at the exit
        t3 = t2.masked_select(t2 > 0).sum()      # the size exit
        t2.relu_()                               # writes t1 through t2
        return t1

After the exit t1 and t2 came back as two copies: relu_ on t2 left t1 unchanged.
"""
"""Fuzzer reproducer: wrong result."""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0, )
def build():
    def fn(x0):
        t1 = x0 + x0
        t2 = t1.reshape(-1)
        t3 = t2.masked_select(t2 > 0).sum()
        t2.relu_()
        return t1
    target = fn
    return target
def mutate(call, target):
    pass


# -- reproducer: wrong result (call 1)
# result: torch.float32[3, 3] differs at 4 element(s), e.g. [1, 1]: -0.9038119316101074 vs eager 0.0
if __name__ == "__main__":
    import os
    import sys
    sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), '/work/main/tests/fuzz_programs']
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
