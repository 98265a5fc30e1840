"""Fused ATen kernels recorded as their parts (recorder._DECOMPOSITIONS): nn.TransformerEncoderLayer's
and nn.MultiheadAttention's eval fast paths (aten::_transformer_encoder_layer_fwd,
aten::_native_multi_head_attention). Compared with eager, on every call; cases the decomposition
does not cover (masks) run the fused op as an extern."""
import copy

import pytest
import torch
import torch.nn as nn

import dynamo


def check(module, make, calls=3):
    ref = copy.deepcopy(module)
    jit = dynamo.optimize(module)
    with torch.no_grad():
        for _ in range(calls):
            args = make()
            want, got = ref(*args), jit(*args)
            want = want[0] if isinstance(want, tuple) else want
            got = got[0] if isinstance(got, tuple) else got
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    assert dynamo.counters()["native_runs"] >= calls - 1, dynamo.report()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("shape", [(1, 7, 32), (3, 16, 32)])
def test_encoder_layer(norm_first, activation, shape):
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first, activation=activation)
    check(layer.eval(), lambda: (torch.randn(shape),))


def test_encoder_stack_records_every_layer_as_ops():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2, enable_nested_tensor=False)
    check(enc.eval(), lambda: (torch.randn(2, 9, 32),))
    text = str(dynamo.explain(enc, torch.randn(2, 9, 32)))
    assert "_transformer_encoder_layer_fwd" not in text, text


def test_encoder_layer_with_padding_mask_keeps_the_fused_op():
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, 6:] = True

    class WithMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x, src_key_padding_mask=mask)
    check(WithMask().eval(), lambda: (torch.randn(2, 9, 32),))


def test_multihead_attention_fast_path():
    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]
    check(Self().eval(), lambda: (torch.randn(2, 5, 32),))


@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_with_weights(average):
    """need_weights=True (nn.MultiheadAttention's default) returns the attention weights too,
    averaged over heads or per head: recorded as parts as well, both outputs equal eager's."""
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, average_attn_weights=average)

    m = Both().eval()
    ref = copy.deepcopy(m)
    jit = dynamo.optimize(m)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 7, 32)
            (out, w), (want_out, want_w) = jit(x), ref(x)
            assert w.shape == want_w.shape == ((2, 7, 7) if average else (2, 4, 7, 7))
            assert torch.allclose(out, want_out, rtol=1e-4, atol=1e-5)
            assert torch.allclose(w, want_w, rtol=1e-4, atol=1e-6)
        text = str(dynamo.explain(ref, torch.randn(2, 7, 32)))
    assert dynamo.counters()["native_runs"] >= 2, dynamo.report()
    assert "_native_multi_head_attention" not in text, text


def test_encoder_layer_norms_are_kernels_not_calls():
    """The fast path's layer_norm (eps left at its default) becomes fused kernels, and the empty
    tensor it allocates and never reads is dropped: the steps between kernels are the 4 matrix
    products and the fused attention (dynamo::attention)."""
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    check(layer, lambda: (torch.randn(1, 7, 32),))
    text = dynamo.report()
    assert "5 LibTorch call(s)" in text, text


def addc(b, a, x, y):
    u = torch.addcmul(b, a, x)                        # timm's Affine: beta + alpha * x
    v = torch.addcmul(b, a, x, value=0.5)
    w = torch.addcdiv(x, a, y.abs() + 1, value=-2)
    z = torch.addcdiv(b, x, y.abs() + 1)
    return u.relu(), v * 2, w, z


@pytest.mark.parametrize("n", [1, 7, 1023, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_addcmul_and_addcdiv_are_kernels_not_calls(n, dtype):
    """aten::addcmul / addcdiv become pointwise ops of the fused kernels (jit/decompose.cpp),
    broadcast over a batch, in ATen's order of operations, with value given or not."""
    opt = dynamo.optimize(addc)
    for _ in range(3):
        b, a, x, y = (torch.randn(*s).to(dtype) for s in ((n,), (n,), (3, n), (3, n)))
        for got, want in zip(opt(b, a, x, y), addc(b, a, x, y)):
            assert got.dtype == want.dtype and got.shape == want.shape
            tol = 1e-6 if dtype == torch.float32 else 1e-3
            assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol), (got.float() - want.float()).abs().max()
    if n:
        text = dynamo.report()
        assert "0 LibTorch call(s)" in text, text


def test_addcmul_of_integers_and_a_tensor_value_stay_right():
    """Integer tensors (value an int) are computed as ATen computes them."""
    def f(b, a, x):
        return torch.addcmul(b, a, x, value=3), torch.addcmul(b.float(), a, x.float())

    opt = dynamo.optimize(f)
    for _ in range(3):
        b, a, x = torch.randint(-5, 5, (7,)), torch.randint(-5, 5, (7,)), torch.randint(-5, 5, (2, 7))
        for got, want in zip(opt(b, a, x), f(b, a, x)):
            assert got.dtype == want.dtype and torch.equal(got, want)


def masks_and_casts(x, ids, m):
    a = 1.0 - x                                        # aten::rsub.Scalar (T5's extended mask)
    b = torch.rsub(x, 2, alpha=3)
    c = x.masked_fill(m, float("-inf")).softmax(-1)    # masked_fill.Scalar before a softmax
    d = ids.masked_fill(m, 7)                          # integer self, integer value
    e = ids.to(torch.float32) * 0.5 + (x * 4).to(torch.int64)  # aten::_to_copy of a dtype, both ways
    f = (x > 0).to(x.dtype) + ids.to(torch.float16).float()
    return a, b, c, d, e, f


@pytest.mark.parametrize("n", [1, 7, 1023])
def test_rsub_masked_fill_and_dtype_casts_are_kernels_not_calls(n):
    opt = dynamo.optimize(masks_and_casts)
    for _ in range(3):
        x = torch.randn(3, n) * 3
        ids = torch.randint(-50, 50, (3, n))
        m = torch.rand(1, n) > 0.5                  # broadcast over the rows
        m[0, 0] = False                              # (a row never all -inf)
        for got, want in zip(opt(x, ids, m), masks_and_casts(x, ids, m)):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.allclose(got.float(), want.float(), rtol=1e-6, atol=1e-6, equal_nan=True), \
                (got.float() - want.float()).abs().max()
    text = dynamo.report()
    assert "0 LibTorch call(s)" in text, text


@pytest.mark.parametrize("n", [2, 3, 4])
def test_small_sums_through_broadcast_operands(n):
    """A sum over a last dim of 2-4 elements (a pair of boxes, a 2x2 sample grid) of a product
    whose operands broadcast along it: unrolled into pointwise ops over each operand's picks (a
    size-1 dim picked at 0), one fused loop, no LibTorch call."""
    def f(a, b, c):
        u = (a[:, :, None] * b.exp()).sum(-1)                   # b: [n] broadcast over rows
        v = torch.tanh(a[:, :2, None, None] - c).sum((-1, -2))  # c: [2, 1, n] picked where it varies
        return u + 1, v

    opt = dynamo.optimize(f)
    for _ in range(3):
        a, b, c = torch.randn(7, 5), torch.randn(n), torch.randn(2, 1, n)
        for got, want in zip(opt(a, b, c), f(a, b, c)):
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    text = dynamo.report()
    assert "0 LibTorch call(s)" in text, text
