"""DTensor's op interpreter: what `DTensor.__torch_dispatch__` does with every operator call.

Below autograd (which records the call on the DTensors themselves, so gradients are DTensors), a call
with DTensor arguments:
  1. asks the op's sharding rule (`Op.sharding_rule`, declared with the op in `flambeau/_ops`; ops
     tagged `pointwise` share `_sharding.pointwise_rule`) once per mesh dimension, giving it each
     DTensor as an `ArgSpec` (global shape, placement on that dimension);
  2. redistributes the inputs whose placements differ from the rule's choice;
  3. runs the op on the local tensors (or the rule's `local` function), and
  4. wraps the local results as DTensors with the rule's output placements and the global shapes the
     op's meta function gives for the global inputs.
An op with no rule runs by the fallback: inputs replicated, op computed on whole tensors, outputs
replicated; each such call is logged (logger `flambeau.distributed.tensor`, level DEBUG) and counted
in `FALLBACK_COUNTS`. A 0-dim plain tensor beside DTensors counts as replicated, and so do plain integer
or bool tensors inside an index list (`x[idx]`, `x[:, mask]`, index_put's indices: every rank holds the
same indices; PyTorch raises there outside `implicit_replication()`); any other plain tensor is an
error, as in PyTorch.

A `_StridedShard(d)` argument (FSDP x TP's colwise pieces) is shown to the rule as `Shard(d)`: when the rule
keeps every such argument at `Shard(d)`, makes every output `Shard(d)` and needs no `local` function (the
elementwise ops: gradient accumulation, optimizer math), the op runs on the local pieces and the outputs keep
the strided placement; otherwise the rule is asked again with those arguments replicated (an all-gather).
"""
from __future__ import annotations

import collections
import logging

from ... import _state
from ..._backends import MetaArray
from ..._device import device as Device
from ..._dtype import BOOL, INTEGER
from ..._ops import _batching
from ..._ops._registry import OPS
from ..._ops._sharding import ArgSpec, Decision, LocalContext, Shard, pointwise_rule, replicate_all
from ..._tags import Tag
from ..._tensor import Tensor
from ..collectives import all_reduce
from ._redistribute import REPLICATE, normalize, redistribute_local
from ._utils import compute_local_shape_and_global_offset
from .placement_types import _StridedShard

log = logging.getLogger("flambeau.distributed.tensor")
FALLBACK_COUNTS: collections.Counter = collections.Counter()   # op name -> calls run by the fallback
_META = Device("meta")
INDEX_CATEGORIES = (BOOL, INTEGER)      # dtypes of the plain tensors an index list may hold


def rule_of(op):
    """The op's sharding rule: declared, or the shared pointwise one; None when it has neither."""
    if op.sharding_rule is not None:
        return op.sharding_rule
    if Tag.pointwise in op.tags:
        return pointwise_rule
    return None


def ops_with_rules() -> list:
    """Names of the operators DTensor runs by a sharding rule (the rest run by the fallback)."""
    return sorted(name for name, op in OPS.items() if rule_of(op) is not None)


def _map(values, fn):
    """`values` with every Tensor (also inside lists) replaced by fn(tensor)."""
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(fn(v))
        elif type(v) in (list, tuple) and any(isinstance(x, Tensor) for x in v):
            out.append(type(v)(fn(x) if isinstance(x, Tensor) else x for x in v))
        else:
            out.append(v)
    return out


def _flat(values) -> list:
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v)
        elif type(v) in (list, tuple):
            out.extend(x for x in v if isinstance(x, Tensor))
    return out


