"""Every fact about an operator is declared with it (`flambeau._ops._registry`): tags, the reason
it has no decomposition, its decomposition and lowering (attached by the op object). These tests
check the declarations agree with each other and with what the layers above do with them.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

import flambeau
from flambeau import Tag
from flambeau._ops import OPS, defop
from flambeau._ops._registry import Op
from flambeau._decomp import core_ops, is_core, register_decomposition
from flambeau._decomp._table import _ALIASES, aten
from flambeau._inductor import graph as _graph  # noqa: F401  (attaches the lowerings)
from flambeau._inductor.lowering import register_lowering

PACKAGE = pathlib.Path(flambeau.__file__).parent


@pytest.mark.parametrize("name", sorted(op.name for op in core_ops()))
def test_core_op_is_lowered_or_extern(name):
    op = OPS[name]
    assert op.lowering is not None or Tag.extern in op.tags, \
        f"{name} is tagged core but has neither a lowering (register_lowering) nor Tag.extern"


def test_core_set_size_and_halves():
    core = core_ops()
    assert len(core) == 187      # 172 + view_as_real, view_as_complex, complex (externs: complex numbers as
    #                              pairs of reals, which the code generators do not take) + the int8 linear layer (onednn::qlinear_prepack, qlinear_pointwise(.tensor,
    #                              .binary, .binary_tensor))
    #                              + the int8 convolution (onednn::qconv_prepack, qconv2d_pointwise(.tensor,
    #                              .binary, .binary_tensor)) + _max_pool_backward (max pooling's gradient, an
    #                              extern: one Triton gather on cuda) + _avg_pool2d_int8 (int8 average pooling)
    assert len([op for op in core if Tag.extern in op.tags and op.lowering is None]) == \
        len([op for op in core if op.lowering is None])
    assert all(is_core(op) for op in core)


def test_pointwise_ops_are_core():
    assert all(is_core(op) for op in OPS.values() if Tag.pointwise in op.tags)


def test_eager_fallback_declarations():
    """`Op.eager_fallback` (what compile tests accept running eagerly) is declared with a reason,
    never on an extern op (a library call by design, not a fallback), and only where a compiled
    graph can fall back: the op has no lowering, or a lowering that raises `Unsupported` for some
    inputs (index_put)."""
    declared = {op.name: op for op in OPS.values() if op.eager_fallback is not None}
    assert {"einsum", "index_put", "index_select", "index_add"} <= set(declared)
    for name, op in declared.items():
        assert isinstance(op.eager_fallback, str) and op.eager_fallback, name
        assert Tag.extern not in op.tags, f"{name} is extern: it never falls back"
    lowered = {n for n, op in declared.items() if op.lowering is not None}
    assert lowered == {"index_put"}, f"declared eager fallback but lowered (stale?): {sorted(lowered - {'index_put'})}"


# ---- names: no table names something that is not an op -------------------------------------------
_OVERLOADS = sorted({k.split(".", 1)[1] for k in OPS if "." in k} | {"default"})
_OP_NAME = re.compile(r"^[a-z_][a-z_0-9]*\.(%s)$" % "|".join(map(re.escape, _OVERLOADS)))
_NOT_OP_NAMES = {"torch.Tensor"}        # flambeau/_tensor.py: the type name Tensor.type() returns


def test_every_op_name_string_in_the_package_is_an_op():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _OP_NAME.match(node.value) \
                    and node.value not in OPS and node.value not in _NOT_OP_NAMES:
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not bad, "strings naming no operator:\n" + "\n".join(bad)


def test_short_aliases_name_ops():
    assert all(full in OPS for full in _ALIASES.values())
    assert aten.sum is OPS["sum.dim_IntList"] and aten.max.dim is OPS["max.dim"] and aten.rsub.Tensor is OPS["rsub.Tensor"]
    with pytest.raises(AttributeError):
        aten.no_such_op


def test_registration_takes_op_objects():
    with pytest.raises(TypeError, match="Op objects"):
        register_decomposition("gelu")
    with pytest.raises(TypeError, match="Op objects"):
        register_lowering("add.Tensor")
    with pytest.raises(RuntimeError, match="already has a lowering"):
        register_lowering(aten.add)(lambda g, a, b, alpha=1: None)


# ---- tags ----------------------------------------------------------------------------------------
def test_schema_decides_view_and_inplace():
    for op in OPS.values():
        assert op.is_view == op._schema.is_view == (Tag.view in op.tags)
        assert op.is_inplace == op._schema.is_inplace == (Tag.inplace in op.tags)
        assert op.nondeterministic == (Tag.nondeterministic_seeded in op.tags)
    assert OPS["view"].is_view and OPS["add_.Tensor"].is_inplace and not OPS["add.Tensor"].is_inplace


def test_tags_must_be_tag_members():
    with pytest.raises(TypeError, match="flambeau.Tag"):
        Op("_t_decl_a(Tensor self) -> Tensor", tags=("core",))
    with pytest.raises(ValueError, match="schema"):
        Op("_t_decl_b(Tensor self) -> Tensor", tags=(Tag.view,))


def test_random_ops_are_seeded_and_never_recomputable():
    for name in ("rand", "randn", "randint.low", "normal.float_float", "bernoulli.p", "bernoulli_.p",
                 "poisson", "multinomial", "randperm", "native_dropout", "_sdpa_math"):
        assert OPS[name].nondeterministic, name
    assert not any(Tag.recomputable in op.tags for op in OPS.values() if op.nondeterministic)


def test_one_autocast_policy_per_device():
    cuda = [t for t in Tag if t.name.startswith("autocast_")]
    cpu = [t for t in Tag if t.name.startswith("cpu_autocast_")]
    for op in OPS.values():
        assert len(op.tags.intersection(cuda)) <= 1 and len(op.tags.intersection(cpu)) <= 1, op.name


def test_rule_slots():
    op = defop("_t_decl_rules(Tensor self) -> Tensor", function=False)(lambda xp, self: self)
    try:
        assert op.batching_rule is None and op.sharding_rule is None

        @op.def_batching_rule
        def _t_decl_rules_batch(self, in_dims):
            return self, in_dims

        @op.def_sharding_rule
        def _t_decl_rules_shard(self):
            return self
        assert op.batching_rule is _t_decl_rules_batch and op.sharding_rule is _t_decl_rules_shard
    finally:
        del OPS["_t_decl_rules"]


# ---- pointwise formulas: declared once, with the op ----------------------------------------------
_PRINTERS = ("_inductor/ir.py", "_inductor/codegen_cpp.py", "_inductor/codegen_numpy.py")
# the loop IR's former names for arithmetic it now takes from ops (`ops.div` is aten.div, ...)
_OLD_PRIMITIVES = {"truediv", "floordiv", "truncdiv", "lshift", "rshift", "to_dtype", "isnan"}


def test_code_generators_hold_no_formula():
    """Every formula is the op's (`op.pointwise`): no printer names a spelled op in a string (an
    op-name -> C++/NumPy table) or calls `ops.<spelled op>`."""
    spelled = {op.__name__ for op in OPS.values() if op.pointwise is not None}
    assert {"exp", "erf", "add", "mul", "div", "eq", "where", "pow", "maximum", "bitwise_left_shift",
            "logical_and", "signbit", "_to_copy", "floor_divide", "div_trunc"} <= spelled
    for rel in _PRINTERS:
        tree = ast.parse((PACKAGE / rel).read_text())
        calls = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in spelled
                 and isinstance(n.value, ast.Name) and n.value.id == "ops"}
        assert not calls, f"{rel} calls ops.<spelled op>: {sorted(calls)}"
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & (spelled | _OLD_PRIMITIVES), f"{rel} names ops: {sorted(strings & (spelled | _OLD_PRIMITIVES))}"


def test_spelled_ops_have_every_spelling_and_a_lowering():
    """A spelled op is lowered (by `spelled` unless it has a rule of its own) and spelled for
    every code generator; every pointwise-tagged op with a C++ spelling has a Triton one."""
    from flambeau._inductor.lowering import spelled as spelled_rule
    from flambeau._ops._spelling import BACKENDS
    spelled = [op for op in OPS.values() if op.pointwise is not None]
    assert len(spelled) >= 60
    for op in spelled:
        assert op.lowering is not None, op.name
        for backend in BACKENDS:
            assert getattr(op.pointwise, backend), (op.name, backend)
    assert aten.exp.lowering is spelled_rule and aten.mul.lowering is spelled_rule and aten.eq.lowering is spelled_rule
    missing = [op.name for op in OPS.values() if Tag.pointwise in op.tags and op.pointwise is not None
               and op.pointwise.cpp and not op.pointwise.triton]
    assert not missing, f"pointwise ops with a C++ spelling and no Triton one: {missing}"


def test_view_inverses_are_keyed_by_view_ops():
    from flambeau._functorch.functionalization import _VIEW_INVERSES
    assert len(_VIEW_INVERSES) >= 12 and all(isinstance(op, Op) and op.is_view for op in _VIEW_INVERSES)


def test_op_overload_packet_spelling_without_getattr():
    """`aten.max.dim` and `aten.add.Tensor` resolve through plain attributes set at registration:
    `Op` defines no `__getattr__`, which would slow every attribute read on the dispatch path."""
    from flambeau._decomp._table import aten
    from flambeau._ops import OPS
    from flambeau._ops._registry import Op
    assert "__getattr__" not in vars(Op)
    assert aten.max.dim is OPS["max.dim"]
    assert aten.round.decimals is OPS["round.decimals"]
    assert aten.add.Tensor is OPS["add.Tensor"]
    for name, op in OPS.items():
        base, _, overload = name.partition(".")
        if overload and not overload.startswith("_") and not hasattr(Op, overload):
            for sibling in (o for n, o in OPS.items() if n.partition(".")[0] == base):
                assert getattr(sibling, overload) is op, (sibling, overload)
    with pytest.raises(AttributeError):
        aten.max.no_such_overload
