"""Fuzzer reproducer: wrong side-effect count (call 0): LOG: 0 vs eager 1.

Status: open. A generator suspended inside its `try` block is live at a stitch (here the item
assignment `STATE['calls'] += 1` into a dict from outside the call). Eager closes it when the
call returns (its last reference goes with the frame), so its `finally` appends to LOG during
the call; after the stitch the rest of the call runs from a snapshot, and the generator is
closed only when something of dynamo's that still refers to it lets go -- one or two calls
later (LOG: 0, 2, 1, ... against 1, 1, 1). Found once the fuzzer passed inputs by keyword (the
recording used to fall back at `{**kw}['x1']`); the same happens with positional arguments.
Related: generators made while a side trace is recorded (frontend._record_side, from an
exit's snapshot) can end up in reference cycles and be closed by the collector later, their
`finally` running then (a semantics test collects garbage first for that reason).
"""
import torch
LOG = []


def GEN(v):
    try:
        yield v + 1
    finally:
        LOG.append(1)


STATE = {'calls': 0}
KEYWORDS = ('x1',)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((1 + seed % 2, 8, 2, 3), generator=g)
    x1 = torch.randn((5, 2), generator=g)
    return (x0, x1, )


def build():
    def fn(x0, **kw):
        x1 = {**kw}['x1']
        it2 = GEN(x1)
        t1 = next(it2)
        STATE['calls'] += 1
    target = fn
    return target


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
