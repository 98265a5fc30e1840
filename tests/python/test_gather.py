"""Indexing by integer tensors (aten::index.Tensor with adjacent index tensors, index_select,
embedding) compiled as the IR's index op: a gather fused into the loop that reads it, no LibTorch
call. Every case compared with eager on random data, several calls, odd and empty sizes,
broadcast and negative indices, int32 and int64 indices, half/bool/int sources, non-contiguous
sources; an index out of range raises eager's IndexError."""
import pytest
import torch
import torch.nn.functional as F

import dynamo


def run(f, make, calls=3, libtorch_calls=0, exact=True):
    dynamo.reset()
    opt = dynamo.optimize(f)
    for _ in range(calls):
        args = make()
        want, got = f(*args), opt(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            if exact:
                assert torch.equal(g, w), (g.float() - w.float()).abs().max()
            else:
                assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (g - w).abs().max()
    assert dynamo.counters()["native_runs"] >= calls - 1, dynamo.report()
    if libtorch_calls is not None:
        text = dynamo.report()
        assert f"{libtorch_calls} LibTorch call(s)" in text, text


@pytest.mark.parametrize("n", [1, 7, 1023])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_rows_then_pointwise(n, idx_dtype):
    """x[i] * 2 + 1 with i of any length (negative indices count from the end)."""
    def f(x, i):
        return x[i] * 2 + 1

    run(f, lambda: (torch.randn(n, 5), torch.randint(-n, n, (n + 3,), dtype=idx_dtype)))


@pytest.mark.parametrize("shape", [(3, 9, 4), (1, 1, 1), (2, 0, 3)])
def test_middle_dim_and_broadcast_indices(shape):
    """x[:, i, j] with i [5, 1] and j [1, 4] broadcast to [5, 4]: the block sits after dim 0."""
    a, b, c = shape

    def f(x, i, j):
        return torch.relu(x[:, i, j])

    def make():
        x = torch.randn(a, b, c)
        i = torch.randint(0, max(b, 1), (5, 1)) if b else torch.zeros(5, 1, dtype=torch.int64)[:0]
        j = torch.randint(-c, c, (1, 4))
        return x, i, j
    run(f, make)


def test_trailing_dims_kept_and_non_contiguous_source():
    """x.t()[i] reads a transposed input at computed rows; the trailing dim follows the loop."""
    def f(x, i):
        return x.t()[i].sum(-1), x.t()[i] - 1

    run(f, lambda: (torch.randn(6, 11), torch.randint(0, 11, (2, 3))), exact=False)


def test_index_select_and_embedding():
    def f(w, i, j, k):
        return F.embedding(i, w) + 1, torch.index_select(w, 1, j) * 3, torch.index_select(w, 0, k)

    run(f, lambda: (torch.randn(10, 7), torch.randint(0, 10, (2, 5)), torch.randint(0, 7, (4,)),
                    torch.tensor(3)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.bool, torch.int32, torch.float64])
def test_source_dtypes(dtype):
    def f(x, i):
        return x[i], x[i.flip(0)]

    def make():
        x = torch.randn(9, 3) * 4
        return x.to(dtype) if dtype != torch.bool else x > 0, torch.randint(0, 9, (13,))
    run(f, make, libtorch_calls=1)  # (the flip)


def test_gather_inside_a_reduction():
    """roi_align's shape: weighted bilinear samples gathered with broadcast index tensors and
    summed over the samples, one fused loop; an arange as one of the indices."""
    def f(feat, y, xs, w):
        k = y.shape[0]
        c = feat.shape[1]
        v = feat[torch.zeros(k, 1, 1, 1, dtype=torch.int64), torch.arange(c)[None, :, None, None],
                 y[:, None, :, None], xs[:, None, None, :]]   # [K, C, PH, PW]
        return (v * w[:, None]).sum((-1, -2))

    def make():
        feat = torch.randn(1, 8, 13, 17)
        return (feat, torch.randint(0, 13, (5, 3)).int(), torch.randint(0, 17, (5, 4)).int(),
                torch.rand(5, 3, 4))
    run(f, make, exact=False, libtorch_calls=2)  # (the zeros and the arange)


def test_out_of_range_raises_as_eager():
    def f(x, i):
        return x[i] + 1

    opt = dynamo.optimize(f)
    x = torch.randn(4, 3)
    for _ in range(3):
        assert torch.equal(opt(x, torch.tensor([0, 3, -4])), f(x, torch.tensor([0, 3, -4])))
    for bad in ([4], [-5], [0, 1, 2, 9]):
        with pytest.raises(IndexError):
            opt(x, torch.tensor(bad))
    assert torch.equal(opt(x, torch.tensor([1, 2])), f(x, torch.tensor([1, 2])))


@pytest.mark.parametrize("which", ["embedding", "index_select"])
def test_negative_ids_raise_where_aten_raises(which):
    """embedding and index_select refuse negative indices (IndexError), where x[i] counts them
    from the end: compiled, the same."""
    def f(w, i):
        return (F.embedding(i, w) if which == "embedding" else torch.index_select(w, 0, i)) + 1

    opt = dynamo.optimize(f)
    w = torch.randn(6, 20)
    for _ in range(3):
        i = torch.randint(0, 6, (5,))
        assert torch.equal(opt(w, i), f(w, i))
    for bad in ([-1], [2, -6, 1]):
        for _ in range(2):  # (a failed run drops the trace: compiled again first)
            i = torch.randint(0, 6, (len(bad),))
            assert torch.equal(opt(w, i), f(w, i))
        with pytest.raises(IndexError):
            f(w, torch.tensor(bad))
        failed = dynamo.counters()["abort_native_run"]
        with pytest.raises(IndexError):
            opt(w, torch.tensor(bad))
        assert dynamo.counters()["abort_native_run"] > failed  # the compiled code caught it


def test_mask_and_separated_indices_stay_externs():
    """A boolean mask, and index tensors separated by a slice (ATen moves their dims to the
    front): still right, through LibTorch."""
    def f(x, i, m):
        return x[:, i][m[:, None].expand(-1, i.numel())], x[i, :, i]

    run(f, lambda: (torch.randn(4, 6, 4), torch.tensor([0, 3]), torch.tensor([True, False, True, True])),
        libtorch_calls=None)


def test_written_source_is_read_before_the_write():
    """x[i] read, then x written in place: the gather sees the old contents, as eager."""
    def f(x, i):
        y = x[i] * 2
        x.add_(1)
        return y

    def make():
        return torch.randn(8, 3), torch.randint(0, 8, (5,))
    dynamo.reset()
    opt = dynamo.optimize(f)
    for _ in range(3):
        x, i = make()
        x2 = x.clone()
        want, got = f(x, i), opt(x2, i)
        assert torch.equal(got, want) and torch.equal(x2, x)


@pytest.mark.parametrize("sampling", [2, 0])
def test_torchvision_roi_align_is_recorded(sampling):
    """torchvision's Python roi_align (used where its C++ ops are absent; it wraps itself in
    torch.compile on first use) recorded with its caller: its gathers fused, eager's values. With
    sampling_ratio 0 the grid size depends on the boxes (a size read from the data)."""
    torchvision = pytest.importorskip("torchvision")

    def f(feat, boxes):
        return torchvision.ops.roi_align(feat, [boxes], output_size=(5, 5), spatial_scale=0.25,
                                         sampling_ratio=sampling).relu()

    def make():
        xy = torch.rand(6, 2) * 40
        return torch.randn(1, 8, 16, 16), torch.cat([xy, xy + torch.rand(6, 2) * 20 + 1], 1)
    run(f, make, exact=False, libtorch_calls=None)
    if sampling:
        assert dynamo.counters()["stitches"] == 0, dynamo.report()


@pytest.mark.parametrize("width", [16, 37, 1023])
def test_wide_rows_are_read_whole(width):
    """Rows at least a vector wide (an embedding's token rows): each vector of a row is one
    contiguous read at the row's index; negative indices, int32 ids, a row picked twice; an id
    out of range raises eager's IndexError."""
    def f(w, ids, pos):
        return F.embedding(ids, w) * 2 + w[pos]

    def make():
        return (torch.randn(50, width), torch.randint(0, 50, (3, 7)),
                torch.randint(-50, 50, (7,), dtype=torch.int32))
    run(f, make)
    opt = dynamo.optimize(f)
    w, ids, pos = make()
    for bad in (50, -1):
        for _ in range(2):  # (a failed run drops the trace: compiled again first)
            assert torch.equal(opt(w, ids, pos), f(w, ids, pos))
        ids2 = ids.clone()
        ids2[1, 3] = bad
        failed = dynamo.counters()["abort_native_run"]
        with pytest.raises(IndexError):
            opt(w, ids2, pos)
        assert dynamo.counters()["abort_native_run"] > failed  # the compiled code caught it


def _roi_like_indices(k, c, h, w, dtype):
    """roi_align's four broadcast index tensors ([K,1,..], [1,C,..], [K,1,PH,1,IY,1], [K,1,1,PW,1,IX])."""
    b = torch.zeros(k, dtype=dtype)[:, None, None, None, None, None]
    ch = torch.arange(c)[None, :, None, None, None, None]
    y = torch.randint(0, h, (k, 7, 2), dtype=dtype)[:, None, :, None, :, None]
    x = torch.randint(0, w, (k, 7, 2), dtype=dtype)[:, None, None, :, None, :]
    return [b, ch, y, x]


@pytest.mark.parametrize("case", ["int32", "int64", "negative", "transposed", "fewer", "small"])
def test_recorder_runs_index_as_aten_does(case):
    """While recording, aten::index runs with narrow indices widened first and, for a large gather
    over every dim, as one flat take (dynamo.recorder._index_long: a Faster R-CNN's first call
    1.1 s -> 0.75 s): bit-equal values and the same strides as ATen's own call, in every case
    where the flat path applies and where it must not (negative indices, index tensors laid out
    column-major, fewer index tensors than dims, small results)."""
    from dynamo import recorder
    aten = torch.ops.aten
    src = torch.randn(2, 40, 9, 11)
    idx = _roi_like_indices(60, 40, 9, 11, torch.int64 if case == "int64" else torch.int32)
    flat = case in ("int32", "int64")
    if case == "negative":
        idx[3] = idx[3] - 11
    elif case == "transposed":  # y's [K, PH, IY] laid out column-major: ATen's result is not row-major
        y = torch.randint(0, 9, (2, 7, 60), dtype=torch.int32).permute(2, 1, 0)
        idx[2] = y[:, None, :, None, :, None]
    elif case == "fewer":
        idx = idx[:3]
    elif case == "small":
        idx = _roi_like_indices(3, 4, 9, 11, torch.int32)
    want = aten.index.Tensor(src, idx)
    got = recorder._index_long(aten.index.Tensor, (src, idx), {})
    assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
    used = recorder._flat_gather(src, [i.long() for i in idx], want.shape) is not None and \
        all(recorder._row_major(i, want.shape) for i in idx)
    assert used == flat, case


@pytest.mark.parametrize("bad", ["range", "int8"])
def test_recorder_index_raises_as_aten_does(bad):
    """An index out of range, and int8 indices (ATen takes int64, int32, uint8 and bool only):
    IndexError while recording as in eager."""
    from dynamo import recorder
    src = torch.randn(2, 40, 9, 11)
    idx = _roi_like_indices(60, 40, 9, 11, torch.int32)
    if bad == "range":
        idx[2] = idx[2] + 9
    else:
        idx[0] = idx[0].to(torch.int8)
    with pytest.raises(IndexError):
        torch.ops.aten.index.Tensor(src, idx)
    with pytest.raises(IndexError):
        recorder._index_long(torch.ops.aten.index.Tensor, (src, idx), {})


def test_recorder_index_put_with_int32_indices():
    from dynamo import recorder
    aten = torch.ops.aten
    x, v = torch.randn(6, 5), torch.randn(3)
    i, j = torch.tensor([0, 5, 2], dtype=torch.int32), torch.tensor([4, 0, 1], dtype=torch.int32)
    want = aten.index_put.default(x, [i, j], v, True)
    got = recorder._index_long(aten.index_put.default, (x, [i, j], v, True), {})
    assert torch.equal(got, want)


def test_large_roi_align_gathers_record_and_compile():
    """torchvision's roi_align over many boxes and channels (its gathers 1.4M elements each: the
    recorder's flat path) recorded and compiled: eager's values."""
    torchvision = pytest.importorskip("torchvision")

    def f(feat, boxes):
        return torchvision.ops.roi_align(feat, [boxes], output_size=(7, 7), spatial_scale=0.125,
                                         sampling_ratio=2)

    def make():
        xy = torch.rand(40, 2) * 60
        return torch.randn(1, 180, 10, 10), torch.cat([xy, xy + torch.rand(40, 2) * 30 + 1], 1)
    run(f, make, exact=False, libtorch_calls=None)


def test_recorder_index_with_a_mask_and_int32_indices():
    """A boolean mask beside an int32 index (its dims are the mask's nonzeros, not a broadcast):
    ATen's own call, same values."""
    from dynamo import recorder
    aten = torch.ops.aten
    x = torch.randn(4, 5, 6)
    m = torch.tensor([True, False, True, True])
    j = torch.tensor([0, 2, 5], dtype=torch.int32)
    want = aten.index.Tensor(x, [m, None, j])
    got = recorder._index_long(aten.index.Tensor, (x, [m, None, j]), {})
    assert torch.equal(got, want) and got.stride() == want.stride()
