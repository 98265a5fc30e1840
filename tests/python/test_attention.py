"""Attention through dynamo's own fused kernel (dynamo::attention, runtime/attention.cpp): the op
against a float64 reference, and scaled_dot_product_attention, nn.MultiheadAttention and
nn.TransformerEncoderLayer recorded into it (no LibTorch attention call), each call compared
with eager."""
import math

import pytest
import torch
import torch.nn.functional as F

import dynamo
from dynamo import native

native.lib()  # registers dynamo::attention


@pytest.fixture(autouse=True, params=["own", "aten", "auto"])
def kernel(request, monkeypatch):
    """Every test with dynamo's kernel (on any CPU), with what the op runs on a CPU without
    AVX-512, ATen's flash kernel, and with the default (runtime/attention.cpp, kernel_for): on
    AVX-512, each shape's first calls run both kernels and time them, later ones the faster."""
    if request.param == "auto":
        monkeypatch.delenv("DYNAMO_ATTENTION", raising=False)
    else:
        monkeypatch.setenv("DYNAMO_ATTENTION", request.param)
    return request.param


def reference(q, k, v, scale, causal):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        s = s + torch.full(s.shape[-2:], float("-inf"), dtype=torch.double).triu(1)
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def heads(layout, b, h, n, d):
    """A [b, h, n, d] tensor laid out as asked: contiguous, [b, n, h, d] memory, or a strided
    slice of a packed [b, n, 3, h, d] projection (nn.MultiheadAttention's q, k, v)."""
    if layout == "contiguous":
        return torch.randn(b, h, n, d)
    if layout == "transposed":
        return torch.randn(b, n, h, d).transpose(1, 2)
    return torch.randn(b, n, 3, h, d)[:, :, 1].transpose(1, 2)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "packed"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,l,s,d", [(1, 1, 1, 1, 1), (2, 3, 7, 5, 8), (1, 8, 64, 64, 32), (1, 2, 33, 100, 80),
                                       (1, 1, 1023, 7, 16), (1, 4, 200, 513, 128)])
def test_the_op_matches_a_float64_reference_and_eagers_layout(b, h, l, s, d, causal, layout):
    q, k, v = heads(layout, b, h, l, d), heads(layout, b, h, s, d), heads(layout, b, h, s, d)
    out, lse = torch.ops.dynamo.attention(q, k, v, 1 / math.sqrt(d), causal)
    want, want_lse = reference(q, k, v, 1 / math.sqrt(d), causal)
    assert out.shape == want.shape and out.dtype == torch.float32 and lse.shape == (b, h, l)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=2e-6)
    eager, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)
    assert out.stride() == eager.stride() or h == 1 or l == 1  # (a size-1 dim's stride says nothing)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,hk,l,s,d", [(1, 4, 2, 1, 9, 16), (2, 8, 2, 7, 40, 32), (1, 6, 1, 33, 33, 64),
                                          (1, 4, 4, 5, 17, 8)])
def test_grouped_key_value_heads_match_a_float64_reference(b, h, hk, l, s, d, causal):
    # (LLaMA, Qwen2, Mistral: each key/value head serves h / hk query heads)
    q, k, v = torch.randn(b, h, l, d), torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    out, lse = torch.ops.dynamo.attention(q, k, v, 1 / math.sqrt(d), causal)
    want, want_lse = reference(q, k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1),
                               1 / math.sqrt(d), causal)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=2e-6)


def test_sdpa_with_grouped_heads_records_the_own_kernel():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) + 1
    q, k, v = torch.randn(1, 8, 12, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    assert "dynamo::attention" in ops_of(fn, q, k, v)
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for _ in range(3):
            q, k, v = torch.randn(1, 8, 12, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
            torch.testing.assert_close(fast(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)


def test_empty_and_keyless_attention():
    q = torch.randn(2, 3, 0, 8)
    out, lse = torch.ops.dynamo.attention(q, torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), 0.5, False)
    assert out.shape == (2, 3, 0, 8) and lse.shape == (2, 3, 0)
    out, _ = torch.ops.dynamo.attention(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 0, 8), torch.randn(1, 1, 0, 8),
                                        0.5, False)
    assert out.isnan().all()  # softmax over no keys, as eager's math path


def test_a_nan_score_makes_its_row_nan_and_leaves_the_others():
    # (the row max and sum combine lanes as a tree: a NaN lane must still reach the row's result)
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 100, 16), torch.randn(1, 2, 100, 16)
    q[0, 1, 7, 3] = float("nan")
    k[0, 0, 70, 5] = float("nan")  # every row of head 0 sees it, in the second key block
    out, _ = torch.ops.dynamo.attention(q, k, v, 0.25, False)
    eager, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=0.25)
    assert out[0, 0].isnan().all() and out[0, 1, 7].isnan().all()
    keep = torch.ones(40, dtype=torch.bool)
    keep[7] = False
    torch.testing.assert_close(out[0, 1, keep], eager[0, 1, keep], rtol=1e-5, atol=2e-6)


