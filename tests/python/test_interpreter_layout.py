"""The recording interpreter has one handler per bytecode (`_op_<NAME>` methods marked with
`@_handles`), and the bytecodes it supports are exactly those handlers' plus the few it skips:
a code object using any other is refused before it runs (`unsupported_reason`)."""
import dis

from dynamo import interpreter as I


def test_every_supported_bytecode_has_one_handler():
    assert I._SUPPORTED == frozenset(I._HANDLERS) | I._SKIPPED
    assert all(n in dis.opmap for n in I._SUPPORTED)
    for name, fn in I._HANDLERS.items():
        assert fn.__name__.startswith("_op_") and name in fn.opnames
    assert not set(I._HANDLERS) & I._SKIPPED


def test_a_bytecode_without_a_handler_is_refused_up_front():
    def delegates():
        yield from range(3)  # SEND: no handler
    why = I.unsupported_reason(delegates.__code__, top=True)
    assert why is not None and ("SEND" in why or "generator" in why), why
