"""Iteration (the language reference's "The for statement" and the iterator protocol) over every
builtin iterable, and the itertools and functools helpers programs use around tensors; then the
places where a tensor meets Python itself: truth value, len, iteration over its first dim,
torch.Size arithmetic, numbers read from it. Compared with eager on three calls."""
import collections
import functools
import itertools

import pytest
import torch

from compare import matches_eager


def iter_list(a, b):
    out = []
    for t in [a, b]:
        out.append(t * 2)
    return out


def iter_tuple_index(a, b):
    t = (a, b, a + b)
    return [t[i] * i for i in range(len(t))]


def iter_dict_keys(a, b):
    d = {"x": a, "y": b}
    return [k for k in d], [d[k] + 1 for k in d]


def iter_dict_items(a, b):
    d = {"x": a, "y": b}
    return {k: v * 2 for k, v in d.items()}


def iter_dict_values(a, b):
    return sum(v for v in {"x": a, "y": b}.values())


def iter_set_sorted(a, b):
    return [a * k for k in sorted({3, 1, 2})]


def iter_string(a, b):
    return [c for c in "abc"], a * len("abc")


def iter_range_step(a, b):
    return [a * i for i in range(10, 0, -3)]


def iter_zip_strict(a, b):
    try:
        list(zip((a, b), (1,), strict=True))
    except ValueError as e:
        return str(e), a + b


def iter_zip_three(a, b):
    return [x * y + z for x, y, z in zip((a, b), (1.0, 2.0), (b, a))]


def iter_enumerate(a, b):
    return [(i, t * i) for i, t in enumerate((a, b))]


def iter_map(a, b):
    return list(map(lambda t: t.relu(), (a, b)))


def iter_map_two(a, b):
    return list(map(torch.add, (a, b), (b, a)))


def iter_filter(a, b):
    return list(filter(lambda t: t.numel() == 4, (a, b, a[:2])))


def iter_reversed(a, b):
    return list(reversed((a, b, a * b)))


def iter_next_default(a, b):
    it = iter((a,))
    return next(it), next(it, b)


def iter_manual_stop(a, b):
    it = iter([a, b])
    out = []
    while True:
        try:
            out.append(next(it) * 3)
        except StopIteration:
            break
    return out


def iter_partial_consume(a, b):
    it = iter([a, b, a + b])
    first = next(it)
    rest = list(it)
    return first, rest


def iter_itertools_chain(a, b):
    return list(itertools.chain((a,), [b], (a + b,)))


def iter_itertools_product(a, b):
    return [x * y for x, y in itertools.product((1, 2), (3.0, 4.0))], a * 1


def iter_itertools_accumulate(a, b):
    return list(itertools.accumulate((a, b, a)))


def iter_itertools_islice(a, b):
    return list(itertools.islice(itertools.count(1), 3)), a + b


def iter_itertools_pairwise(a, b):
    return [x - y for x, y in itertools.pairwise((a, b, a * b))]


def iter_itertools_zip_longest(a, b):
    return list(itertools.zip_longest((a, b), (1,), fillvalue=0))


def iter_itertools_repeat(a, b):
    return list(itertools.repeat(a, 2)), b


def iter_functools_partial(a, b):
    mul = functools.partial(torch.mul, other=3.0)
    return mul(a), mul(b)


def iter_deque(a, b):
    d = collections.deque([a], maxlen=2)
    d.append(b)
    d.append(a + b)
    return list(d), len(d)


def iter_counter(a, b):
    c = collections.Counter("abracadabra")
    return c.most_common(2), a * c["a"]


def iter_ordered_dict(a, b):
    od = collections.OrderedDict(x=a)
    od["y"] = b
    od.move_to_end("x")
    return list(od), list(od.values())


def iter_defaultdict(a, b):
    dd = collections.defaultdict(list)
    dd["k"].append(a)
    dd["k"].append(b)
    return len(dd["k"]), dd["k"][1] * 2


def iter_chainmap(a, b):
    cm = collections.ChainMap({"x": a}, {"x": b, "y": b})
    return cm["x"], cm["y"], sorted(cm)


