"""Fuzzer reproducer: leaked exception (NameError from dynamo on call 3; eager raises nothing).

Status: fixed (snapshot.py: a side trace hands x[i] back as live values; tracetree.py, TraceTree._resume).

    dynamo.config.hotexit = 1          # side traces compiled after one exit
    def fn(x0):                        # x0 = torch.randn(3, 3)
        return x0.masked_select(x0 > 0).sum()

Call 0 records (4 positive elements: a side exit on the mask's count); call 1 (5) leaves the trace
and a side trace is compiled from that exit; call 3 (6) leaves the root trace AND the side trace's
own count exit: resuming from the side trace's snapshot raises
    NameError: name 'x' is not defined      (snapshot.py decode: eval(spec[1], env))
into the program. The fuzzer also found it with the name in the frame's locals instead of its stack.
Likely cause: python_shim/dynamo/snapshot.py resume(): the side trace was recorded with the parent
exit's live values sourced as x[i] (guards.EXIT), so its snapshots encode them as ("src", "x[i]")
(here the mask on the value stack); resume()'s env (a, k, g, f, ...) has no x, and the parent's exit
values are not at hand when the side trace exits (TraceTree._continue_at_exit in tracetree.py recurses with the side
trace's own values only). A failed decode should also never reach the program.
"""
import torch

DYNAMO_CONFIG = {'hotexit': 1}


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0, )


def build():
    def fn(x0):
        return x0.masked_select(x0 > 0).sum()
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
