"""Containers and aliasing (the language reference's "Objects, values and types" and the
standard types): lists, dicts and sets passed in and mutated (the caller sees the change),
aliases of one list, shallow and deep copies, containers holding tensors and the tensors'
in-place changes seen through them, sorting with keys, dict ordering and views, nested
structures, and a tensor list turned into a tensor. Every function gets fresh containers each
call; results and the containers after the call are compared with eager on three calls."""
import copy

import pytest
import torch

from compare import same

import dynamo


def append_to_argument(xs, t):
    xs.append(t * 2)
    return len(xs)


def extend_and_pop(xs, t):
    xs.extend([t, t + 1])
    last = xs.pop()
    return last, len(xs)


def dict_argument_updated(d, t):
    d["new"] = t.sum()
    d.pop("old", None)
    return sorted(d)


def set_argument_updated(s, t):
    s.add(int(t.numel()))
    s.discard(-1)
    return sorted(s)


def alias_of_argument(xs, t):
    ys = xs
    ys.append(t)
    return xs is ys, len(xs)


def shallow_copy(xs, t):
    ys = list(xs)
    ys.append(t)
    zs = xs.copy()
    zs.clear()
    return len(xs), len(ys), len(zs)


def copy_module_copy(xs, t):
    ys = copy.copy(xs)
    ys.append(t)
    return len(xs), len(ys)


def deepcopy_of_tensors(xs, t):
    ys = copy.deepcopy([t, {"k": t}])
    ys[0].add_(1)
    return t, ys[0], ys[1]["k"]


def tensor_in_list_changed_in_place(xs, t):
    holder = [t]
    t.mul_(2)
    return holder[0] is t, holder[0]


def list_of_tensors_stacked(xs, t):
    parts = [t * i for i in range(3)]
    return torch.stack(parts), torch.cat(parts), len(parts)


def nested_structure(xs, t):
    tree = {"a": [t, (t + 1, {"b": t * 2})], "c": None}
    return tree["a"][1][1]["b"], tree


def list_multiplication_aliases(xs, t):
    rows = [[0]] * 3
    rows[0].append(1)
    return rows, t * 1


def sort_in_place_with_key(xs, t):
    ys = [t * 3, t, t * 2]
    ys.sort(key=lambda v: float(v.sum()))
    return ys


def sorted_stable(xs, t):
    pairs = [(1, "b"), (0, "a"), (1, "a")]
    return sorted(pairs, key=lambda p: p[0]), t + 0


def dict_order_and_views(xs, t):
    d = {}
    d["z"] = 1
    d["a"] = 2
    keys = d.keys()
    d["m"] = 3
    return list(keys), list(d.values()), list(d.items())[-1], t * 1


def dict_delete_while_iterating(xs, t):
    d = {"a": 1, "b": 2}
    try:
        for k in d:
            del d[k]
    except RuntimeError as e:
        return "changed size" in str(e), t
    return False, t


def list_remove_and_index(xs, t):
    ys = [3, 1, 3, 2]
    ys.remove(3)
    try:
        ys.index(9)
    except ValueError:
        missing = True
    return ys, ys.index(3), missing, t * len(ys)


def dict_fromkeys_shared(xs, t):
    d = dict.fromkeys(["a", "b"], [])
    d["a"].append(1)
    return d, t * 1


def frozenset_and_tuple_hash(xs, t):
    s = {frozenset({1, 2}), (1, 2)}
    return frozenset({2, 1}) in s, (1, 2) in s, len(s), t + 1


def list_slice_assignment(xs, t):
    ys = [0, 1, 2, 3, 4]
    ys[1:3] = ["a", "b", "c"]
    del ys[::2]
    return ys, t * 1


def list_comparison_and_contains(xs, t):
    return [1, 2] < [1, 3], [t] == [t], t in [t], [] == []


def tuple_of_tensors_returned(xs, t):
    return (t, t * 2), [t, t + 1]


def dict_of_tensors_updated_in_place(xs, t):
    d = {"w": t * 1}
    d["w"].add_(3)
    d["w"] += 1
    return d


def argument_list_replaced_not_mutated(xs, t):
    xs = xs + [t]  # a new list: the caller's is unchanged
    return len(xs)


def counter_in_argument_dict(d, t):
    d["calls"] = d.get("calls", 0) + 1
    return d["calls"], t * d["calls"]


CASES = [append_to_argument, extend_and_pop, dict_argument_updated, set_argument_updated, alias_of_argument,
         shallow_copy, copy_module_copy, deepcopy_of_tensors, tensor_in_list_changed_in_place,
         list_of_tensors_stacked, nested_structure, list_multiplication_aliases, sort_in_place_with_key,
         sorted_stable, dict_order_and_views, dict_delete_while_iterating, list_remove_and_index,
         dict_fromkeys_shared, frozenset_and_tuple_hash, list_slice_assignment, list_comparison_and_contains,
         tuple_of_tensors_returned, dict_of_tensors_updated_in_place, argument_list_replaced_not_mutated,
         counter_in_argument_dict]


def _container_for(fn):
    name = fn.__code__.co_varnames[0]
    return {"xs": lambda: [1, 2], "d": lambda: {"old": 1, "k": 2}, "s": lambda: {-1, 5}}[name]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_containers_behave_as_in_eager(fn):
    """Both sides get equal fresh containers and tensors each call; the result and what the
    call left in its arguments are compared."""
    opt = dynamo.optimize(fn)
    make = _container_for(fn)
    for call in range(3):
        t = torch.randn(4)
        c_e, c_d, t_e, t_d = make(), make(), t.clone(), t.clone()
        want, got = fn(c_e, t_e), opt(c_d, t_d)
        same(got, want, f"call {call + 1}")
        same(c_d, c_e, f"call {call + 1}: the container argument after the call")
        same(t_d, t_e, f"call {call + 1}: the tensor argument after the call")
