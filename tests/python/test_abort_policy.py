"""The abort policy: every abort has a kind from one table (dynamo.reasons), counted as
abort_<kind> in dynamo.counters(); a function left to CPython is recorded again after a change
of dynamo.config, or after config.retry_after calls (then four times as many); a function the
user disabled never is. Results equal eager's on every call."""
import traceback

import pytest
import torch

import dynamo
from conftest import matches_eager
from dynamo import reasons


@pytest.fixture(autouse=True)
def saved_config():
    saved = {k: getattr(dynamo.config, k) for k in ("stitch", "retry_after")}
    yield
    for k, v in saved.items():
        setattr(dynamo.config, k, v)


def strided(x):  # as_strided over a non-contiguous view: eager's storage layout, which a trace cannot say
    return x[::2].as_strided((2, 2), (2, 1)).sum(-1) + 1


def test_every_kind_is_counted_and_listed():
    assert set(reasons.COUNTERS) <= set(dynamo.counters())
    assert all(p in ("retry", "same", "state") for p, _ in reasons.KINDS.values())
    jit = dynamo.optimize(strided)  # held: report() lists the optimized functions alive
    matches_eager(jit, strided, lambda: torch.randn(7), calls=3)
    c = dynamo.counters()
    assert c["abort_strided_view"] == c["aborts"] == 2, c  # the same abort twice: left to CPython
    assert "abort_strided_view=2" in dynamo.report() and "abort_dtype" not in dynamo.report()


def spectrum(x):
    return (torch.fft.rfft(x) * 2).abs()  # arithmetic on a complex tensor: not traced


def test_a_dtype_the_compiler_lacks_is_its_own_kind():
    jit = dynamo.optimize(spectrum)
    with torch.no_grad():
        x = torch.randn(16)
        assert torch.allclose(jit(x), spectrum(x))
    assert dynamo.counters()["abort_dtype"] == 1, dynamo.counters()


def talks(x):
    y = x * 2
    print("between")
    return y + 1


def test_a_config_change_brings_a_function_back(capsys):
    dynamo.config.stitch = False  # print aborts
    jit = dynamo.optimize(talks)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(5)
            assert torch.allclose(jit(x), talks(x))
        assert dynamo.counters()["native_runs"] == 0 and dynamo.counters()["abort_python"] == 2
        dynamo.config.stitch = True  # the next call is recorded again, with the print as a stitch
        for _ in range(4):
            x = torch.randn(5)
            assert torch.allclose(jit(x), talks(x))
    c = dynamo.counters()
    assert c["stitches"] >= 3 and c["native_runs"] >= 3, c
    assert capsys.readouterr().out.count("between") == 16  # once per call, eager's or dynamo's


MODE = {"strided": True}


def sometimes(x):
    if MODE["strided"]:
        return x[::2].as_strided((2, 2), (2, 1)).sum(-1)
    return x * 2


def test_a_function_left_to_cpython_is_tried_again_later():
    dynamo.config.retry_after = 5
    MODE["strided"] = True
    jit = dynamo.optimize(sometimes)
    try:
        with torch.no_grad():
            for call in range(1, 13):
                if call == 3:
                    MODE["strided"] = False  # what made it abort is gone; it runs in CPython still
                x = torch.randn(6)
                assert torch.allclose(jit(x), sometimes(x))
                if call == 6:
                    assert dynamo.counters()["traces_compiled"] == 0
    finally:
        MODE["strided"] = True
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["native_runs"] >= 4, c


def test_a_disabled_function_never_comes_back():
    dynamo.config.retry_after = 1
    jit = dynamo.disable(dynamo.optimize(lambda x: x * 3))
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(3)
            assert torch.equal(jit(x), x * 3)
    assert dynamo.counters()["traces_compiled"] == 0


def doubled_sum(x):
    return (x * 2).sum(-1)


def test_a_dtype_abort_waits_for_another_dtype():
    jit = dynamo.optimize(doubled_sum)
    with torch.no_grad():
        for _ in range(4):  # complex: eager, recorded once only
            z = torch.randn(3, 4, dtype=torch.complex64)
            assert torch.allclose(jit(z), doubled_sum(z))
        c = dynamo.counters()
        assert c["abort_dtype"] == 1 and c["interpreted_runs"] == 1 and c["eager_runs"] == 3, c
        for _ in range(3):  # float32: another state, compiled
            x = torch.randn(3, 4)
            assert torch.allclose(jit(x), doubled_sum(x))
        z = torch.randn(3, 4, dtype=torch.complex64)
        assert torch.allclose(jit(z), doubled_sum(z))  # back in the complex state: eager again
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["native_runs"] == 2 and c["abort_dtype"] == 1, c


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).angle()  # a complex op not traced


class WithSpectrum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.spec = Spectrum()
        self.head = torch.nn.Linear(9, 4)

    def forward(self, x):
        return self.head(self.spec(x)).relu()


def test_a_module_waiting_for_another_state_compiles_its_parts():
    import copy
    m = WithSpectrum()
    eager = copy.deepcopy(m)
    matches_eager(dynamo.optimize(m), eager, lambda: torch.randn(2, 16), calls=5, atol=1e-6)  # (m holds it)
    assert m.head.forward.compiled and m.head.forward.compiled[0].runs >= 3, dynamo.report()
    assert dynamo.counters()["abort_dtype"] == 2, dynamo.counters()  # the module, then its spec part


def _matmul_relu(x, w):
    return torch.relu(x @ w) + 1


@pytest.mark.parametrize("through", ["optimize", "hook"])
def test_calls_that_raise_as_in_eager_do_not_disable_a_function(through):
    """Arguments eager refuses too (None, a string, a list, an int where a tensor goes) raise the
    program's own TypeError each time, with eager's message; they are neither aborts nor values
    that "change on every call", so the good calls after them still run native code."""
    jit = dynamo.optimize(_matmul_relu) if through == "optimize" else _matmul_relu
    w, x = torch.randn(8, 8), torch.randn(4, 8)

    def run(*args):
        if through == "optimize":
            return jit(*args)
        with dynamo.optimize():
            return jit(*args)
    for _ in range(2):
        torch.testing.assert_close(run(x, w), _matmul_relu(x, w))
    for bad in (None, "a", [1.0], 3, None, "b"):
        with pytest.raises(TypeError) as got:
            run(bad, w)
        with pytest.raises(TypeError) as want:
            _matmul_relu(bad, w)
        assert str(got.value) == str(want.value)
        shown = [t.filename for t in traceback.extract_tb(got.value.__traceback__)]
        assert not [f for f in shown if "/python_shim/dynamo/" in f], shown  # eager's traceback, not dynamo's
    before = dynamo.counters()["native_runs"]
    for _ in range(20):
        torch.testing.assert_close(run(x, w), _matmul_relu(x, w))
    c = dynamo.counters()
    assert c["native_runs"] - before == 20, c
    assert c["aborts"] == 0 and c["eager_runs"] == 0, c
    said = dynamo.report()
    assert "changes on every call" not in said and "inside dynamo" not in said, said