def _as_dtensors(op, values, dtensor_cls):
    """`values` with 0-dim plain tensors made replicated DTensors; the common mesh. The usual call (every
    tensor argument a DTensor of one mesh, none inside a list) passes `values` back as they are."""
    mesh = None
    for v in values:
        if type(v) is dtensor_cls:
            if mesh is None:
                mesh = v.device_mesh
            elif v.device_mesh is not mesh:
                break
        elif isinstance(v, Tensor) or type(v) in (list, tuple) and any(isinstance(x, Tensor) for x in v):
            break
    else:
        if mesh is not None:
            return values, mesh
    first = next(t for t in _flat(values) if isinstance(t, dtensor_cls))
    mesh = first.device_mesh

    def lift(t):
        if isinstance(t, dtensor_cls):
            if t.device_mesh != mesh:
                raise NotImplementedError(f"{op}: DTensor arguments on different meshes ({mesh} and "
                                          f"{t.device_mesh}) are not supported")
            return t
        if t.dim() == 0:
            return dtensor_cls._make(t, mesh, (REPLICATE,) * mesh.ndim, (), requires_grad=False)
        raise RuntimeError(f"{op}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                           "DTensor before calling distributed operators!")
    return _map(_replicated_index_lists(values, mesh, dtensor_cls), lift), mesh


def _replicated_index_lists(values, mesh, dtensor_cls) -> list:
    """`values` with the plain integer/bool tensors inside lists (index lists) made replicated DTensors."""
    def index(t):
        if isinstance(t, Tensor) and not isinstance(t, dtensor_cls) and t.dtype.category in INDEX_CATEGORIES:
            return dtensor_cls._make(t, mesh, (REPLICATE,) * mesh.ndim, tuple(t.shape), requires_grad=False)
        return t
    return [type(v)(index(x) for x in v) if type(v) in (list, tuple) else v for v in values]


def _global_outputs(op, values):
    """The op's outputs computed on meta tensors of the global shapes (metadata only)."""
    def meta(t):
        return Tensor._make(MetaArray(tuple(t.shape), t.dtype.np), _META, t.dtype)
    return _batching.call(op, _map(values, meta))


class _Plan:
    """What a call's sharding rule and meta function decided, a function of the op, the mesh, the DTensors'
    global shapes, dtypes and placements and the other arguments' values only: kept per such signature
    (`_PLANS`), as PyTorch's sharding propagator caches its decisions per op schema."""
    __slots__ = ("mesh", "decisions", "want", "moves", "global_out", "outs", "out_placements")

    def __init__(self, op, values, mesh, dts) -> None:
        rule = rule_of(op)
        if rule is None or op.meta is None:
            rule = replicate_all
        decisions = []
        for i in range(mesh.ndim):
            def spec(t, i=i, strided_as=Shard):
                p = normalize(t.placements, t.ndim)[i]
                if isinstance(p, _StridedShard):
                    p = Shard(p.dim) if strided_as is Shard else REPLICATE
                return ArgSpec(tuple(t.shape), p, mesh.size(i))
            decision = rule(*_map(values, spec))
            strided = {t.placements[i] for t in dts if isinstance(t.placements[i], _StridedShard)}
            if strided:
                decision = _strided(decision, dts, i, strided) or rule(*_map(values, lambda t: spec(t, strided_as=None)))
            decisions.append(decision)
        self.mesh, self.decisions = mesh, decisions
        self.want = [tuple(d.inputs[k] for d in decisions) for k in range(len(dts))]
        self.moves = [normalize(t.placements, t.ndim) != normalize(w, t.ndim) for t, w in zip(dts, self.want)]
        self.global_out = _global_outputs(op, values)
        self.outs = self.global_out if type(self.global_out) in (list, tuple) else [self.global_out]
        self.out_placements = [tuple(d.output[k] if type(d.output) is tuple else d.output for d in decisions)
                               for k in range(len(self.outs))]


_PLANS: dict = {}
PLAN_CACHE_LIMIT = 4096          # signatures kept (the oldest dropped first): scalars in the key vary


def _signature(op, mesh, values):
    """The key of a call's plan, or None when an argument cannot be part of one (an unhashable value)."""
    key = [op, id(mesh)]
    for v in values:       # a value with its type: 1, 1.0 and True are equal keys but give other dtypes
        if isinstance(v, Tensor):
            key.append((tuple(v.shape), v.placements, v.dtype))
        elif type(v) in (list, tuple):
            key.append(tuple((tuple(x.shape), x.placements, x.dtype) if isinstance(x, Tensor) else (type(x), x)
                             for x in v))
        else:
            key.append((type(v), v))
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _plan(op, values, mesh, dts) -> _Plan:
    key = _signature(op, mesh, values)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None or plan.mesh is not mesh:
        plan = _Plan(op, values, mesh, dts)
        if key is not None:
            if len(_PLANS) >= PLAN_CACHE_LIMIT:
                _PLANS.pop(next(iter(_PLANS)))
            _PLANS[key] = plan
    return plan


def dispatch(op, args: tuple, kwargs: dict, dtensor_cls):
    values, mesh = _as_dtensors(op, list(op.bind(*args, **kwargs)), dtensor_cls)
    dts = _flat(values)
    if rule_of(op) is None or op.meta is None:
        log.debug("DTensor: %s has no sharding rule; its inputs are replicated (fallback)", op)
        FALLBACK_COUNTS[op.name] += 1
    plan = _plan(op, values, mesh, dts)
    decisions, global_out, outs, out_placements = plan.decisions, plan.global_out, plan.outs, plan.out_placements
    locals_ = {}
    for t, w, move in zip(dts, plan.want, plan.moves):
        locals_[id(t)] = redistribute_local(t._local_tensor, mesh, t.placements, w, tuple(t.shape)) if move \
            else t._local_tensor
    local_values = _map(values, lambda t: locals_[id(t)])
    local_out = _run_local(op, local_values, decisions, mesh, outs, out_placements)
    locals_out = local_out if type(local_out) in (list, tuple) else [local_out]
    wrapped = []
    for g, loc, pl in zip(outs, locals_out, out_placements):
        if isinstance(g, Tensor) and isinstance(loc, Tensor):
            wrapped.append(dtensor_cls._make(loc, mesh, pl, tuple(g.shape), requires_grad=False))
        else:
            wrapped.append(loc)
    if type(global_out) in (list, tuple):
        return type(local_out)(wrapped) if type(local_out) in (list, tuple) else wrapped
    return wrapped[0]


def _strided(decision: Decision, dts: list, i: int, strided: set) -> Decision | None:
    """The rule's decision on mesh dimension `i` with the strided placement put back, when it keeps every
    strided argument's Shard(d) and shards every output the same way with no `local` function; else None."""
    (placement,) = strided if len(strided) == 1 else (None,)
    if placement is None or decision.local is not None:
        return None
    as_shard = Shard(placement.dim)
    outputs = decision.output if type(decision.output) is tuple else (decision.output,)
    if any(o != as_shard for o in outputs):
        return None
    inputs = []
    for t, p in zip(dts, decision.inputs):
        if isinstance(t.placements[i], _StridedShard):
            if p != as_shard:
                return None
            p = placement
        elif p == as_shard:
            return None                  # a plain Shard(d) argument would need the strided cut
        inputs.append(p)
    output = tuple(placement for _ in outputs) if type(decision.output) is tuple else placement
    return Decision(inputs, output)


def _run_local(op, local_values, decisions, mesh, outs, out_placements):
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = False          # below autograd: the DTensor call is what autograd records
    try:
        for i, d in enumerate(decisions):
            if d.local is not None:
                shapes = [compute_local_shape_and_global_offset(tuple(g.shape), mesh, pl)[0]
                          if isinstance(g, Tensor) else None for g, pl in zip(outs, out_placements)]
                group = mesh.get_group(i)
                ctx = LocalContext(shapes, mesh.get_local_rank(i), lambda t, g=group: all_reduce(t, group=g))
                return d.local(op, *local_values, ctx=ctx)
        return _batching.call(op, local_values)
    finally:
        _state.tls.grad_enabled = prev
