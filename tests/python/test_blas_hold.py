"""OpenBLAS held to one thread while dynamo records and while a trace that calls LibTorch runs
(dynamo_blas_hold): its products then do not fight ATen's spinning OpenMP threads. The hold is
seen from inside a recording, and OpenBLAS's own count comes back after every call, after a
call that raises, and after native runs. Skipped without OpenBLAS (the reference BLAS)."""
import ctypes
import os

import pytest
import torch

import dynamo
from dynamo import native


def _openblas():
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if ".so" in line and "/" in line})
    for p in paths:
        name = os.path.basename(p)
        if name.startswith("libopenblas") or name.startswith("libblas"):
            try:
                lib = ctypes.CDLL(p, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                lib.openblas_get_num_threads.restype = ctypes.c_int
                lib.openblas_set_num_threads.argtypes = [ctypes.c_int]
                return lib
            except (OSError, AttributeError):
                continue
    return None


@pytest.fixture
def openblas():
    torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    lib = _openblas()
    if lib is None:
        pytest.skip("no OpenBLAS in this process")
    before = lib.openblas_get_num_threads()
    lib.openblas_set_num_threads(2)  # something for the hold to change, even under OPENBLAS_NUM_THREADS=1
    yield lib
    lib.openblas_set_num_threads(before)


def test_recording_holds_openblas_to_one_thread(openblas):
    seen = []

    @dynamo.disable
    def peek():  # a stitch: made for real, inside the recording
        seen.append(openblas.openblas_get_num_threads())

    w = torch.randn(16, 8)

    def f(x):
        y = torch.relu(x @ w)
        peek()
        return y * 2

    jit = dynamo.optimize(f)
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(4, 16)
            assert torch.allclose(jit(x), f(x), rtol=1e-5, atol=1e-5)
            assert openblas.openblas_get_num_threads() == 2, f"call {k + 1} left OpenBLAS changed"
    assert dynamo.counters()["native_runs"] >= 2, dynamo.report()
    # the recording's step saw the hold; later calls make the step between native runs, unheld
    assert seen[0] == 1, seen
    assert native.lib().dynamo_blas_threads() == 2


def test_count_comes_back_when_the_recorded_call_raises(openblas):
    def f(x):
        y = x @ x
        if x.shape[0] == 3:
            raise ValueError("the program's own")
        return y

    jit = dynamo.optimize(f)
    with pytest.raises(ValueError, match="the program's own"):
        jit(torch.randn(3, 3))
    assert openblas.openblas_get_num_threads() == 2


def test_hold_refuses_bad_use(lib):
    assert lib.dynamo_blas_hold(2) != 0
    assert b"enter must be 0 or 1" in lib.dynamo_last_error()
    assert lib.dynamo_blas_hold(0) != 0
    assert b"released without a hold" in lib.dynamo_last_error()
