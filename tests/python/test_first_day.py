"""What a new user meets on the first day (issue 39): each finding of a user trying dynamo on
their own scripts, reproduced and checked against eager."""
import os
import subprocess
import sys
import traceback

import pytest
import torch

import dynamo

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = os.path.dirname(os.path.abspath(dynamo.__file__))


def _frames(e):
    return [(os.path.abspath(f.filename), f.name) for f in traceback.extract_tb(e.__traceback__)]


# -- 6: a program's own exception comes out once, with the program's own traceback ----------------

def test_a_programs_exception_is_raised_once_with_its_own_frames():
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise ValueError("mine")
        return y

    g = dynamo.optimize(f)
    for _ in range(3):  # cold (eager), then recorded: each time eager's exception, alone
        with pytest.raises(ValueError, match="mine") as info:
            g(torch.randn(3))
        e = info.value
        assert e.__context__ is None and e.__cause__ is None, "raised during handling of another exception"
        frames = _frames(e)
        assert not [fr for fr in frames if fr[0].startswith(PACKAGE)], frames
        assert frames[-1][1] == "f"
    assert torch.equal(g(torch.ones(4)), torch.ones(4) + 1)


def test_an_exception_after_a_side_exit_is_raised_once():
    def f(x):
        if x.sum() > 0:
            return x * 2
        raise KeyError("negative")

    g = dynamo.optimize(f)
    for _ in range(3):
        g(torch.ones(5))
    for _ in range(4):  # the exit's side trace is recorded on a later one of these calls
        with pytest.raises(KeyError, match="negative") as info:
            g(-torch.ones(5))
        assert info.value.__context__ is None
        assert not [fr for fr in _frames(info.value) if fr[0].startswith(PACKAGE)]