def test_bad_inputs_are_refused_with_a_message():
    x = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.dynamo.attention(x.double(), x.double(), x.double(), 1.0, False)
    with pytest.raises(RuntimeError, match="head size"):
        torch.ops.dynamo.attention(x, x, torch.randn(1, 2, 4, 16), 1.0, False)
    with pytest.raises(RuntimeError, match=r"\[batch, heads"):
        torch.ops.dynamo.attention(x[0], x[0], x[0], 1.0, False)
    with pytest.raises(RuntimeError, match="multiple"):  # 2 query heads over 3 key/value heads
        torch.ops.dynamo.attention(x, torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), 1.0, False)


def ops_of(fn, *args):
    with torch.no_grad():
        return dynamo.explain(fn, *args).traces[0].ops


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_records_the_own_kernel_and_matches_eager(causal):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal) * 2 + 1
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    ops = ops_of(fn, q, k, v)
    assert "dynamo::attention" in ops and not any("attention_for_cpu" in o or o == "aten::bmm" for o in ops), ops
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for n in (16, 16, 16, 7, 1, 64):
            q, k, v = (torch.randn(2, 4, n, 8) for _ in range(3))
            torch.testing.assert_close(fast(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= 3


def test_sdpa_with_a_mask_or_dropout_stays_eagers_kernel_and_correct():
    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    mask = torch.randn(8, 8)
    assert "dynamo::attention" not in ops_of(fn, q, k, v, mask)
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(q, k, v, mask), fn(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_multihead_attention_runs_the_own_kernel_at_every_length():
    m = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()

    def fn(x):
        return m(x, x, x, need_weights=False)[0]
    ops = ops_of(fn, torch.randn(1, 16, 64))
    assert "dynamo::attention" in ops and "aten::softmax.int" not in ops and "aten::bmm" not in ops, ops
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for n in (16, 16, 16, 33, 7, 1, 128):
            x = torch.randn(2, n, 64)
            torch.testing.assert_close(fast(x), fn(x), rtol=1e-5, atol=1e-5)


def test_attention_weights_asked_for_keep_the_softmax():
    m = torch.nn.MultiheadAttention(32, 2, batch_first=True).eval()

    def fn(x):
        return m(x, x, x)  # need_weights=True: the probabilities are an output
    x = torch.randn(1, 9, 32)
    assert "dynamo::attention" not in ops_of(fn, x)
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 9, 32)
            for got, want in zip(fast(x), fn(x)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_encoder_layer_in_eval():
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    assert "dynamo::attention" in ops_of(layer, torch.randn(2, 10, 64))
    fast = dynamo.optimize(layer)
    with torch.no_grad():
        for n in (10, 10, 10, 3):
            x = torch.randn(2, n, 64)
            torch.testing.assert_close(fast(x), layer(x), rtol=1e-4, atol=1e-5)


def test_training_keeps_attention_differentiable():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v).square().sum()
    fast = dynamo.optimize(fn)
    for _ in range(3):
        q, k, v = (torch.randn(1, 2, 6, 4, requires_grad=True) for _ in range(3))
        qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
        fast(q, k, v).backward()
        fn(qe, ke, ve).backward()
        for a, b in ((q, qe), (k, ke), (v, ve)):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


# -- attention written out: softmax(q @ k^T / c) @ v (the demo's EncoderBlock, timm, GPT-2 style) --

def written_out(q, k, v, how="div"):
    s = q @ k.transpose(-2, -1)
    s = s / math.sqrt(q.shape[-1]) if how == "div" else s * (1 / math.sqrt(q.shape[-1])) if how == "mul" else s
    return torch.softmax(s, dim=-1) @ v


def block(x, heads=4, how="div", perm=False):
    b, t, c = x.shape
    q, k, v = ((x * (i + 1)).view(b, t, heads, c // heads).transpose(1, 2) for i in range(3))
    if perm:
        s = (q @ k.permute(0, 1, 3, 2)) * (1 / math.sqrt(c // heads))
        y = s.softmax(-1) @ v
    else:
        y = written_out(q, k, v, how)
    return y.transpose(1, 2).reshape(b, t, c) + 1


@pytest.mark.parametrize("how", ["div", "mul", "none", "permute"])
def test_attention_written_out_runs_the_own_kernel(how):
    """The bmm of the probabilities and the values is recorded as dynamo::attention; the product
    and softmax before it, read by nothing else, are dropped: no LibTorch call is left."""
    def fn(x):
        return block(x, how="div" if how == "permute" else how, perm=how == "permute")
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        e = dynamo.explain(fn, x)
    assert "dynamo::attention" in e.traces[0].ops, e.traces[0].ops
    assert e.traces[0].stats.num_externs == 1, str(e)  # the attention kernel only
    fast = dynamo.optimize(fn)
    with torch.no_grad():
        for n in (16, 16, 7, 7, 1, 1, 64, 64):  # (the block computes with the sizes: a trace each)
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(fast(x), fn(x), rtol=1e-5, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= 3


def test_attention_written_out_in_the_demos_encoder_block():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
    from demo import EncoderBlock
    m = EncoderBlock(64, 4, 128).eval()
    x = torch.randn(2, 24, 64)
    with torch.no_grad():
        assert "dynamo::attention" in dynamo.explain(m, x).traces[0].ops
        fast = dynamo.optimize(m)
        for _ in range(3):
            x = torch.randn(2, 24, 64)
            torch.testing.assert_close(fast(x), m(x), rtol=1e-5, atol=1e-5)


def test_attention_written_out_that_does_not_fit_stays_bmm_and_correct():
    """A mask added to the scores, softmax over another dim, the probabilities returned too,
    keys broadcast over the batch, float64, grad needed: each computed as written, like eager."""
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    mask = torch.randn(8, 8)
    cases = {
        "mask": (lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 2 + mask, -1) @ v, (q, k, v), False),
        "dim": (lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / 2, -2) @ v, (q, k, v), False),
        "probs": (lambda q, k, v: (lambda p: (p @ v, p))(torch.softmax(q @ k.transpose(-2, -1), -1)), (q, k, v),
                  True),
        "broadcast": (lambda q, k, v: written_out(q, k[:1], v[:1]), (q, k, v), False),
        "float64": (written_out, (q.double(), k.double(), v.double()), False),
    }
    for name, (fn, args, fused) in cases.items():
        with torch.no_grad():
            ops = dynamo.explain(fn, *args).traces[0].ops
        assert ("dynamo::attention" in ops) == fused, (name, ops)
        fast = dynamo.optimize(fn)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(fast(*args), fn(*args), rtol=1e-5, atol=1e-6)
    q.requires_grad_()
    assert "dynamo::attention" not in dynamo.explain(written_out, q, k, v).traces[0].ops
    fast = dynamo.optimize(written_out)
    for _ in range(3):
        torch.testing.assert_close(fast(q, k, v), written_out(q, k, v), rtol=1e-5, atol=1e-6)


def test_attention_written_out_with_a_write_in_between_is_not_fused():
    """Scores masked in place (GPT-2 style), or q changed after its product: the values the
    softmax and the second product read are no longer q @ k^T's, so nothing is fused."""
    mask = torch.ones(8, 8).triu(1).bool()

    def masked(q, k, v):
        w = q @ k.transpose(-2, -1)
        w = w / 2
        w.masked_fill_(mask, float("-inf"))
        return torch.softmax(w, -1) @ v

    def q_changed(q, k, v):
        q = q * 1
        w = q @ k.transpose(-2, -1)
        q.add_(1)
        return torch.softmax(w, -1) @ v, q

    def scores_changed(q, k, v):
        w = q @ k.transpose(-2, -1)
        p = torch.softmax(w * 0.5, -1)
        w.zero_()  # (after the softmax read it: fusing would be right, but any write into a
        return p @ v  # tensor of the chain is taken to change it)

    for fn, fused in ((masked, False), (q_changed, False), (scores_changed, False)):
        q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
        with torch.no_grad():
            assert ("dynamo::attention" in dynamo.explain(fn, q, k, v).traces[0].ops) == fused, fn.__name__
            fast = dynamo.optimize(fn)
            for _ in range(3):
                q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
                torch.testing.assert_close(fast(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-6)


def test_a_sweep_of_shapes_measures_its_first_ones_only(kernel, capfd, monkeypatch):
    """Sequence lengths that keep changing, one call each per round: while 8 shapes are being
    measured (both kernels run on their first calls), a new shape takes the kernel of the
    nearest decided one, or dynamo's own, without running both (runtime/attention.cpp,
    sweep_default); every call still matches the reference."""
    if kernel != "auto":
        pytest.skip("the choice between kernels is made only without DYNAMO_ATTENTION")
    monkeypatch.setenv("DYNAMO_PRINT_CHOICES", "1")
    for i in range(80):  # shapes other tests left undecided go stale (64 look-ups): two shapes in turn
        q = torch.randn(1, 3, 30 + i % 2, 48)
        torch.ops.dynamo.attention(q, q, q, 0.125, False)
    lengths = [37 + 3 * i for i in range(12)]  # (head size 40, 3 heads: shapes no other test uses)
    for _ in range(10):  # (a shape without a clear winner takes up to 9 calls to decide)
        for n in lengths:
            q, k, v = (torch.randn(1, 3, n, 40) for _ in range(3))
            out, lse = torch.ops.dynamo.attention(q, k, v, 0.125, False)
            want, wl = reference(q, k, v, 0.125, False)
            torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    err = capfd.readouterr().err
    decided = [ln for ln in err.splitlines() if ln.startswith("dynamo::attention [1,3,") and ",40]" in ln]
    wide = "avx512f" in open("/proc/cpuinfo").read()
    assert len(decided) == (8 if wide else 0), err
