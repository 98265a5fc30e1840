"""Fuzzer reproducer (issue 40, seed 9393): a tensor the trace computed from a transposed input
keeps the input's layout in eager (x0 * 0 is transposed too); live across a stitch (t3.tolist()) it
was handed on row-major, so `t3.is_contiguous()` after the stitch was True where eager's is False
and dynamo took the other branch. Live tensors now cross exits and stitches in their memory order
and are made again with eager's strides."""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g).transpose(-1, -2)
    x1 = torch.randn((3, 3), generator=g)
    x2 = torch.randn((), generator=g)
    return (x0, x1, x2, )
def build():
    def fn(x0, x1, x2):
        t3 = (x0 * 0).clamp(min=2.0) + 1.0
        _ = len(t3.tolist())
        return torch.exp(t3) if t3.is_contiguous() else torch.tanh(t3)
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
