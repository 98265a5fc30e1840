"""Exceptions (the language reference's "The raise statement" and "The try statement"): implicit
chaining (__context__ is the exception being handled), explicit chaining (`raise ... from`:
__cause__, __suppress_context__), re-raising, `raise` of a class, handlers for BaseException's
other subclasses, finally and else clauses, exceptions raised by operations inside a handler.
Each function reports what it caught; compared with eager on three calls."""
import pytest
import torch

from compare import matches_eager


def _facts(e):
    return (type(e).__name__, str(e), type(e.__context__).__name__, type(e.__cause__).__name__,
            e.__suppress_context__)


def implicit_context(a, b):
    try:
        try:
            raise ValueError(1)
        except ValueError:
            raise TypeError(2)
    except TypeError as e:
        return a + b, _facts(e)


def explicit_cause(a, b):
    try:
        try:
            raise ValueError(1)
        except ValueError as v:
            raise TypeError(2) from v
    except TypeError as e:
        return a + b, _facts(e)


def from_none(a, b):
    try:
        try:
            raise ValueError(1)
        except ValueError:
            raise TypeError(2) from None
    except TypeError as e:
        return a + b, _facts(e), e.__cause__ is None


def cause_class(a, b):
    try:
        raise KeyError("k") from IndexError
    except KeyError as e:
        return a * b, _facts(e)


def raise_class(a, b):
    try:
        raise ZeroDivisionError
    except ArithmeticError as e:
        return a - b, _facts(e), e.args


def operation_in_handler(a, b):
    try:
        try:
            raise KeyError("first")
        except KeyError:
            {}["second"]
    except KeyError as e:
        return a - b, _facts(e), str(e.__context__)


def tensor_error_in_handler(a, b):
    try:
        try:
            raise ValueError("shape")
        except ValueError:
            a.view(3, 5)
    except RuntimeError as e:
        return b * 2, type(e).__name__, type(e.__context__).__name__


def context_through_call(a, b):
    def inner():
        raise LookupError("inner")
    try:
        try:
            raise OSError("outer")
        except OSError:
            inner()
    except LookupError as e:
        return a + 1, _facts(e)


def bare_reraise_keeps_context(a, b):
    try:
        try:
            try:
                raise ValueError(1)
            except ValueError:
                raise TypeError(2)
        except TypeError:
            raise
    except TypeError as e:
        return a * 3, _facts(e)


def handled_then_new(a, b):
    try:
        raise ValueError(1)
    except ValueError:
        pass
    try:
        raise TypeError(2)  # raised after the handler ended: no context
    except TypeError as e:
        return a + b, _facts(e)


def context_cycle_cut(a, b):
    try:
        try:
            raise ValueError("a")
        except ValueError as first:
            try:
                raise TypeError("b")
            except TypeError:
                raise first
    except ValueError as e:
        return a + b, _facts(e), type(e.__context__.__context__).__name__


def catches_keyboard_interrupt(a, b):
    try:
        raise KeyboardInterrupt("stop")
    except BaseException as e:
        return a * b, type(e).__name__


def catches_generator_exit(a, b):
    try:
        raise GeneratorExit()
    except BaseException as e:
        return a * 2, type(e).__name__, isinstance(e, Exception)


def catches_system_exit(a, b):
    try:
        raise SystemExit(3)
    except SystemExit as e:
        return a + b, e.code


def finally_and_else(a, b):
    order = []
    try:
        order.append("try")
    except ValueError:
        order.append("except")
    else:
        order.append("else")
    finally:
        order.append("finally")
    return a * len(order), order


def finally_after_raise(a, b):
    order = []
    try:
        try:
            raise ValueError(1)
        finally:
            order.append("finally")
    except ValueError as e:
        order.append(type(e).__name__)
    return a + b, order


def exception_attributes(a, b):
    try:
        raise OSError(2, "no such file", "x.txt")
    except OSError as e:
        return a + b, e.errno, e.strerror, e.filename, e.args


def exception_group_star(a, b):
    try:
        raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
    except* ValueError as g:
        caught = [type(x).__name__ for x in g.exceptions]
    except* TypeError:
        pass
    return a + b, caught


def uncaught_with_context(a, b):
    try:
        raise ValueError("first")
    except ValueError:
        raise RuntimeError("second")


def uncaught_from(a, b):
    try:
        raise ValueError("first")
    except ValueError as v:
        raise RuntimeError("second") from v


def raise_non_exception(a, b):
    try:
        raise 3
    except TypeError as e:
        return a + b, str(e)


CASES = [implicit_context, explicit_cause, from_none, cause_class, raise_class, operation_in_handler,
         tensor_error_in_handler, context_through_call, bare_reraise_keeps_context, handled_then_new,
         context_cycle_cut, catches_keyboard_interrupt, catches_generator_exit, catches_system_exit,
         finally_and_else, finally_after_raise, exception_attributes, exception_group_star,
         uncaught_with_context, uncaught_from, raise_non_exception]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_exceptions_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
