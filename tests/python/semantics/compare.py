"""The semantics suite's one check: a small function run eagerly and through dynamo.optimize on
the same fresh arguments, three calls (the first records, the later ones run the compiled trace
or its guards refuse them), every result compared with eager's -- values, types, identities the
function itself reports, and exceptions by type and message."""
import torch

import dynamo


def outcome(fn, args):
    """What a call gives: ("ok", result) or ("raised", type, message, cause/context types)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 -- the program's own exception is part of its meaning
        return ("raised", type(e), str(e), type(e.__cause__), type(e.__context__), e.__suppress_context__)


def same(got, want, path="result"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__}, eager a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{path}: {got.dtype}{list(got.shape)}"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{path} differs")
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__}, eager {type(want).__name__}"
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: length {len(got)}, eager {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)}, eager {list(want)}"
        for k in want:
            same(got[k], want[k], f"{path}[{k!r}]")
    else:
        assert got == want, f"{path}: {got!r}, eager {want!r}"


def matches_eager(fn, make_args, calls=3):
    """fn through dynamo.optimize against fn itself, on make_args() (fresh each call, the same
    values for both sides, inputs compared after the call too: in-place writes)."""
    opt = dynamo.optimize(fn)
    for call in range(calls):
        args = make_args()
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        want = outcome(fn, args)
        got = outcome(opt, mine)
        same(got, want, f"call {call + 1}")
        for i, (a, b) in enumerate(zip(mine, args)):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b, msg=f"call {call + 1}: argument {i} after the call")
    return dynamo.counters()
