"""Session fixtures: load libdynamo once (checking its ABI version) and share one engine."""

import pytest
import torch

import dynamo
from dynamo import native


@pytest.fixture(autouse=True)
def fresh():
    """Every test starts and ends with no compiled traces and zeroed counters (test files may
    override this fixture to do more), and from one random seed: an unseeded input could put a
    cancelling sum near zero, where rounding of another summation order exceeds a fixed atol."""
    torch.manual_seed(0)
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.fixture(scope="session")
def lib():
    L = native.lib()
    assert L.dynamo_abi_version() == dynamo.ABI_VERSION
    return L


@pytest.fixture(scope="session")
def engine(lib):
    e = native.Engine()
    yield e


@pytest.fixture
def frame(engine):
    f = native.Frame(engine, "pytest")
    yield f
    f.close()


# Figures tests want shown (soak memory readings): printed after the run, past pytest's capture.
REPORT = []


def pytest_terminal_summary(terminalreporter):
    for line in REPORT:
        terminalreporter.write_line(line)


def matches_eager(jit, eager, make_input, calls, rtol=1e-5, atol=1e-8):
    """Calls jit and eager on `calls` fresh inputs (make_input()) under torch.no_grad(), asserting
    on every call that jit's result is allclose to eager's (the tests' "correct on every call")."""
    with torch.no_grad():
        for _ in range(calls):
            x = make_input()
            got, want = jit(x), eager(x)
            assert torch.allclose(got, want, rtol=rtol, atol=atol), (got - want).abs().max()
