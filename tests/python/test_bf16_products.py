"""bfloat16 aten::mm / addmm of few rows (a decode step's linear layers): runtime/gemm_bf16.cpp's
AVX512-BF16 products (the own side, DYNAMO_GEMM=1) and LibTorch's (0), against the float64
product of the same bf16 values rounded once to bf16. Each result must be within one bf16 step
(2^-8 relative) of that, plus what float32 sums over K may lose where terms cancel. Weights as
nn.Linear holds them (B = W^T: dot products) and as GPT-2's Conv1D does (x @ W: rows), odd
sizes, sliced and transposed inputs, broadcast biases, zero-size and the first size past the
few-row path. Without AVX512-BF16 the own side widens bf16 to float32 with AVX2 + FMA (also run
at that level on a CPU that has more: DYNAMO_KERNEL_ISA); without AVX2 it declines and LibTorch's
call runs: the same checks hold."""
import copy

import pytest
import torch

from test_gemm import run as gemm_run


def run(frame, body, *inputs):
    return gemm_run(frame, body, *inputs, calls=3)


def close(got, a, b, bias=None):
    """got against the float64 product of a and b (+ bias), rounded to bf16 once."""
    exact = a.double() @ b.double()
    if bias is not None:
        exact = exact + bias.double()
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape, (got.dtype, got.shape, exact.shape)
    if got.numel() == 0:
        return
    slack = (a.double().abs() @ b.double().abs()) * 2e-6 * max(1, a.shape[1]) ** 0.5
    err = (got.double() - exact).abs()
    bound = exact.abs() * 2.0 ** -8 + slack + 1e-30
    assert (err <= bound).all(), (err - bound).max()


@pytest.fixture(params=["1", "0"])
def side(request, monkeypatch):
    monkeypatch.setenv("DYNAMO_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 3), (1, 512, 1023), (2, 33, 17), (3, 64, 130), (4, 1023, 7),
                                   (5, 100, 65), (17, 96, 40), (32, 31, 9), (33, 64, 48), (1, 0, 4), (0, 5, 4)])
def test_mm_against_a_weight_transposed(frame, side, m, k, n):
    torch.manual_seed(m * 1000 + k + n)
    a, w = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    close(run(frame, f"%r = extern aten::mm(%0, %1) : bf16[{m},{n}]", a, w.t()), a, w.t())


@pytest.mark.parametrize("m,k,n", [(1, 1, 5), (1, 512, 1536), (2, 77, 300), (3, 2048, 64), (6, 40, 257),
                                   (32, 16, 33)])
def test_mm_against_rows_and_addmm_of_gpt2_conv1d(frame, side, m, k, n):
    torch.manual_seed(m * 1000 + k + n)
    a, w, bias = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16(), torch.randn(n).bfloat16()
    close(run(frame, f"%r = extern aten::mm(%0, %1) : bf16[{m},{n}]", a, w), a, w)
    close(run(frame, f"%r = extern aten::addmm(%0, %1, %2) : bf16[{m},{n}]", bias, a, w), a, w, bias)


@pytest.mark.parametrize("bias_shape", [(33,), (1, 33), (3, 33), (1, 1)])
def test_addmm_bias_broadcast_and_inputs_untouched(frame, side, bias_shape):
    torch.manual_seed(len(bias_shape))
    bias, a, w = torch.randn(bias_shape).bfloat16(), torch.randn(3, 40).bfloat16(), torch.randn(33, 40).bfloat16()
    keep = (bias.clone(), a.clone(), w.clone())
    got = run(frame, "%r = extern aten::addmm(%0, %1, %2) : bf16[3,33]", bias, a, w.t())
    close(got, a, w.t(), bias)
    assert all(torch.equal(x, y) for x, y in zip((bias, a, w), keep))


def test_addmm_with_scales_is_left_to_libtorch(frame, side):
    bias, a, b = torch.randn(2, 9).bfloat16(), torch.randn(2, 10).bfloat16(), torch.randn(10, 9).bfloat16()
    got = run(frame, "%r = extern aten::addmm(%0, %1, %2, 0.5, 2.0) : bf16[2,9]", bias, a, b)
    want = (0.5 * bias.double() + 2.0 * (a.double() @ b.double()))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=0.05)


def test_sliced_and_transposed_operands(frame, side):
    torch.manual_seed(3)
    a = torch.randn(4, 130).bfloat16()[:, 1:129]       # rows not contiguous with each other
    w = torch.randn(64, 256).bfloat16()[:, ::2]         # [64, 128], no unit stride along K
    close(run(frame, "%r = extern aten::mm(%0, %1) : bf16[4,64]", a, w.t()), a, w.t())
    at = torch.randn(128, 3).bfloat16().t()              # A with a column stride of 3
    close(run(frame, "%r = extern aten::mm(%0, %1) : bf16[3,64]", at, w.t()), at, w.t())


@pytest.mark.parametrize("rows", [1, 4, 40])
def test_bf16_linear_layers_through_optimize(side, rows):
    """nn.Linear and GPT-2's Conv1D (addmm of x @ W) in bf16 through dynamo.optimize: within
    a bf16 step of the float64 result of the same weights, as LibTorch's own bf16 product is."""
    import dynamo

    class Conv1D(torch.nn.Module):
        def __init__(self, nx, nf):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.05)
            self.bias = torch.nn.Parameter(torch.randn(nf))

        def forward(self, x):
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(x.shape[:-1] + (-1,))

    torch.manual_seed(rows)
    net = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.GELU(), Conv1D(200, 70), torch.nn.ReLU(),
                              torch.nn.Linear(70, 1030, bias=False)).bfloat16().eval()
    ref = copy.deepcopy(net).double()
    eager = copy.deepcopy(net)
    jit = dynamo.optimize(net)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(rows, 96).bfloat16()
            want, got, theirs = ref(x.double()), jit(x), eager(x)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            # as far from the float64 network as eager's bf16 is (with room for other roundings)
            ours, eagers = (got.double() - want).abs().max().item(), (theirs.double() - want).abs().max().item()
            assert ours <= 2 * eagers + 1e-2, (ours, eagers)


def test_the_avx2_form_gives_the_same_products():
    """These tests again in a process whose kernels run at the AVX2 level (DYNAMO_KERNEL_ISA), where
    the own side widens bf16 to float32 instead of AVX512-BF16's dot products: checked on a CPU
    that has AVX512-BF16 too."""
    import os
    import subprocess
    import sys

    from test_gemm import _host_flags
    if not {"avx2", "fma"} <= _host_flags():
        pytest.skip("this CPU has no AVX2")
    env = dict(os.environ, DYNAMO_KERNEL_ISA="avx2")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__,
                        "-k", "not avx2_form"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
