"""The Python side of the GPU backend on a machine without a GPU (Debian's torch has no CUDA).

* native.Engine(torch.device("cuda")) reaches the C API's CUDA engine: here it fails with
  DYNAMO_ERR_NO_DEVICE and the driver's reason; with the stand-in driver (tests/c/fake_cuda.c, in
  a subprocess so that the driver is opened fresh) it opens, and a `cuda:0` trace compiles into a
  loaded GPU program of one kernel, a matrix product compiles with the stand-in cuBLASLt
  (tests/c/fake_cublaslt.c) and is refused without one, and a LibTorch op is refused with its
  reason.
* Tensors on other devices abort the recording with the reason, and the function runs eagerly.
GPU results themselves are checked on a GPU by tests/gpu/gpu_check (docs/GPU.md).
"""
import os
import subprocess
import sys

import pytest
import torch

import dynamo
from dynamo import native
from dynamo._capi import DynamoError

LIBRARY = os.environ.get("DYNAMO_LIBRARY", "")
FAKE = os.path.join(os.path.dirname(LIBRARY), "tests", "libfake_cuda.so")
FAKE_BLAS = os.path.join(os.path.dirname(LIBRARY), "tests", "libfake_cublaslt.so")


def gpu_present(lib):
    why = bytes(256)
    return lib.dynamo_gpu_available(why, len(why)) == 0


def test_cuda_engine_without_a_driver_says_why(lib):
    if gpu_present(lib):
        pytest.skip("a CUDA driver with a device is present here")
    with pytest.raises(DynamoError) as e:
        native.Engine(torch.device("cuda", 0))
    assert e.value.status == "DYNAMO_ERR_NO_DEVICE"
    assert "no device" in e.value.message


STAND_IN = r"""
import torch
from dynamo import native
from dynamo._capi import DynamoError
eng = native.Engine(torch.device("cuda", 0))
frame = native.Frame(eng, "gpu")
entry = frame.compile(native.Trace(
    "trace @f {\n  %0 = input f32[64,1024] cuda:0\n  %1 = input f32[1024] cuda:0\n"
    "  %2 = add(%0, %1)\n  %3 = gelu(%2)\n  %4 = sum(%3, [1], true)\n  %5 = div(%3, %4)\n  return %5\n}\n"))
print("kernels", entry.stats().num_kernels)
for text in ("trace @mm {\n  %0 = input f32[8,3] cuda:0\n  %1 = input f32[3,5] cuda:0\n"
             "  %2 = extern aten::mm(%0, %1) : f32[8,5]\n  return %2\n}\n",
             "trace @cs {\n  %0 = input f32[8,3] cuda:0\n  %1 = extern aten::cumsum(%0, 0) : f32[8,3]\n  return %1\n}\n"):
    try:
        frame.compile(native.Trace(text))
        print("compiled", text.split()[1])
    except DynamoError as e:
        print("refused", e.status, e.message)
"""


def test_cuda_engine_through_the_stand_in_driver():
    if not os.path.exists(FAKE):
        pytest.skip(f"stand-in driver not built ({FAKE})")
    for blas in (FAKE_BLAS, "/nonexistent/libcublasLt.so"):
        env = dict(os.environ, DYNAMO_LIBCUDA=FAKE, FAKE_CUDA_DEVICES="1", DYNAMO_LIBCUBLASLT=blas)
        r = subprocess.run([sys.executable, "-c", STAND_IN], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "kernels 1" in r.stdout
        if blas == FAKE_BLAS:
            assert "compiled @mm" in r.stdout, r.stdout
        else:
            assert "refused DYNAMO_ERR_UNSUPPORTED cuBLASLt is not installed" in r.stdout, r.stdout
        assert "refused DYNAMO_ERR_UNSUPPORTED extern aten::cumsum cannot run on the GPU: only matrix products" \
            in r.stdout, r.stdout


def test_tensors_on_other_devices_run_eagerly():
    @dynamo.optimize
    def f(x, y):
        return (x + y).relu()

    x = torch.empty(4, 8, device="meta")
    out = f(x, x)
    assert out.device.type == "meta" and out.shape == (4, 8)
    reasons = " ".join(str(a.reason) for a in f.attempts)
    assert "dynamo compiles CPU and CUDA tensors only" in reasons


def test_gpu_option_is_documented_and_on_by_default():
    assert dynamo.config.gpu is True
    assert "gpu " in dynamo.config.__doc__
