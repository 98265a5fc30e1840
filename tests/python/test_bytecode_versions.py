"""The interpreter on each CPython version: every bytecode the running version's compiler emits
for this repository's tests and examples and for the model libraries' code the zoo runs (torch.nn,
torchvision, timm, transformers) has a handler after decoding (bytecode.py), or is one of the few
that fall back by design, each with the reason it gives. Run on 3.11, 3.12 and 3.13 (make test
runs the suite on each)."""
import dis
import glob
import os
import sys

import pytest
import torch

import dynamo
from dynamo import bytecode
from dynamo import interpreter as interp_mod

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CO_OPTIMIZED = 0x1  # a function's code (module code and class bodies are never interpreted)

# Bytecodes that fall back on purpose, and why (their functions still run: eagerly or as a stitch).
BY_DESIGN = {
    "CALL_INTRINSIC_1 (ASYNC_GEN_WRAP)": "async generators run eagerly",
    "ASYNC_GEN_WRAP": "async generators run eagerly",
}


def _function_codes(code):
    if code.co_flags & CO_OPTIMIZED:
        yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from _function_codes(c)


def _sources():
    for pattern in ("tests/python/**/*.py", "tests/fuzz_programs/**/*.py", "examples/**/*.py", "perf/**/*.py"):
        yield from glob.glob(os.path.join(ROOT, pattern), recursive=True)
    import timm
    import torchvision
    import transformers
    libs = ((torch, ("nn", "functional.py", "_tensor.py")), (torchvision, ("models", "ops")), (timm, ("models", "layers")),
            (transformers, ("models/gpt2", "models/bert", "models/llama", "models/vit", "models/t5", "models/qwen2",
                            "models/opt", "models/distilbert", "modeling_utils.py", "cache_utils.py",
                            "masking_utils.py", "modeling_outputs.py", "utils/generic.py", "activations.py",
                            "pytorch_utils.py", "integrations/sdpa_attention.py")))
    for pkg, parts in libs:
        root = os.path.dirname(pkg.__file__)
        for part in parts:
            path = os.path.join(root, part)
            yield from [path] if path.endswith(".py") else glob.glob(path + "/**/*.py", recursive=True)


def test_every_bytecode_of_the_tests_and_the_model_libraries_has_a_handler():
    unknown = {}
    for path in _sources():
        try:
            code = compile(open(path, encoding="utf-8").read(), path, "exec")
        except (SyntaxError, UnicodeDecodeError):  # (files for another version)
            continue
        for c in _function_codes(code):
            for ins in bytecode.decode(c):
                if ins.opname not in interp_mod._SUPPORTED and ins.opname not in BY_DESIGN:
                    unknown.setdefault(ins.opname, f"{os.path.relpath(path, ROOT)}:{c.co_name}")
    assert not unknown, f"Python {sys.version_info[:2]}: no handler for {unknown}"


def test_the_handled_set_against_this_versions_opcodes():
    """What the decoder can produce from dis.opmap: each opcode of this version is handled (under
    its decoded name), decoded into another, or listed here as never in a function's code."""
    never_in_functions = {
        # module and class-body code, async code, interactive mode, instrumentation, specialization
        "LOAD_NAME", "STORE_NAME", "DELETE_NAME", "LOAD_LOCALS", "LOAD_FROM_DICT_OR_GLOBALS",
        "LOAD_FROM_DICT_OR_DEREF", "SETUP_ANNOTATIONS", "IMPORT_STAR", "PRINT_EXPR", "GET_AWAITABLE",
        "GET_AITER", "GET_ANEXT", "END_ASYNC_FOR", "BEFORE_ASYNC_WITH", "ASYNC_GEN_WRAP", "INTERPRETER_EXIT",
        "ENTER_EXECUTOR", "EXIT_INIT_CHECK", "RESERVED", "CACHE", "JUMP", "JUMP_NO_INTERRUPT", "SETUP_FINALLY",
        "SETUP_CLEANUP", "SETUP_WITH", "POP_BLOCK", "LOAD_ZERO_SUPER_ATTR", "LOAD_ZERO_SUPER_METHOD",
        "LOAD_SUPER_METHOD", "STORE_FAST_MAYBE_NULL", "LOAD_CLOSURE" if sys.version_info >= (3, 13) else "",
        "LOAD_CLASSDEREF",
    }
    decoded_away = {"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
                    "LOAD_FAST_CHECK", "TO_BOOL", "SET_FUNCTION_ATTRIBUTE", "CALL_INTRINSIC_1", "CALL_INTRINSIC_2",
                    "PUSH_NULL"}
    missing = sorted(op for op in dis.opmap if not op.startswith("INSTRUMENTED_")
                     and op not in interp_mod._SUPPORTED and op not in never_in_functions and op not in decoded_away)
    assert not missing, f"Python {sys.version_info[:2]}: opcodes with no handler: {missing}"


def test_decoded_instructions_keep_offsets_and_jump_targets():
    def f(xs, g):
        total = 0
        for x in xs:
            if x is None or x > 3:
                continue
            total += x
        y = yield from g
        return [a * 2 for a in xs if a], total, f"{y!r:>4}", xs[1:2]
    insts = bytecode.decode(f.__code__)
    offsets = {i.offset for i in insts}
    assert len(offsets) == len(insts)
    for ins in insts:
        if ins.opname in ("FOR_ITER", "SEND", "JUMP_FORWARD", "JUMP_BACKWARD") or ins.opname.startswith("POP_JUMP"):
            assert ins.argval in offsets, ins
        if ins.opname in ("FOR_ITER", "SEND"):  # past the loop's END_FOR / END_SEND, where CPython goes on
            target = next(i for i in insts if i.offset == ins.argval)
            assert target.opname not in ("END_FOR", "END_SEND"), (ins, target)


def _gen(xs):
    y = yield from iter(xs)
    return y


def _version_constructs(x, n):
    """Constructs whose bytecode changed between 3.11 and 3.13, in one function."""
    class Base(torch.nn.Module):
        def scale(self, t):
            return t * 2

    class Child(Base):
        def scale(self, t):
            return super().scale(t) + 1  # LOAD_SUPER_ATTR (3.12+)

    rows = [r.relu() for r in x.unbind(0)]  # an inlined comprehension (3.12+)
    y = torch.stack(rows)[1:3]  # BINARY_SLICE
    z = Child().scale(y)
    tag = f"{n!r:>3}|{n}"  # FORMAT_VALUE, or CONVERT_VALUE + FORMAT_WITH_SPEC / FORMAT_SIMPLE (3.13)
    total = 0
    for v in _gen([1, 2, 3]):  # yield from, FOR_ITER past END_FOR
        total += v
    a, b = z, y  # STORE_FAST_STORE_FAST (3.13)
    buf = [0, 0, 0, 0]
    buf[1:3] = [n, n]  # STORE_SLICE
    ok = not (n > 2)  # TO_BOOL + UNARY_NOT (3.13)
    return a + b * total + (1.0 if ok else 0.0), tag, buf, dict(k=n)  # CALL_KW (3.13)


def test_version_specific_constructs_match_eager_and_compile():
    opt = dynamo.optimize(_version_constructs)
    for n in (1, 1, 3):
        x = torch.randn(4, 5)
        got, want = opt(x, n), _version_constructs(x, n)
        assert torch.allclose(got[0], want[0]) and got[1:] == want[1:]
    assert dynamo.counters()["interpreted_runs"] >= 1
