"""In-place writes into a trace's inputs run after the trace in an order the planner chooses
(jit/fuse.cpp, order_mutations): writes into one input keep program order, and a write whose
expression reads an input's old contents runs before the other writes into that input; cycles go
through a buffer. Writes over one shape share a kernel when every memory they write is read and
written at the same elements by all of them (join_mutation); else each has its own. Each program
here writes several inputs that read each other and is compared with eager on fresh copies of
random inputs: results and every input after the call, over odd sizes and several calls."""
import pytest
import torch

import dynamo


def check(fn, *shapes, calls=3, make=torch.randn):
    jit = dynamo.optimize(fn)
    for call in range(calls):
        args = [make(*s) for s in shapes]
        mine, ref = [a.clone() for a in args], [a.clone() for a in args]
        out, want = jit(*mine), fn(*ref)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6), (call, (out - want).abs().max())
        for k, (a, b) in enumerate(zip(mine, ref)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (call, k, (a - b).abs().max())
    assert sum(c.runs for c in jit.compiled) >= calls - 1, dynamo.report()


@pytest.mark.parametrize("n", [1, 7, 1023])
def test_momentum_step_writes_the_parameter_from_the_buffer_it_also_writes(n):
    def sgd(p, g, buf):
        buf.mul_(0.9).add_(g)
        p.add_(buf * -0.01)
        return p.sum()
    check(sgd, (n, 3), (n, 3), (n, 3))


def test_two_inputs_that_read_each_other_a_cycle():
    def f(a, b):
        a.add_(b)
        b.mul_(a)  # the new a
        return a + b
    check(f, (5, 7), (5, 7))


def test_swap_through_a_clone():
    def f(a, b):
        t = a.clone()
        a.copy_(b)
        b.copy_(t)
        return a - b
    check(f, (33,), (33,))


def test_transposed_reads_of_a_written_input():
    def f(a, b):
        a.add_(b.t())
        b.mul_(a.t() + 1)
        return b.sum(0)
    check(f, (9, 9), (9, 9))


def test_a_write_through_a_row_then_the_whole_input():
    def f(a, b):
        a[0].add_(b[1])
        b.add_(a[0])  # broadcast over b's rows: the row a just got
        a.mul_(2)
        return a.sum() + b.sum()
    check(f, (4, 6), (4, 6))


def test_three_inputs_in_a_chain_and_a_reduction_of_one():
    def f(x, y, z):
        z.copy_(y * 2)
        y.copy_(x + z)
        x.sub_(y.mean())
        return x * y * z
    check(f, (8, 16), (8, 16), (8, 16))


def test_adam_like_update_of_several_parameters():
    def adam(ps, gs, ms, vs):
        for p, g, m, v in zip(ps, gs, ms, vs):
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).add_(g * g, alpha=0.001)
            p.add_(m / (v.sqrt() + 1e-8) * -1e-3)
        return ps[0].sum()

    jit = dynamo.optimize(adam)
    for call in range(3):
        shapes = [(7, 3), (1,), (1023,)]
        make = [[torch.randn(*s) for s in shapes] for _ in range(2)] + [[torch.rand(*s) for s in shapes] for _ in range(2)]
        mine = [[t.clone() for t in group] for group in make]
        ref = [[t.clone() for t in group] for group in make]
        out, want = jit(*mine), adam(*ref)
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
        for gm, gr in zip(mine, ref):
            for a, b in zip(gm, gr):
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), call
    assert sum(c.runs for c in jit.compiled) >= 2, dynamo.report()


def test_the_same_input_written_twice_exactly_and_read_between():
    def f(a, b):
        a.mul_(3)
        b.add_(a)  # reads the first write
        a.add_(b)  # replaces it: a = 3a + (b + 3a)
        return a
    check(f, (6,), (6,))


def test_a_momentum_step_writes_each_parameter_and_its_buffer_in_one_kernel():
    # buf and p read and written at the same elements: one pass over p, g and buf per parameter
    # (two kernels each before, the second reading g and buf again).
    def sgd(p1, g1, b1, p2, g2, b2, p3, g3, b3):
        for p, g, b in ((p1, g1, b1), (p2, g2, b2), (p3, g3, b3)):
            b.mul_(0.9).add_(g)
            p.add_(b, alpha=-0.01)

    jit = dynamo.optimize(sgd)
    shapes = [(7, 5), (1,), (1023,)]
    for call in range(3):
        args = [torch.randn(*s) for s in shapes for _ in range(3)]
        mine, ref = [a.clone() for a in args], [a.clone() for a in args]
        jit(*mine)
        sgd(*ref)
        for k, (a, b) in enumerate(zip(mine, ref)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=f"call {call}, input {k}")
    (c,) = jit.compiled
    assert c.runs >= 2, dynamo.report()
    assert c.stats.num_kernels <= 4, dynamo.report()  # a kernel per parameter (and one output copy)


@pytest.mark.parametrize("rows", [2, 7, 64])
def test_a_write_that_reads_a_row_another_write_replaces_stays_apart(rows):
    # a's write reads b's row 0 for every row; b's write replaces row 0 first: in one loop, a's
    # later rows would read the new row 0. Separate kernels, a's first (it reads b's old contents).
    def f(a, b):
        a.add_(b[0])
        b.mul_(2)
        return a.sum()
    check(f, (rows, 33), (rows, 33))


def test_two_writes_into_overlapping_windows_of_one_input_keep_their_order():
    def f(x, y):
        x[:, :3].mul_(2)
        x[:, 1:4].add_(y)  # overlaps the first window's columns 1 and 2
        return x.sum()
    check(f, (5, 6), (5, 3))


def test_writes_that_read_each_other_at_other_elements_through_transposes():
    def f(a, b, c):
        c.add_(a.t())  # reads a transposed where a's write below lands untransposed
        a.mul_(b)
        b.sub_(1)
        return c.sum()
    check(f, (9, 9), (9, 9), (9, 9))
