"""aten::mm / addmm / bmm externs: runtime/gemm.cpp's packed GEMM where it beats the loaded BLAS
(timed at the first matmul), its GEMV for one-row products, LibTorch's BLAS otherwise. Results
against float64 matmuls on odd sizes, transposed and sliced inputs, zero-size and broadcast
biases; the paths share the code above the op, so these tests cover whichever one runs."""
import pytest
import torch

from dynamo import native


_IR_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16"}


def ty(t):
    dims = ",".join(str(s) for s in t.shape)
    strides = ",".join(str(s) for s in t.stride())
    d = _IR_DTYPE[t.dtype]
    return f"{d}[{dims}]{{{strides}}}" if t.dim() > 1 and not t.is_contiguous() else f"{d}[{dims}]"


def run(frame, body, *inputs, calls=1):
    """body (one IR instruction making %r) over inputs, compiled and run `calls` times: the last
    run's result (the first calls of a product step time its sides)."""
    lines = [f"  %{k} = input {ty(x)}" for k, x in enumerate(inputs)] + [f"  {body}"]
    frame.compile(native.Trace("trace @gemm {\n" + "\n".join(lines) + "\n  return %r\n}\n"))
    for _ in range(calls):
        (out,) = frame.run(*inputs)
    return out


def close(got, want):
    assert got.shape == want.shape and got.dtype == torch.float32
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-5 * scale), (got.double() - want).abs().max()


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 5), (6, 32, 32), (13, 257, 33), (97, 300, 70), (1023, 17, 7),
                                   (5, 0, 4), (0, 5, 4)])
def test_mm(frame, m, k, n):
    a, b = torch.randn(m, k), torch.randn(k, n)
    close(run(frame, f"%r = extern aten::mm(%0, %1) : f32[{m},{n}]", a, b), a.double() @ b.double())


def test_mm_transposed_and_sliced_inputs(frame):
    a = torch.randn(70, 300).t()           # [300, 70], column-major
    b = torch.randn(45, 140)[:, ::2].t()   # [70, 45], both strides > 1
    close(run(frame, "%r = extern aten::mm(%0, %1) : f32[300,45]", a, b), a.double() @ b.double())


@pytest.mark.parametrize("bias_shape", [(33,), (1, 33), (19, 33)])
def test_addmm_bias_broadcast_and_input_untouched(frame, bias_shape):
    bias, a, b = torch.randn(bias_shape), torch.randn(19, 40), torch.randn(33, 40).t()
    keep = bias.clone()
    got = run(frame, "%r = extern aten::addmm(%0, %1, %2) : f32[19,33]", bias, a, b)
    close(got, bias.double() + a.double() @ b.double())
    assert torch.equal(bias, keep)


def test_addmm_with_scales_matches(frame):
    bias, a, b = torch.randn(8, 9), torch.randn(8, 10), torch.randn(10, 9)
    got = run(frame, "%r = extern aten::addmm(%0, %1, %2, 0.5, 2.0) : f32[8,9]", bias, a, b)
    close(got, 0.5 * bias.double() + 2.0 * (a.double() @ b.double()))


@pytest.mark.parametrize("bt,m,k,n", [(1, 5, 7, 3), (3, 13, 9, 17), (32, 128, 64, 128), (2, 0, 3, 4)])
def test_bmm(frame, bt, m, k, n):
    a, b = torch.randn(bt, m, k), torch.randn(bt, n, k).transpose(1, 2)
    close(run(frame, f"%r = extern aten::bmm(%0, %1) : f32[{bt},{m},{n}]", a, b), a.double() @ b.double())


# One-row products (a batch-1 linear layer) take the GEMV, which needs a unit stride in b: its
# rows (b contiguous) or its columns (a linear's transposed weight); other layouts go elsewhere.
@pytest.mark.parametrize("k,n", [(1, 1), (7, 5), (31, 33), (1023, 7), (4096, 1000), (0, 4)])
@pytest.mark.parametrize("layout", ["rows", "columns", "strided"])
def test_one_row_products(frame, k, n, layout):
    a = torch.randn(1, k)
    b = {"rows": torch.randn(k, n), "columns": torch.randn(n, k).t(),
         "strided": torch.randn(k, 2 * n)[:, ::2]}[layout]
    close(run(frame, f"%r = extern aten::mm(%0, %1) : f32[1,{n}]", a, b), a.double() @ b.double())