def iter_nested_loops(a, b):
    out = a * 0
    for i in range(2):
        for j in range(3):
            out = out + (i * 3 + j)
    return out


def iter_loop_over_modified_list(a, b):
    xs = [a]
    for t in xs:
        if len(xs) < 3:
            xs.append(t * 2)
    return xs


def tensor_truth_single(a, b):
    t = a.sum()
    return bool(t > 100), a + (1 if t.abs() >= 0 else 2)


def tensor_truth_many(a, b):
    try:
        bool(a > 0)
    except RuntimeError as e:
        return "ambiguous" in str(e), b * 1


def tensor_len(a, b):
    return len(a), len(a.view(2, 2)), a * len(b)


def tensor_iter_rows(a, b):
    m = torch.stack([a, b])
    return [row.sum() for row in m]


def tensor_unbind(a, b):
    x, y, z, w = a
    return x + y + z + w, b


def tensor_in_list(a, b):
    return len([a, b]), [a, b].index(b), b * 1


def tensor_shape_math(a, b):
    s = a.view(2, 2).shape
    return s[0] * s[1], tuple(s), s.numel(), len(s), list(s + (5,))


def tensor_size_compare(a, b):
    return a.shape == b.shape, a.shape == (4,), a.size(0) == 4, a.new_zeros(a.shape[0] // 2)


def tensor_item(a, b):
    return float(a.sum().item() > -100), int(b.numel()), a * 1


def tensor_dtype_checks(a, b):
    return a.dtype == torch.float32, a.is_floating_point(), str(a.dtype), a.to(torch.float64) * 1


def tensor_device_checks(a, b):
    return a.device.type, str(a.device), a.is_cuda, b + 0


def tensor_requires_grad_flag(a, b):
    return a.requires_grad, a.detach() * 2


def tensor_comparisons_in_python(a, b):
    return (a == a).all().item(), torch.equal(a, a), (a != b).any().item()


def tensor_as_dict_key(a, b):
    d = {a: "a", b: "b"}
    return d[a], len(d), a + b


def tensor_repr_shape(a, b):
    return repr(a.shape), str(a.shape), b * 1


def number_arithmetic(a, b):
    n = a.numel()
    return n // 3, n % 3, n ** 2, -n, n / 8, a * (n // 2)


def float_formatting(a, b):
    x = 1 / 3
    return f"{x:.3f}", round(x, 4), int(x * 100), a * x


def bool_arithmetic(a, b):
    return True + True, a * True, b * (not False)


def integer_bits(a, b):
    n = 0b1011
    return n & 6, n | 4, n ^ 1, n << 2, n >> 1, (~n), n.bit_length(), a * n


def tuple_comparisons(a, b):
    return (1, 2) < (1, 3), [1, 2] == [1, 2], (a.numel(), 0) > (3, 5), b * 1


CASES = [iter_list, iter_tuple_index, iter_dict_keys, iter_dict_items, iter_dict_values, iter_set_sorted,
         iter_string, iter_range_step, iter_zip_strict, iter_zip_three, iter_enumerate, iter_map, iter_map_two,
         iter_filter, iter_reversed, iter_next_default, iter_manual_stop, iter_partial_consume,
         iter_itertools_chain, iter_itertools_product, iter_itertools_accumulate, iter_itertools_islice,
         iter_itertools_pairwise, iter_itertools_zip_longest, iter_itertools_repeat, iter_functools_partial,
         iter_deque, iter_counter, iter_ordered_dict, iter_defaultdict, iter_chainmap, iter_nested_loops,
         iter_loop_over_modified_list, tensor_truth_single, tensor_truth_many, tensor_len, tensor_iter_rows,
         tensor_unbind, tensor_in_list, tensor_shape_math, tensor_size_compare, tensor_item, tensor_dtype_checks,
         tensor_device_checks, tensor_requires_grad_flag, tensor_comparisons_in_python, tensor_as_dict_key,
         tensor_repr_shape, number_arithmetic, float_formatting, bool_arithmetic, integer_bits,
         tuple_comparisons]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_iteration_behaves_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
