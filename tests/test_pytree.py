"""flambeau.utils._pytree against torch.utils._pytree: flatten, unflatten, map, key paths, JSON."""
import collections
import dataclasses

import pytest
import torch
import torch.utils._pytree as tp

import flambeau.utils._pytree as fp

Point = collections.namedtuple("Point", "x y")

TREES = [
    None, 3, [], (), {}, [1, (2, 3)], {"b": [1, (2, 3)], "a": None, "c": collections.OrderedDict(x=1, w=2)},
    Point(1, [2, 3]), collections.defaultdict(list, {"k": [1, 2], "j": 3}),
    collections.deque([1, [2]], maxlen=4), [[[]], {"z": ()}],
]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_flatten_unflatten_as_pytorch(tree):
    leaves, spec = fp.tree_flatten(tree)
    ref_leaves, ref_spec = tp.tree_flatten(tree)
    assert leaves == ref_leaves
    assert repr(spec) == repr(ref_spec)
    assert (spec.num_leaves, spec.num_nodes, spec.num_children) == \
        (ref_spec.num_leaves, ref_spec.num_nodes, ref_spec.num_children)
    rebuilt = fp.tree_unflatten(leaves, spec)
    assert rebuilt == tree and type(rebuilt) is type(tree)
    assert fp.tree_leaves(tree) == ref_leaves
    assert fp.tree_structure(tree) == spec


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_key_paths_as_pytorch(tree):
    pairs, _ = fp.tree_flatten_with_path(tree)
    ref_pairs, _ = tp.tree_flatten_with_path(tree)
    assert [fp.keystr(k) for k, _ in pairs] == [tp.keystr(k) for k, _ in ref_pairs]
    assert [v for _, v in pairs] == [v for _, v in ref_pairs]
    for path, leaf in pairs:
        assert fp.key_get(tree, path) is leaf


def test_treespec_json_as_pytorch():
    tree = {"b": [1, (2, 3)], "a": None, "c": collections.OrderedDict(x=1),
            "d": collections.defaultdict(list, {"k": 1})}
    text = fp.treespec_dumps(fp.tree_structure(tree))
    assert text == tp.treespec_dumps(tp.tree_structure(tree))
    assert fp.treespec_loads(text) == fp.tree_structure(tree)


def test_tree_map_with_several_trees():
    f = lambda a, b: (a, b)  # noqa: E731
    args = ({"a": 1, "b": [2, 3]}, {"b": [5, 6], "a": [7]})
    assert fp.tree_map(f, *args) == tp.tree_map(f, *args)
    assert fp.tree_map_only(int, lambda x: x * 10, [1, "s", (2.5, 3)]) == [10, "s", (2.5, 30)]
    assert fp.tree_all(lambda x: x > 0, [1, (2,)]) and not fp.tree_any(lambda x: x > 5, [1, (2,)])


@pytest.mark.parametrize("a, b, message", [
    ({"a": 1, "b": 2}, {"a": 1, "c": 2}, "Node keys mismatch; missing key(s): {'b'}; extra key(s): {'c'}."),
    ([1, 2], [1], "Node arity mismatch; expected 2, but got 1."),
    ([1, 2], (1, 2), "Node type mismatch; expected <class 'list'>, but got <class 'tuple'>."),
])
def test_structure_mismatch_errors_as_pytorch(a, b, message):
    for mod in (fp, tp):
        with pytest.raises(ValueError) as e:
            mod.tree_map(lambda x, y: x, a, b)
        assert str(e.value) == message


def test_unflatten_count_error():
    with pytest.raises(ValueError, match="`leaves` has length 2 but the spec refers to a pytree that holds 1"):
        fp.tree_unflatten([1, 2], fp.tree_structure([0]))
    with pytest.raises(TypeError, match="Expected `treespec` to be instance of TreeSpec"):
        fp.tree_unflatten([1], [0])


def test_registered_class_flattens_and_registration_is_once():
    class Box:
        def __init__(self, a, b):
            self.a, self.b = a, b

    fp.register_pytree_node(Box, lambda x: ([x.a, x.b], "ctx"), lambda v, c: Box(*v),
                            serialized_type_name="tests.Box")
    try:
        leaves, spec = fp.tree_flatten([Box(1, (2, 3))])
        assert leaves == [1, 2, 3] and spec.children_specs[0].context == "ctx"
        back = fp.tree_unflatten([4, 5, 6], spec)[0]
        assert (back.a, back.b) == (4, (5, 6))
        with pytest.raises(ValueError, match="already registered"):
            fp.register_pytree_node(Box, lambda x: ([], None), lambda v, c: Box(0, 0))
    finally:
        fp._deregister_pytree_node(Box)
    assert fp.tree_leaves(Box(1, 2))[0].a == 1


def test_dataclass_registration():
    @dataclasses.dataclass
    class Pair:
        left: int
        right: list

    fp.register_dataclass(Pair)
    try:
        pairs, spec = fp.tree_flatten_with_path(Pair(1, [2]))
        assert [fp.keystr(k) for k, _ in pairs] == [".left", ".right[0]"]
        assert fp.tree_unflatten([7, 8], spec) == Pair(7, [8])
    finally:
        fp._deregister_pytree_node(Pair)


def test_flambeau_tensors_are_leaves():
    import flambeau
    t = flambeau.ones(2)
    leaves, spec = fp.tree_flatten({"x": t, "y": (t, 1)})
    assert len(leaves) == 3 and leaves[0] is t
    doubled = fp.tree_map_only(flambeau.Tensor, lambda x: x * 2, {"x": t, "y": 1})
    assert doubled["x"].tolist() == [2.0, 2.0] and doubled["y"] == 1


def test_torch_path_resolves_under_compat():
    import flambeau.utils
    assert flambeau.utils._pytree is fp
    assert torch.utils._pytree is not fp