@pytest.mark.parametrize("k,n", [(9, 17), (1023, 65)])
def test_one_row_addmm_and_strided_row(frame, k, n):
    bias, a, b = torch.randn(n), torch.randn(k, 3).t()[1:2], torch.randn(n, k).t()  # a: stride k, not 1
    got = run(frame, f"%r = extern aten::addmm(%0, %1, %2) : f32[1,{n}]", bias, a, b)
    close(got, bias.double() + a.double() @ b.double())


# Few-row products against a linear layer's weight (b: a transposed contiguous matrix) take the
# own side's dot-product kernel (sgemm_few_rows: 6 rows by 4 columns, K in 16-wide steps and a
# tail): every row count around its tiles, K and N off its multiples.
@pytest.mark.parametrize("m", [2, 5, 6, 7, 17, 32])
@pytest.mark.parametrize("k,n", [(1, 3), (15, 5), (17, 4), (200, 33), (1023, 9)])
def test_few_row_products_against_a_weight(frame, m, k, n):
    a, b = torch.randn(m, k), torch.randn(n, k).t()
    close(run(frame, f"%r = extern aten::mm(%0, %1) : f32[{m},{n}]", a, b), a.double() @ b.double())
    bias = torch.randn(n)
    got = run(frame, f"%r = extern aten::addmm(%0, %1, %2) : f32[{m},{n}]", bias, a[:, :], b)
    close(got, bias.double() + a.double() @ b.double())


# Linear layers through dynamo.optimize: their weights are versioned inputs, so the own side keeps
# its packing and MKL's packed side (mkl::_mkl_linear) applies. Each side forced (DYNAMO_GEMM) and
# the measured choice; weights then written in place (the packed forms must follow), and through
# .data (a write PyTorch does not count: the content check catches it).
@pytest.fixture(params=["auto", "0", "1", "mkl"])
def gemm_side(request, monkeypatch):
    if request.param == "auto":
        monkeypatch.delenv("DYNAMO_GEMM", raising=False)
    else:
        monkeypatch.setenv("DYNAMO_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (17, 96), (33, 96), (130, 96), (2, 9, 96)])
def test_linear_layers_on_each_side_follow_their_weights(gemm_side, shape):
    import copy

    import dynamo
    torch.manual_seed(shape[0])
    net = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.GELU(), torch.nn.Linear(200, 70, bias=False),
                              torch.nn.ReLU(), torch.nn.Linear(70, 1030))
    eager = copy.deepcopy(net)
    jit = dynamo.optimize(net)
    with torch.no_grad():
        def check():
            for _ in range(4):  # (the first two calls time the sides)
                x = torch.randn(shape)
                close(jit(x), eager(x).double())
        check()
        choices = choices_of(jit)
        assert choices and all(ch in ("own", "blas", "mkl") for ch in choices), choices
        if gemm_side != "auto":
            assert set(choices) == {{"0": "blas", "1": "own"}.get(gemm_side, gemm_side)}, choices
        for la, lb in zip(eager, net):
            if isinstance(la, torch.nn.Linear):
                la.weight.mul_(-0.5)
                lb.weight.mul_(-0.5)
        check()
        w = torch.randn(1030, 70)
        eager[4].weight.data = w.clone()
        net[4].weight.data.copy_(w)  # same storage, same version: only the content differs
        check()


def own_linear(monkeypatch, m, k, n, bias):
    """An nn.Linear(k, n) (seeded by the sizes), an eager copy and the optimized one, the own GEMM
    forced."""
    import copy

    import dynamo
    monkeypatch.setenv("DYNAMO_GEMM", "1")
    torch.manual_seed(m + k + n)
    lin = torch.nn.Linear(k, n, bias=bias)
    eager = copy.deepcopy(lin)
    return lin, eager, dynamo.optimize(lin)


def choices_of(jit):
    """The side each product step of an optimized module's traces chose ("own", "blas", "mkl")."""
    return [w.split("=")[1] for c in jit.forward.compiled for w in c.entry.choices().split()]


