"""Fuzzer reproducer (issue 40, seed 9292): `t5.add_(x1)` with t5 a float16 temporary and x1
float32, after a stitch: the in-place op on a temporary was recorded as its functional form
declared with t5's dtype, but add(half, float32) gives float32; the native run then failed
("extern aten::add.Tensor result 0 is Float[3,3], the trace expected f16[3,3]") and the error
reached the program from a side trace. The functional op is declared with its own dtype and cast
to the in-place op's; a side trace whose run fails is dropped and the call goes on in the
interpreter, as a root trace's failure goes to eager."""
import torch
def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g).half()
    x1 = torch.randn((3, 3), generator=g)
    return (x0, x1, )
def build():
    def fn(x0, x1):
        t1 = torch.exp(x0)
        t2 = t1.clamp(2.0, 1.0)
        it4 = iter((1.0, 2.0, 3.0, 4.0, 5.0))
        t3 = t2 + next(it4)
        _ = len(t2.tolist())
        t5 = torch.exp(t3)
        t5.add_(x1)
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
