"""torch's control-flow operators inside an optimized function (torch.cond, torch.while_loop,
torch._higher_order_ops.map): each runs as in eager (a stitch: the work around it compiles) and
the results are eager's on every call, both branches taken; a DELETE_ATTR on an outside object
where no stitch can be made (their Python deletes one inside a generator's with block) ends the
recording rather than leaking an internal error."""
import pytest
import torch
from torch._higher_order_ops.map import map as control_map

import dynamo
from compare import matches_eager


def cond_both_branches(a, b):
    y = torch.cond(a.sum() > 0, lambda x: x + 1, lambda x: x - 1, (a * 2,))
    return y * b


def cond_with_closure(a, b):
    return torch.cond(b.mean() < 0, lambda x: x * b, lambda x: x.relu(), (a,)) + 1


def while_loop_counts(a, b):
    i0 = torch.tensor(0)
    i, x = torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2), (i0, a))
    return x + b, i


def mapped(a, b):
    return control_map(lambda x, y: x * y, a.view(2, 2), b[:2]).sum(0) + b[2:]


CASES = [cond_both_branches, cond_with_closure, while_loop_counts, mapped]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_control_flow_operators_run_as_in_eager(fn):
    for sign in (1, -1):  # both branches of the predicates
        matches_eager(fn, lambda: (sign * torch.rand(4), -sign * torch.rand(4)))
        dynamo.reset()


class Holder:
    pass


def _deletes_outside_in_a_with_block(holder, x):
    with torch.no_grad():
        del holder.value
    return x * 2


def test_a_deletion_that_cannot_be_stitched_ends_the_recording():
    opt = dynamo.optimize(_deletes_outside_in_a_with_block)
    for _ in range(3):
        h = Holder()
        h.value = 1
        x = torch.randn(3)
        torch.testing.assert_close(opt(h, x), x * 2)
        assert not hasattr(h, "value")