# The own side's GEMM against a kept weight: A's rows read in place 12 at a time, the rows dealt to
# the threads in chunks of equal tiles, K in blocks of 256, and a linear layer's bias added as the
# first block is stored (no pass filling the result with it first). Row counts around the tiles and
# chunks (13: the few-row kernel, its bias added after), K of one and several blocks, N with
# 16-column tails, A contiguous and a column slice of a wider tensor (row stride > K).
@pytest.mark.parametrize("m", [13, 37, 130, 197, 301])
@pytest.mark.parametrize("k,n", [(1, 40), (300, 17), (600, 1030)])
@pytest.mark.parametrize("bias", [True, False])
def test_own_gemm_rows_chunks_and_fused_bias(monkeypatch, m, k, n, bias):
    lin, eager, jit = own_linear(monkeypatch, m, k, n, bias)
    with torch.no_grad():
        for x in (torch.randn(m, k), torch.randn(m, k + 5)[:, 2:k + 2]):
            for _ in range(3):
                close(jit(x), eager(x).double())
        choices = choices_of(jit)
        assert choices and set(choices) == {"own"}, choices


# The own GEMM with no packing of B kept (an input, no weight to keep): a row-major B against up to
# 32 rows or over a K of up to 16 (K <= 256, M <= 96) is read in place, its last partial panel
# packed; otherwise B is packed per call, up to 96 rows against at least twice as many 32-column
# panels as 6-row panels split by columns (each thread packs all of A and its own panels of B, K
# block by K block), other shapes by rows in whole 6-row panels (an input gradient G W and a weight
# gradient G^T X in training); a product of one K block whose C rows are a multiple of 2 KB apart
# is written along its rows. Rows around the panels, K over one and several 256-deep blocks, N
# with partial panels, transposed operands, and addmm with a full bias (the product added to it).
@pytest.mark.parametrize("m,k,n", [(1, 40, 70), (7, 300, 1030), (64, 1024, 1024), (50, 257, 65), (96, 600, 200),
                                   (50, 100, 1024), (97, 300, 70), (200, 513, 40), (1023, 64, 784), (301, 64, 1024),
                                   (10, 64, 1024), (7, 100, 1030), (64, 10, 1024), (96, 16, 77), (33, 3, 20)])
@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_own_gemm_split_by_rows_or_columns(frame, monkeypatch, m, k, n, layout):
    monkeypatch.setenv("DYNAMO_GEMM", "1")
    torch.manual_seed(m * 7 + k + n)
    if layout == "rows":
        a, b = torch.randn(m, k), torch.randn(k, n)
    else:
        a, b = torch.randn(k, m).t(), torch.randn(n, k).t()
    close(run(frame, f"%r = extern aten::mm(%0, %1) : f32[{m},{n}]", a, b), a.double() @ b.double())
    bias = torch.randn(m, n)
    close(run(frame, f"%r = extern aten::addmm(%0, %1, %2) : f32[{m},{n}]", bias, a, b),
          bias.double() + a.double() @ b.double())


# Many rows against at most 32 columns of a weight's transpose (a classifier's head, X W^T) are
# computed as C^T = W X^T by the few-row products and stored transposed: without a bias, with a
# linear layer's bias, with a full bias the product is added to.
@pytest.mark.parametrize("m,k,n", [(33, 64, 10), (64, 1024, 10), (100, 1, 7), (1023, 300, 32), (40, 17, 1)])
def test_own_gemm_many_rows_few_columns(frame, monkeypatch, m, k, n):
    monkeypatch.setenv("DYNAMO_GEMM", "1")
    torch.manual_seed(m + k + n)
    a, b = torch.randn(m, k), torch.randn(n, k).t()
    close(run(frame, f"%r = extern aten::mm(%0, %1) : f32[{m},{n}]", a, b), a.double() @ b.double())
    for bias in (torch.randn(n), torch.randn(m, n)):
        close(run(frame, f"%r = extern aten::addmm(%0, %1, %2) : f32[{m},{n}]", bias, a, b),
              bias.double() + a.double() @ b.double())


# A weight that changes between calls (training) is not packed and kept: after its first change
# the own side reads it in place. A linear layer of 33..128 rows against a weight of >= 64k elements
# then takes the small-M product (C^T = W X^T, W's rows the in-place operand: copied a K block at a
# time where their stride would crowd the cache, K = 1024; read in place otherwise), other products
# a per-call packing (x @ W, W row-major). Row counts around the 32-wide panels of X^T and the
# 12-row tiles of W, K over one and several 512-deep blocks, X contiguous and a column slice; the
# weight then left alone again (the kept packing comes back) and written once more.
@pytest.mark.parametrize("m", [33, 47, 64, 100, 128])
@pytest.mark.parametrize("k,n", [(784, 1030), (1024, 100), (1030, 77)])
@pytest.mark.parametrize("bias", [True, False])
def test_own_gemm_on_a_weight_that_changes_every_call(monkeypatch, m, k, n, bias):
    lin, eager, jit = own_linear(monkeypatch, m, k, n, bias)
    with torch.no_grad():
        for step in range(10):
            if step < 4 or step >= 8:  # written in place between calls; left alone at steps 4-7
                for p, q in ((eager.weight, lin.weight), (eager.bias, lin.bias)):
                    if p is not None:
                        d = torch.randn_like(p) * 0.1
                        p.add_(d)
                        q.add_(d)
            x = torch.randn(m, k) if step % 2 else torch.randn(m, k + 5)[:, 2:k + 2]
            close(jit(x), eager(x).double())
        choices = choices_of(jit)
        assert choices and set(choices) == {"own"}, choices


