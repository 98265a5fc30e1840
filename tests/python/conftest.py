"""Session fixtures: load libdynamo once (checking its ABI version) and share one engine."""
import os
import sys

import pytest
import torch

# torchvision's C++ operators where its library cannot load beside this torch (perf/torchvision_ops.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
import torchvision_ops  # noqa: E402

torchvision_ops.ensure()

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


# Tests that fail only because of the move from torch 1.13 to 2.13 (issue 38), each marked
# xfail(strict=True) with its reason: a test that starts passing fails the run until it is taken
# off this list. Keys: "file::test" (every parametrization) or "file::test[param]".
_YIELD_FROM = ("torch 2.13: nn.MultiheadAttention / TransformerEncoderLayer call Module.named_modules "
               "(yield from), which the recording interpreter does not run")
TORCH_213_XFAIL = {
    "test_fused_op_decompositions.py::test_encoder_layer": _YIELD_FROM,
    "test_fused_op_decompositions.py::test_encoder_layer_norms_are_kernels_not_calls": _YIELD_FROM,
    "test_fused_op_decompositions.py::test_encoder_layer_with_padding_mask_keeps_the_fused_op": _YIELD_FROM,
    "test_fused_op_decompositions.py::test_encoder_stack_records_every_layer_as_ops": _YIELD_FROM,
    "test_fused_op_decompositions.py::test_multihead_attention_fast_path": _YIELD_FROM,
    "test_fused_op_decompositions.py::test_multihead_attention_with_weights": _YIELD_FROM,
    "test_generators.py::test_transformer_encoder_layer_fast_path_check_runs_natively": _YIELD_FROM,
    "test_size_families.py::test_encoder_layer_over_lengths_records_twice": _YIELD_FROM,
    "test_size_probes.py::test_encoder_layer_over_lengths_and_batches_records_once": _YIELD_FROM,
    "test_size_reads.py::test_attention_module_over_lengths": _YIELD_FROM,
    "test_training.py::test_transformer_encoder_block_with_its_default_dropout": _YIELD_FROM,
    "test_training.py::test_transformer_encoder_block_without_dropout": _YIELD_FROM,
    "test_module_state.py::test_whole_module_round_trip[torch.save]":
        "torch 2.13: torch.load defaults to weights_only=True",
    "test_programs.py::test_once_fallback_program_is_recorded[with_block]": "torch 2.13: not yet looked at",
    "test_reliability.py::test_linear_with_a_bias_of_another_dtype": "torch 2.13: not yet looked at",
    "test_reliability.py::test_torch_call_that_fails_only_under_the_recorder": "torch 2.13: not yet looked at",
    "test_scatter_folding.py::test_nn_lstm_matches_eager": "torch 2.13: not yet looked at",
    "test_size_families.py::test_clamped_slice_stays_a_constant": "torch 2.13: not yet looked at",
    "test_training.py::test_optimizer_step_compiled_matches_eager":
        "torch 2.13: optimizers' step is wrapped differently (no .update / _step_count)",
    "test_training.py::test_optimizer_step_under_the_frame_hook":
        "torch 2.13: optimizers' step is wrapped differently (no .update / _step_count)",
    "test_training.py::test_second_derivative_raises_instead_of_a_wrong_answer":
        "torch 2.13: AOTAutograd's donated buffers raise their own message first",
    "test_upsample_scales.py::test_inexact_scale_runs_eagerly_and_right": "torch 2.13: not yet looked at",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        base = os.path.basename(str(item.fspath))
        reason = (TORCH_213_XFAIL.get(f"{base}::{item.name}")
                  or TORCH_213_XFAIL.get(f"{base}::{getattr(item, 'originalname', item.name)}"))
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
