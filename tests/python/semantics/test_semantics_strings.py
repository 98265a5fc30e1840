"""Strings and bytes (the language reference's "String and Bytes literals" and the str methods)
as programs use them around tensor work: building names and keys, formatting, splitting and
joining, encoding, comparisons, membership, dict keys made of them, and choices of an op by a
string (activation names, reduction modes). Compared with eager on three calls."""
import pytest
import torch

from compare import matches_eager

ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "gelu": torch.nn.functional.gelu}


def name_built_for_lookup(a, b):
    kind = "re" + "lu"
    return ACTIVATIONS[kind](a), kind


def op_chosen_by_string(a, b):
    out = []
    for name in ("tanh", "gelu"):
        out.append(ACTIVATIONS[name](a))
    return out


def reduction_mode_string(a, b):
    mode = "mean"
    if mode == "sum":
        return a.sum()
    elif mode == "mean":
        return a.mean()
    return a


def keys_formatted(a, b):
    d = {f"layer{i}.weight": a * i for i in range(3)}
    return sorted(d), d["layer2.weight"]


def split_and_join(a, b):
    path = "encoder.layers.3.attn"
    parts = path.split(".")
    return parts, ".".join(parts[:2]), int(parts[2]) * a


def strip_and_case(a, b):
    s = "  Hello World  "
    return s.strip(), s.lower().strip(), s.title().strip(), s.upper().count("L"), b * 1


def startswith_endswith(a, b):
    names = ["conv1", "bn1", "conv2", "fc"]
    return [n for n in names if n.startswith("conv")], [n for n in names if n.endswith("1")], a


def replace_and_find(a, b):
    s = "a-b-c"
    return s.replace("-", "+"), s.find("b"), s.find("z"), s.rfind("-"), "-" in s, a + 1


def partition_and_rsplit(a, b):
    s = "key=value=more"
    return s.partition("="), s.rsplit("=", 1), s.split("=", 1), b


def string_multiplication_and_padding(a, b):
    return "ab" * 3, "7".zfill(3), "x".center(5, "*"), "y".ljust(3, "."), a * 1


def string_comparisons(a, b):
    return "apple" < "banana", "a" == "a", "A" < "a", sorted(["b", "A", "a"]), b * 1


def string_indexing(a, b):
    s = "tensor"
    return s[0], s[-1], s[1:4], s[::-1], len(s) * a


def string_iteration_and_ord(a, b):
    s = "abc"
    return [ord(c) for c in s], "".join(chr(ord(c) + 1) for c in s), a * ord("a")


def string_is_methods(a, b):
    return "123".isdigit(), "abc".isalpha(), "  ".isspace(), "Ab".isupper(), "x1".isalnum(), a + 0


def format_method_and_percent(a, b):
    n = a.numel()
    return "{}:{:.1f}".format(n, 2.25), "%s=%d" % ("n", n), "{name}!".format(name="x"), b * n


def fstring_expressions(a, b):
    n = a.numel()
    w = 6
    return f"{n:>{w}}|{n * 2!r}|{'yes' if n else 'no'}", f"{a.shape}", b


def fstring_debug(a, b):
    n = a.numel()
    return f"{n=}", f"{n + 1 = }", a


def bytes_and_encoding(a, b):
    s = "héllo"
    e = s.encode("utf-8")
    return e, len(e), e.decode("utf-8") == s, bytes([65, 66]), a * len(e)


def string_to_number(a, b):
    return int("42"), float("1e-3"), int("ff", 16), a * float("0.5")


def string_to_number_error(a, b):
    try:
        int("4.5")
    except ValueError as e:
        return "invalid literal" in str(e), b
    return None


def repr_and_str_of_values(a, b):
    return repr("x"), str(3.0), repr([1, "a"]), str(None), str(torch.float32), a * 1


def multiline_and_escapes(a, b):
    s = """line1
line2\ttab"""
    return s.splitlines(), s.count("\t"), "\\n" in r"a\nb", len("\n"), a


def dict_with_string_keys_order(a, b):
    d = {"b": b, "a": a}
    d["c"] = a + b
    return list(d), [k.upper() for k in d]


def string_in_container_checks(a, b):
    allowed = {"relu", "tanh"}
    return "relu" in allowed, "gelu" in allowed, [s for s in sorted(allowed)], a * len(allowed)


def str_methods_chain(a, b):
    return "  A,B , C ".replace(" ", "").lower().split(","), b * 1


def join_numbers(a, b):
    dims = a.view(2, 2).shape
    return "x".join(str(d) for d in dims), ",".join(map(str, [1, 2, 3])), a


def getattr_by_string(a, b):
    op = getattr(torch, "sig" + "moid")
    return op(a), getattr(a, "mean")()


def string_switch(a, b):
    results = []
    for mode in ("add", "mul", "sub", "other"):
        if mode == "add":
            results.append(a + b)
        elif mode == "mul":
            results.append(a * b)
        elif mode == "sub":
            results.append(a - b)
        else:
            results.append(mode)
    return results


def string_hash_stable_in_call(a, b):
    return hash("abc") == hash("a" + "bc"), a * 1


def string_max_min(a, b):
    words = ["pear", "fig", "banana"]
    return max(words, key=len), min(words), sorted(words, key=lambda w: w[-1]), a * len(words)


CASES = [name_built_for_lookup, op_chosen_by_string, reduction_mode_string, keys_formatted, split_and_join,
         strip_and_case, startswith_endswith, replace_and_find, partition_and_rsplit,
         string_multiplication_and_padding, string_comparisons, string_indexing, string_iteration_and_ord,
         string_is_methods, format_method_and_percent, fstring_expressions, fstring_debug, bytes_and_encoding,
         string_to_number, string_to_number_error, repr_and_str_of_values, multiline_and_escapes,
         dict_with_string_keys_order, string_in_container_checks, str_methods_chain, join_numbers,
         getattr_by_string, string_switch, string_hash_stable_in_call, string_max_min]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_strings_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