@pytest.mark.parametrize("m", [40, 64])
def test_own_gemm_row_major_weight_that_changes_every_call(monkeypatch, m):
    import dynamo
    monkeypatch.setenv("DYNAMO_GEMM", "1")
    torch.manual_seed(m)
    w = torch.randn(300, 1030)

    def f(x, w):
        return x @ w
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(5):
            w.add_(torch.randn_like(w) * 0.1)
            x = torch.randn(m, 300)
            close(jit(x, w), (x.double() @ w.double()))


# A product step whose B changes between calls times its sides a second time after its first
# eight chosen calls; one whose B stays does not.
@pytest.mark.parametrize("changing", [True, False])
def test_a_step_with_a_changing_weight_is_timed_again(monkeypatch, capfd, changing):
    import copy

    import dynamo
    monkeypatch.delenv("DYNAMO_GEMM", raising=False)
    monkeypatch.setenv("DYNAMO_PRINT_CHOICES", "1")
    torch.manual_seed(3)
    lin = torch.nn.Linear(300, 400)
    eager = copy.deepcopy(lin)
    jit = dynamo.optimize(lin)
    with torch.no_grad():
        for _ in range(14):
            if changing:
                d = torch.randn_like(lin.weight) * 0.1
                lin.weight.add_(d)
                eager.weight.add_(d)
            x = torch.randn(64, 300)
            close(jit(x), eager(x).double())
    err = capfd.readouterr().err
    assert "aten::addmm" in err, err
    assert ("timed again, B changing" in err) == changing, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_products_take_the_gemv_without_timing(monkeypatch, dtype):
    """A product of one row (a decode step's linear layers) is bound by the weight's bytes: its
    step takes the own GEMV at its first call (one native run so far) instead of timing every side
    over its first two (where the CPU has neither AVX512-BF16 nor AVX2, a bf16 row is LibTorch's,
    timed as before). Results as
    eager's within the dtype's rounding, every call."""
    import copy

    import dynamo
    monkeypatch.delenv("DYNAMO_GEMM", raising=False)
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(96, 300), torch.nn.GELU(), torch.nn.Linear(300, 70)).to(dtype).eval()
    eager = copy.deepcopy(net)
    jit = dynamo.optimize(net)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(1, 96).to(dtype)
            torch.testing.assert_close(jit(x), eager(x), **tol)
            if k == 1 and (dtype == torch.float32 or _own_bf16_products()):
                choices = choices_of(jit)
                assert choices and set(choices) == {"own"}, choices


def _own_bf16_products():
    """Whether bf16 products of few rows are the own ones here (runtime/gemm_bf16.cpp: AVX512-BF16,
    or AVX2 + FMA; not below the AVX2 level DYNAMO_KERNEL_ISA may set)."""
    import os
    if os.environ.get("DYNAMO_KERNEL_ISA") == "base":
        return False
    return _has_avx512_bf16() or {"avx2", "fma"} <= _host_flags()


def _has_avx512_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read()
    except OSError:
        return False


def _host_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()


@pytest.mark.parametrize("level", ["avx2", "base"])
def test_every_kernel_level_gives_the_same_products(level):
    """The GEMM's kernels are built per instruction set (runtime/isa.h): AVX-512 tiles, AVX2 tiles
    of half the width in 16-column halves, the portable code. This file's tests again, in a
    process whose kernels run at `level` (DYNAMO_KERNEL_ISA) with the own side forced, so a level
    below the machine's is checked too (one the machine lacks runs at the machine's own)."""
    import os
    import subprocess
    import sys
    if level == "avx2" and not {"avx2", "fma"} <= _host_flags():
        pytest.skip("this CPU has no AVX2")
    env = dict(os.environ, DYNAMO_KERNEL_ISA=level, DYNAMO_GEMM="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__,
                        "-k", "not every_kernel_level"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
