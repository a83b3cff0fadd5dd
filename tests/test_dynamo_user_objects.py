"""User objects of the kinds model libraries pass through compiled code, vs PyTorch's TorchDynamo.

transformers' `ModelOutput` (an OrderedDict subclass whose Python methods call dict's C methods),
its string enums, `hasattr(tensor, "jax")`, a `MutableMapping` registry and `inspect.signature` of
a method are all traced into one graph (fullgraph=True); a call to a C method the trace cannot
follow is a graph break with its reason (it once recursed until RecursionError).
"""
from __future__ import annotations

import collections
import enum
import inspect
from collections.abc import MutableMapping

from tests.test_dynamo import lib, Counter, compiled, same  # noqa: F401


class Output(collections.OrderedDict):
    """Like transformers' ModelOutput: items by key, or by position through `to_tuple`."""

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def test_dict_subclass_argument_read_by_its_python_methods(lib):
    def f(out):
        return out[0] * 2 + out["b"] + len(out)

    cf, cnt = compiled(lib, f, fullgraph=True)
    a, b = lib.randn(3), lib.randn(3)
    same(lib, cf(Output(a=a, b=b)), f(Output(a=a, b=b)))
    assert cnt.frame_count == 1
    swapped = Output(b=b, a=a)                        # other key order: the guard on the keys fails
    same(lib, cf(swapped), f(swapped))


class Bag(list):
    def total(self):
        return sum(self.copy())                       # list.copy: a method written in C


def test_c_method_of_a_user_object_runs(lib):
    def f(x, bag):
        return x * bag.total()

    cf, _ = compiled(lib, f)
    x = lib.randn(3)
    same(lib, cf(x, Bag([1, 2, 3])), f(x, Bag([1, 2, 3])))


class Mode(str, enum.Enum):
    ADD = "add"
    MUL = "mul"


def test_str_enum_members_are_constants(lib):
    def f(x, mode):
        if mode == Mode.ADD:
            return x + 1
        return x * 3

    cf, cnt = compiled(lib, f, fullgraph=True)
    x = lib.randn(3)
    same(lib, cf(x, Mode.ADD), f(x, Mode.ADD))
    same(lib, cf(x, Mode.MUL), f(x, Mode.MUL))
    assert cnt.frame_count == 2                       # one graph per member


def test_hasattr_of_a_missing_tensor_attribute_is_false(lib):
    def f(x):
        if hasattr(x, "jax"):
            return x - 1
        return x + 1

    cf, cnt = compiled(lib, f, fullgraph=True)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 1


class Registry(MutableMapping):
    """transformers' GeneralInterface: a class-wide mapping behind the Mapping protocol."""
    _global = {"double": 2.0}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


def test_in_and_get_of_a_mutable_mapping(lib):
    reg = Registry()

    def f(x):
        if "double" in reg:                          # Mapping.__contains__ (Python) reads reg["double"]
            return x * reg.get("double")
        return x

    cf, cnt = compiled(lib, f, fullgraph=True)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 1


class Block:
    def chunk(self, h):
        return h * 2

    def run(self, h):
        # transformers' apply_chunking_to_forward asks how many tensors the function takes
        if len(inspect.signature(self.chunk).parameters) == 1:
            return self.chunk(h)
        return h


def test_inspect_signature_of_a_method(lib):
    block = Block()

    def f(x):
        return block.run(x) + 1

    cf, cnt = compiled(lib, f, fullgraph=True)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 1


class Records(dict):
    """transformers' _CanRecordRegistry: a dict subclass whose `get` calls dict's through super()."""

    def get(self, key):
        return super().get(key) or 1.0


def test_super_get_of_a_dict_subclass(lib):
    records = Records(scale=3.0)

    def f(x):
        return x * records.get("scale") + records.get("missing")

    cf, cnt = compiled(lib, f, fullgraph=True)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 1


class Scaled(dict):
    """A dict subclass whose own item lookup differs from dict's: `values()` must not go through it."""

    def __getitem__(self, key):
        return dict.__getitem__(self, key) * 10

    def first(self):
        return list(self.values())[0]


def test_dict_subclass_entries_are_read_by_dicts_lookup(lib):
    def f(d):
        return d.first() + 1

    cf, cnt = compiled(lib, f, fullgraph=True)
    d = Scaled(a=lib.randn(3))
    same(lib, cf(d), f(d))
    assert cnt.frame_count == 1
