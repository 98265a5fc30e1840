"""The native engine driven from Python through ctypes: results against eager PyTorch, guards
with their reasons, and errors raised as DynamoError."""
import pytest
import torch

from dynamo import native, DynamoError


def trace(body, *decls, ret="%r"):
    lines = [f"  %{k} = input {d}" for k, d in enumerate(decls)]
    lines += [f"  {line}" for line in body]
    return native.Trace("trace @py {\n" + "\n".join(lines) + f"\n  return {ret}\n}}\n")


@pytest.mark.parametrize("n", [1, 7, 1023, 4097, 0])
def test_gelu_bias_residual_matches_eager(frame, n):
    t = trace(["%a = add(%0, %1)", "%g = gelu(%a)", "%r = add(%g, %2)"], f"f32[{n}]", f"f32[{n}]", f"f32[{n}]")
    frame.compile(t)
    x, b, res = torch.randn(n), torch.randn(n), torch.randn(n)
    (out,) = frame.run(x, b, res)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x + b) + res)


def test_broadcast_and_noncontiguous_input(frame):
    x = torch.randn(16, 9).t()  # [9, 16], strides (1, 9)
    t = trace(["%a = mul(%0, %1)", "%r = tanh(%a)"], "f32[9,16]{1,9}", "f32[16]")
    frame.compile(t)
    w = torch.randn(16)
    (out,) = frame.run(x, w)
    torch.testing.assert_close(out, torch.tanh(x * w))


def test_int_and_bool_dtypes_and_promotion(frame):
    t = trace(["%a = add(%0, %1)", "%m = gt(%a, 2.5)", "%r = where(%m, %a, %0)"], "i32[50]", "i64[50]")
    frame.compile(t)
    a, b = torch.randint(-5, 5, (50,), dtype=torch.int32), torch.randint(-5, 5, (50,))
    (out,) = frame.run(a, b)
    s = a + b
    want = torch.where(s > 2.5, s, a)
    assert out.dtype == want.dtype == torch.int64
    assert torch.equal(out, want)


def test_extern_matmul_between_fused_groups(frame):
    t = trace(["%h = relu(%0)", "%m = extern aten::mm(%h, %1) : f32[8,5]", "%r = sigmoid(%m)"], "f32[8,3]", "f32[3,5]")
    frame.compile(t)
    x, w = torch.randn(8, 3), torch.randn(3, 5)
    (out,) = frame.run(x, w)
    torch.testing.assert_close(out, torch.sigmoid(torch.relu(x) @ w))


def test_guard_miss_explains_the_failing_guard(frame):
    frame.compile(trace(["%r = exp(%0)"], "f32[4,8]"))
    with pytest.raises(DynamoError) as e:
        frame.run(torch.randn(4, 9))
    assert e.value.status == "DYNAMO_ERR_GUARD_MISS"
    assert "input 0: size mismatch at dim 1: expected 8, got 9" in str(e.value)
    with pytest.raises(DynamoError) as e:
        frame.run(torch.randn(4, 8, dtype=torch.float64))
    assert "dtype mismatch: expected float32, got float64" in str(e.value)
    with pytest.raises(DynamoError) as e:
        frame.run(torch.randn(4, 8, requires_grad=True))
    assert "requires_grad mismatch" in str(e.value)


def test_parse_error_is_a_dynamo_error_with_position():
    with pytest.raises(DynamoError) as e:
        native.Trace("trace @t {\n  %0 = input f32[4]\n  %1 = nope(%0)\n  return %1\n}")
    assert e.value.status == "DYNAMO_ERR_PARSE"
    assert "line 3, column 8" in str(e.value)


def test_text_round_trip():
    src = "trace @t {\n  %0 = input f32[3,4]{1,3}\n  %1 = input f64\n  %2 = mul(%0, %1) : f32[3,4]\n  return %2\n}\n"
    assert native.Trace(src).text() == src


def test_compile_stats(frame):
    e = frame.compile(trace(["%a = mul(%0, 2)", "%b = exp(%a)", "%r = add(%b, %a)"], "f32[100]"))
    s = e.stats()
    assert s.num_kernels == 1 and s.num_externs == 0
    assert s.compile_ms > 0


def test_docs_ir_example_parses_and_runs(frame):
    """The example in docs/IR.md stays true: it parses, compiles and matches eager."""
    import pathlib
    import re
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "IR.md").read_text()
    text = re.search(r"```\n(trace @gelu_bias \{.*?\n\})\n```", doc, re.S).group(1)
    frame.compile(native.Trace(text))
    x, b, w = torch.randn(4096, 1024), torch.randn(2048)[::2], torch.randn(1024, 16)
    out, mm = frame.run(x, b, 0.5, 7, w)
    want = torch.nn.functional.gelu(x + b, approximate="tanh") * 0.5
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(mm, want @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_round_trip_through_python(frame, dtype):
    name = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    frame.compile(trace(["%a = mul(%0, 2.0)", "%r = sum(%a, [1], true)"], f"{name}[8,33]"))
    x = torch.randn(8, 33).to(dtype)
    (out,) = frame.run(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), (x.float() * 2).sum(1, keepdim=True), rtol=2e-2, atol=2e-2)


