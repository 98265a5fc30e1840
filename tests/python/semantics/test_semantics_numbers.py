"""Numbers where Python and tensors meet (the language reference's "Arithmetic conversions" and
the numeric types): Python ints and floats as operands of tensor ops (type promotion as eager
does it), integer and true division, floor and modulo of negatives, powers, comparisons chained
over shapes, math-module functions of sizes, numbers read back from tensors (item, int, float,
bool, tolist), rounding, infinities and NaN, and Python arithmetic on those numbers. Compared
with eager on three calls."""
import math

import pytest
import torch

from compare import matches_eager


def int_operand(a, b):
    return a + 1, 2 * a, a - 3, 7 - a


def float_operand(a, b):
    return a * 0.5, 1.5 / (a.abs() + 1), a ** 2.0, 2.0 ** (a.clamp(-3, 3))


def bool_operand(a, b):
    return a * True, a + False


def int_tensor_with_float(a, b):
    n = torch.arange(4)
    return n * 0.5, n / 2, n // 2, (n + 1.5).dtype


def int_tensor_with_int(a, b):
    n = torch.arange(5)
    return n * 3, n // 2, n % 3, -n // 2, (-n) % 3


def true_division_of_ints(a, b):
    n = torch.arange(1, 5)
    return n / 3, torch.div(n, 3, rounding_mode="floor"), torch.div(n, 3, rounding_mode="trunc")


def python_floor_division(a, b):
    return 7 // 2, -7 // 2, 7 % -3, -7 % 3, divmod(-7, 2), a * (7 // 2)


def python_true_division(a, b):
    return 7 / 2, 1 / 3, a * (1 / 3)


def power_forms(a, b):
    return 2 ** 10, 2 ** -2, (-8) ** (1 / 3) if False else 4 ** 0.5, a.abs() ** 0.5


def comparisons_over_sizes(a, b):
    n = a.numel()
    return 0 < n <= 4, n == 4.0, n != 4, a * (n >= 4)


def math_of_sizes(a, b):
    n = a.numel()
    return math.sqrt(n), math.log2(n), math.ceil(n / 3), math.floor(n / 3), a / math.sqrt(n)


def math_constants(a, b):
    return a * math.pi, b + math.e, math.inf > 1e308, math.isnan(math.nan)


def numbers_from_tensors(a, b):
    s = a.sum()
    return float(s), s.item(), int(a.numel()), bool(s == s), a.tolist()


def int_of_float_tensor(a, b):
    t = torch.tensor([2.7, -2.7])
    return int(t[0]), int(t[1]), round(float(t[0])), [int(v) for v in t]


def item_arithmetic(a, b):
    m = a.max().item()
    return m * 2, m > -100, a - m


def rounding_modes(a, b):
    x = torch.tensor([0.5, 1.5, 2.5, -0.5])
    return torch.round(x), [round(v) for v in (0.5, 1.5, 2.5, -0.5)], torch.floor(x), torch.ceil(x)


def infinities_and_nan(a, b):
    t = torch.tensor([1.0, float("inf"), float("-inf"), float("nan")])
    return t * 0, torch.isfinite(t), torch.nan_to_num(t), float("inf") * 0 != float("inf") * 0


def nan_comparisons(a, b):
    n = float("nan")
    return n == n, n != n, math.isnan(n), a * (n != n)


def integer_overflow_in_tensors(a, b):
    t = torch.tensor([2 ** 62], dtype=torch.int64)
    return t * 2, t + t


def large_python_ints(a, b):
    return 2 ** 100 // 3, (2 ** 64) % 1000, a * (2 ** 3)


def dtype_promotion(a, b):
    i = torch.ones(4, dtype=torch.int32)
    h = torch.ones(4, dtype=torch.float16)
    return (i + a).dtype, (h + 1).dtype, (h + a).dtype, (i * 2.5).dtype, (i + True).dtype


def bool_tensor_arithmetic(a, b):
    m = a > 0
    return m.sum(), m.float().mean(), m & (b > 0), ~m, m.int() * 3


def scalar_tensor_as_number(a, b):
    s = torch.tensor(3.0)
    return a * s, s + 1, float(s) * 2, s.item() ** 2


def zero_dim_and_one_element(a, b):
    s = a[0]
    return s.dim(), s.shape, s * 2, a[:1] * 2


def float32_vs_python_float(a, b):
    x = torch.tensor(0.1, dtype=torch.float32)
    return float(x) == 0.1, x.double().item(), x * 3


def increments_of_numbers(a, b):
    n = 0
    for _ in range(5):
        n += 1.5
    return n, a * n


def abs_min_max_of_numbers(a, b):
    return abs(-2.5), min(3, 1.5), max(-1, -2), a.clamp(min(0.0, -1.0), max(0.5, 0.25))


def complex_numbers(a, b):
    z = complex(1, 2)
    return z * z, abs(3 + 4j), z.real, a * z.imag


def hex_and_format_of_numbers(a, b):
    return hex(255), oct(8), bin(5), format(3.14159, ".2f"), f"{1e6:,.0f}", a * 1


def numbers_to_tensors(a, b):
    return torch.tensor([1, 2]).dtype, torch.tensor([1.0, 2]).dtype, torch.tensor(True).dtype, \
        torch.tensor([1, 2.5]) * a[:2]


def full_and_arange_from_numbers(a, b):
    n = a.numel()
    return torch.full((n,), 2.5), torch.arange(0, n, 2), torch.linspace(0, 1, n), torch.zeros(n // 2, 3)


def sizes_as_tuples(a, b):
    m = a.view(2, 2)
    r, c = m.shape
    return m.new_ones(r * 2, c), torch.empty(0, c).shape, m.reshape(c, r)


def negative_zero(a, b):
    z = -0.0
    return z == 0.0, math.copysign(1, z), torch.tensor(-0.0).signbit(), a * z


CASES = [int_operand, float_operand, bool_operand, int_tensor_with_float, int_tensor_with_int,
         true_division_of_ints, python_floor_division, python_true_division, power_forms, comparisons_over_sizes,
         math_of_sizes, math_constants, numbers_from_tensors, int_of_float_tensor, item_arithmetic, rounding_modes,
         infinities_and_nan, nan_comparisons, integer_overflow_in_tensors, large_python_ints, dtype_promotion,
         bool_tensor_arithmetic, scalar_tensor_as_number, zero_dim_and_one_element, float32_vs_python_float,
         increments_of_numbers, abs_min_max_of_numbers, complex_numbers, hex_and_format_of_numbers,
         numbers_to_tensors, full_and_arange_from_numbers, sizes_as_tuples, negative_zero]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_numbers_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
