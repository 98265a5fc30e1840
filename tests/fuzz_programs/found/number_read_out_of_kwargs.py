"""Fuzzer reproducer: wrong result (call 1): 266.93 vs eager 9642.92.

Status: fixed (python_shim/dynamo/interpreter.py, Interpreter.dict_srcs and its readers);
kept as a regression reproducer.

`x3` is passed by keyword into `**kw` and read back with `kw['x3']`. The **kwargs dict knew its
values' sources, but only a call that forwarded the very dict (`f(**kw)`) used them: `kw['x3']`,
`kw.get`, `kw.pop`, `{**kw}` and `kw.copy()` read the value with no source, so the trace took
the first call's number as a constant, unguarded, and the next call (x3 = 1.0 instead of 0.5)
got the first call's answer. (A tensor read that way was a tensor "of unknown origin": the
recording fell back, which is why Hugging Face forwards that pass their inputs through
decorators with **kwargs ran no native code.)
"""
import torch
KEYWORDS = ('x3',)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    x1 = torch.randn((3, 3), generator=g)
    x2 = torch.randn((3, 3), generator=g)
    x3 = 0.5 * (1 + seed % 2)
    return (x0, x1, x2, x3, )


def build():
    def fn(x0, x1, x2, **kw):
        x3 = kw['x3']

        def h1(*args, scale=1.0, **kw):
            return sum(args) * scale + kw.get('shift', 0)
        t2 = h1(x2, x2, scale=x3, **{'shift': 2.0})
        t3 = torch.exp(t2)
        return t3
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