def test_softmax_extern_is_fused_and_matches(frame):
    e = frame.compile(trace(["%r = extern aten::_softmax(%0, -1, false) : f32[64,1000]"], "f32[64,1000]"))
    assert e.stats().num_externs == 0 and e.stats().num_kernels == 1
    x = torch.randn(64, 1000)
    (out,) = frame.run(x)
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_in_place_and_aliased_outputs_behave_like_eager(frame):
    """x.mul_(2) then x.t(): the input is updated in place and the outputs are views of it."""
    frame.compile(trace(["%t = mul(%0, 2)", "%c = copy_(%0, %t)", "%r = transpose(%c, 0, 1)"], "f32[3,5]",
                        ret="%c, %r"))
    x = torch.randn(3, 5)
    want = x.clone().mul_(2)
    c, r = frame.run(x)
    torch.testing.assert_close(x, want)               # mutated in place
    assert c.data_ptr() == x.data_ptr()               # returned without a copy, like eager
    torch.testing.assert_close(r, want.t())
    assert r._base is x or r.data_ptr() == x.data_ptr()


def test_status_codes_are_the_librarys():
    """Python reads the C API's status codes from the library's one table (DYNAMO_STATUS_LIST
    through dynamo_status_name) and spells no number itself; the codes it acts on are there."""
    from dynamo import _capi
    L = native.lib()
    assert len(_capi.STATUS) >= 14 and _capi.STATUS["OK"] == 0
    for name, code in _capi.STATUS.items():
        assert L.dynamo_status_name(code).decode() == "DYNAMO_" + name
    assert _capi.STATUS_GUARD_MISS == _capi.STATUS["ERR_GUARD_MISS"] and _capi.STATUS_EXIT == _capi.STATUS["EXIT"]
    assert L.dynamo_status_name(len(_capi.STATUS) + 100).decode() == "DYNAMO_ERR_UNKNOWN"
    assert L.dynamo_abi_minor_version() >= _capi.ABI_MINOR


def test_bfloat16_rounding_matches_atens_bit_for_bit(frame):
    """float32 -> bfloat16 rounds to nearest even with subnormals kept and NaN quiet, as
    c10::BFloat16 does (a hardware conversion such as AVX512-BF16's flushes subnormals to 0)."""
    n = 1 << 16
    frame.compile(trace(["%b = to(%0, bf16)", "%r = add(%b, %b)"], f"f32[{n}]", ret="%b, %r"))
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    bits[:4096] = torch.randint(0, 1 << 23, (4096,), generator=g).to(torch.int32)   # subnormals
    bits[4096:4100] = torch.tensor([0x00018000, 0x00400000, 0x007fffff, 0x7f800001], dtype=torch.int32)
    x = bits.view(torch.float32)
    b, s = frame.run(x)
    for got, want in ((b, x.to(torch.bfloat16)), (s, x.to(torch.bfloat16) * 2)):
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), int((~same).sum())


def test_sized_trace_through_the_binding(frame):
    """One text with size variables serves every row count >= 2 (an instance per size, found
    by the next call at that size); a call that breaks the relation says which."""
    idx = frame.add_sized("trace @rows {\n"
                          "  %0 = input f32[s0,16]\n"
                          "  %1 = input f32[16,s1]\n"
                          "  %2 = extern aten::mm(%0, %1) : f32[s0,s1]\n"
                          "  %3 = gelu(%2) : f32[s0,s1]\n"
                          "  %4 = reshape(%3, [s0*s1]) : f32[s0*s1]\n"
                          "  return %4\n"
                          "}\n")
    assert idx == 0
    w = {m: torch.randn(16, m) for m in (3, 8)}
    for n, m in [(2, 3), (7, 8), (1023, 3), (7, 8)]:
        x = torch.randn(n, 16)
        (out,) = frame.run(x, w[m])
        torch.testing.assert_close(out, torch.nn.functional.gelu(x @ w[m]).reshape(-1), atol=1e-5, rtol=1e-4)
    assert frame.num_entries() == 3
    with pytest.raises(DynamoError) as e:
        frame.run(torch.randn(1, 16), w[3])
    assert "sized trace 0: s0 = input 0's size 0 is 1 (a size variable is at least 2" in str(e.value)
    with pytest.raises(DynamoError) as e:
        frame.add_sized("trace @t {\n  %0 = input f32[4]\n  return %0\n}\n")
    assert e.value.status == "DYNAMO_ERR_PARSE" and "no size variable" in str(e.value)
