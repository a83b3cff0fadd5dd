"""Sharding rules for DTensor, shared by the op declarations that attach them (`op.def_sharding_rule`).

A DTensor is laid out over a device mesh by one placement per mesh dimension: `Shard(d)` (each rank
holds a piece of tensor dimension d, cut as torch.chunk cuts), `Replicate()` or `Partial(op)` (each
rank holds a full-shape term; the value is their reduction). The placement classes live here, in the
ops layer, because the rules speak them; `flambeau.distributed.tensor` exports them.

A rule decides one mesh dimension at a time: `rule(*args)` gets the op's arguments in schema order
with every DTensor replaced by an `ArgSpec` (its global shape and its placement on that mesh
dimension) and returns a `Decision`: the placement each DTensor argument must have (the interpreter
redistributes the ones that differ), the placement of the outputs, and optionally `local`, a
function computing the local result when calling the op on the local shards is not it:
`local(op, *local_args, ctx=ctx)`, where `ctx` (a `LocalContext`) gives the local output shapes,
this rank's index on the rule's mesh dimension and a sum over it. Rules
never communicate; they choose the layouts, the interpreter (`flambeau.distributed.tensor._dispatch`)
moves data. Ops tagged `pointwise` share `pointwise_rule` without declaring it (as they share a
batching rule); an op with neither runs by the interpreter's fallback: every input replicated.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

__all__ = ["Placement", "Shard", "Replicate", "Partial", "ArgSpec", "Decision", "LocalContext"]

REDUCE_OPS = ("sum", "avg", "max", "min", "product")


class Placement:
    """Base of the placement types; `is_shard(dim)`, `is_replicate()`, `is_partial()` ask which one."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


class Shard(Placement):
    """Pieces of tensor dimension `dim`, one per rank of the mesh dimension (torch.chunk's cut)."""
    __slots__ = ("dim",)

    def __init__(self, dim: int) -> None:
        if not isinstance(dim, int):
            raise TypeError(f"Shard: dim must be an int, got {type(dim).__name__}")
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    @staticmethod
    def local_range(size: int, num_chunks: int, index: int) -> tuple:
        """(start, length) of piece `index` when `size` elements are cut in `num_chunks` as torch.chunk."""
        chunk = -(-size // num_chunks) if num_chunks else 0
        start = min(index * chunk, size)
        return start, min(start + chunk, size) - start

    def __eq__(self, other) -> bool:
        return type(other) is Shard and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


class Replicate(Placement):
    """The whole tensor on every rank of the mesh dimension."""

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return type(other) is Replicate

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


class Partial(Placement):
    """Full-shape tensors whose reduction (`reduce_op`) over the mesh dimension is the value."""
    __slots__ = ("reduce_op",)

    def __init__(self, reduce_op: str = "sum") -> None:
        if reduce_op not in REDUCE_OPS:
            raise ValueError(f"Partial: reduce_op must be one of {REDUCE_OPS}, got {reduce_op!r}")
        self.reduce_op = reduce_op

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other) -> bool:
        return type(other) is Partial and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self.reduce_op))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


R = Replicate()
P_SUM = Partial("sum")


class ArgSpec:
    """A DTensor argument as a rule sees it: global shape and its placement on one mesh dimension."""
    __slots__ = ("shape", "placement", "mesh_size")

    def __init__(self, shape: tuple, placement: Placement, mesh_size: int) -> None:
        self.shape, self.placement, self.mesh_size = tuple(shape), placement, mesh_size

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def shard_dim(self) -> int | None:
        """The tensor dimension this argument is sharded on (normalized), or None."""
        p = self.placement
        return p.dim % max(self.ndim, 1) if type(p) is Shard else None

    def __repr__(self) -> str:
        return f"ArgSpec({self.shape}, {self.placement})"


class Decision(NamedTuple):
    """What a rule decides on one mesh dimension: `inputs` (one placement per DTensor argument, in
    schema order, lists flattened), `output` (one placement for every output, or a tuple with one per
    output) and `local` (None, or `local(op, local_args)` computing the local result)."""
    inputs: list
    output: object
    local: Callable | None = None


class LocalContext(NamedTuple):
    """What a rule's `local` function may use: `out_shapes` (local shape of each output), `rank` (this
    rank's index on the rule's mesh dimension) and `all_reduce(t)` (sum over that dimension, in place)."""
    out_shapes: list
    rank: int
    all_reduce: Callable


def specs_of(values) -> list:
    """The ArgSpecs among schema-ordered `values` (in lists too), in order."""
    out = []
    for v in values:
        if type(v) is ArgSpec:
            out.append(v)
        elif type(v) in (list, tuple):
            out.extend(x for x in v if type(x) is ArgSpec)
    return out


def replicate_all(*values) -> Decision:
    """Every input replicated, every output replicated: always correct (the fallback's layout)."""
    return Decision([R] * len(specs_of(values)), R)


def _wrap(d: int, ndim: int) -> int:
    return d % ndim if ndim else 0


# ---- pointwise ---------------------------------------------------------------------------------------
def _pointwise(values, partial_kind: str | None) -> Decision:
    specs = specs_of(values)
    out_ndim = max(s.ndim for s in specs)
    out_shape = [1] * out_ndim
    for s in specs:
        for i, n in enumerate(s.shape):
            j = i + out_ndim - s.ndim
            out_shape[j] = max(out_shape[j], n)
    target = None
    for s in specs:
        d = s.shard_dim()
        if d is not None and s.shape[d] == out_shape[d + out_ndim - s.ndim]:
            target = d + out_ndim - s.ndim
            break
    if target is not None:
        inputs = []
        for s in specs:
            d = target - (out_ndim - s.ndim)
            inputs.append(Shard(d) if d >= 0 and s.shape[d] == out_shape[target] else R)
        return Decision(inputs, Shard(target))
    partial = next((s.placement for s in specs if type(s.placement) is Partial), None)
    if partial is not None and partial.reduce_op == "sum" and _partial_ok(values, specs, partial_kind):
        if partial_kind == "sum_all":
            return Decision([partial] * len(specs), partial)
        return Decision([s.placement for s in specs], partial)
    return Decision([R] * len(specs), R)


def _partial_ok(values, specs, kind) -> bool:
    """Whether the op is linear in its Partial arguments as they stand (no layout change needed)."""
    n_partial = sum(type(s.placement) is Partial for s in specs)
    if kind == "unary":
        return True
    if kind == "sum_all":          # add/sub: tensors only (a number added once per rank would count n times)
        return all(type(v) is ArgSpec for v in values[:2])
    if kind == "one_factor":       # mul: one Partial factor, the others replicated
        return n_partial == 1
    if kind == "numerator":        # div: a Partial numerator over a replicated divisor
        return n_partial == 1 and type(values[0]) is ArgSpec and type(values[0].placement) is Partial
    return False


def pointwise_rule(*values) -> Decision:
    """Elementwise over broadcast arguments: one sharded output dimension shared by every input that
    has it at full size (broadcast inputs replicated); Partial inputs replicated first."""
    return _pointwise(values, None)


def linear_pointwise_rule(kind: str):
    """A pointwise rule that keeps Partial values where the op is linear in them: "sum_all" (add, sub:
    every operand Partial), "one_factor" (mul), "numerator" (div), "unary" (neg)."""
    def linear_pointwise(*values) -> Decision:
        return _pointwise(values, kind)
    linear_pointwise.__name__ = f"linear_pointwise_{kind}"
    return linear_pointwise


def like_rule(*values) -> Decision:
    """Same layout as the (first) input: clone, dtype casts, detach; Partial stays Partial."""
    specs = specs_of(values)
    return Decision([s.placement for s in specs], specs[0].placement)


# ---- reductions ---------------------------------------------------------------------------------------
def _reduced_dims(dim, ndim: int) -> list:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({_wrap(d, ndim) for d in dims})


def reduction_rule(partial_op: str | None, linear: bool = False, mean: bool = False):
    """`op(self, dim, keepdim, ...)`: a shard on a kept dimension stays (renumbered); a shard on a
    reduced one leaves `Partial(partial_op)` (a mean becomes a local sum over the global count, so
    uneven shards average right); a linear reduction keeps a Partial(sum) input Partial."""
    def reduction(self, dim=None, keepdim=False, *rest) -> Decision:
        dims = _reduced_dims(dim, self.ndim)
        d = self.shard_dim()
        p = self.placement
        if d is not None:
            if d not in dims:
                return Decision([p], Shard(d if keepdim else d - sum(x < d for x in dims)))
            if partial_op is None:
                return Decision([R], R)
            if mean:
                count = math.prod(self.shape[x] for x in dims)
                return Decision([p], P_SUM, _mean_as_partial_sum(count))
            return Decision([p], Partial(partial_op))
        if type(p) is Partial and linear and p.reduce_op == "sum":
            return Decision([p], p)
        return Decision([R], R)
    reduction.__name__ = f"reduction_{partial_op}"
    return reduction


def _mean_as_partial_sum(count: int):
    def local_mean_term(op, self, dim=None, keepdim=False, dtype=None, *, ctx):
        s = self.sum(dim if dim is not None else list(range(self.ndim)), keepdim, dtype=dtype)
        return s / count
    return local_mean_term


# ---- contractions (einsum strategies) ---------------------------------------------------------------
_COST_SHARD_TO_REPLICATE = 1.0
_COST_PARTIAL_TO_REPLICATE = 2.0
_COST_RESHARD = 1.0


def _cost(spec: ArgSpec, want: Placement) -> float:
    cur = spec.placement
    if cur == want or type(cur) is Replicate:
        return 0.0                       # replicated -> anything is a local cut (or a zero fill)
    n = float(math.prod(spec.shape))
    if type(want) is Replicate:
        return n * (_COST_PARTIAL_TO_REPLICATE if type(cur) is Partial else _COST_SHARD_TO_REPLICATE)
    return n * _COST_RESHARD


def _einsum_decision(specs: list, labels: list, out: str, additive: list = ()) -> Decision:
    """Cheapest strategy for operands labelled like einsum ("mk", "kn" -> "mn"); `additive` operands
    (a bias) are laid out like the output (their labels are the output's trailing ones)."""
    n = len(specs)
    strategies = [([R] * n, R)]
    for letter in sorted(set("".join(labels))):
        if any(s.shape[lab.index(letter)] == 1 for s, lab in zip(specs, labels) if letter in lab):
            continue                    # a broadcast (size-1) dimension is not cut
        ins = [Shard(lab.index(letter)) if letter in lab else R for lab in labels]
        strategies.append((ins, Shard(out.index(letter)) if letter in out else P_SUM))
    for i in range(n):
        ins = [R] * n
        ins[i] = P_SUM
        strategies.append((ins, P_SUM))
    best, best_cost = None, None
    for ins, o in strategies:
        full = ins + [_additive_placement(a, o, len(out)) for a in additive]
        cost = sum(_cost(s, w) for s, w in zip(specs + list(additive), full))
        if best_cost is None or cost < best_cost:
            best, best_cost = (full, o), cost
    return Decision(best[0], best[1])


def _additive_placement(spec: ArgSpec, out: Placement, out_ndim: int) -> Placement:
    if type(out) is Partial:
        return out
    if type(out) is Shard:
        d = out.dim - (out_ndim - spec.ndim)
        if d >= 0 and spec.shape[d] != 1:
            return Shard(d)
    return R


_LETTERS = "abcdefghijlopqrstuvwxyz"      # batch dimensions; m, n, k name the matrix ones


def _batch_labels(a_shape, b_shape, nbatch: int):
    """Labels of broadcast batch dimensions (a size-1 side gets a label of its own: not shardable)."""
    la, lb = [], []
    pa, pb = len(a_shape) - nbatch, len(b_shape) - nbatch
    extra = iter("ABCDEFGHIJ")
    for i in range(nbatch):
        letter = _LETTERS[i]
        sa = a_shape[pa + i] if pa + i >= 0 else None
        sb = b_shape[pb + i] if pb + i >= 0 else None
        if sa is not None:
            la.append(letter if sa != 1 or sb in (None, 1) else next(extra))
        if sb is not None:
            lb.append(letter if sb != 1 or sa in (None, 1) else next(extra))
    return "".join(la), "".join(lb)


def mm_rule(self, mat2) -> Decision:
    return _einsum_decision([self, mat2], ["mk", "kn"], "mn")


def bmm_rule(self, mat2) -> Decision:
    return _einsum_decision([self, mat2], ["bmk", "bkn"], "bmn")


def addmm_rule(self, mat1, mat2, beta=1, alpha=1) -> Decision:
    d = _einsum_decision([mat1, mat2], ["mk", "kn"], "mn", [self])
    return Decision([d.inputs[2], d.inputs[0], d.inputs[1]], d.output)


def baddbmm_rule(self, batch1, batch2, beta=1, alpha=1) -> Decision:
    d = _einsum_decision([batch1, batch2], ["bmk", "bkn"], "bmn", [self])
    return Decision([d.inputs[2], d.inputs[0], d.inputs[1]], d.output)


def linear_rule(input, weight, bias=None) -> Decision:
    """input [..., k] @ weight[n, k].T + bias[n]."""
    batch = _LETTERS[:input.ndim - 1]
    additive = [bias] if type(bias) is ArgSpec else []
    if weight.ndim == 1:
        return _einsum_decision([input, weight], [batch + "k", "k"], batch, additive)
    return _einsum_decision([input, weight], [batch + "k", "nk"], batch + "n", additive)


def matmul_rule(self, other) -> Decision:
    """torch.matmul's cases: 1-D operands lose their dimension; batch dimensions broadcast."""
    a1, b1 = self.ndim == 1, other.ndim == 1
    sa, sb = (() if a1 else self.shape[:-2]), (() if b1 else other.shape[:-2])
    nbatch = max(len(sa), len(sb))
    ba, bb = _batch_labels(sa, sb, nbatch)
    la = "k" if a1 else ba + "mk"
    lb = "k" if b1 else bb + "kn"
    out = _LETTERS[:nbatch] + ("" if a1 else "m") + ("" if b1 else "n")
    return _einsum_decision([self, other], [la, lb], out)


# ---- views ----------------------------------------------------------------------------------------------
def transpose_rule(self, dim0, dim1) -> Decision:
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement)
    a, b = _wrap(dim0, self.ndim), _wrap(dim1, self.ndim)
    return Decision([self.placement], Shard(b if d == a else a if d == b else d))


def permute_rule(self, dims) -> Decision:
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement)
    order = [_wrap(x, self.ndim) for x in dims]
    return Decision([self.placement], Shard(order.index(d)))


def unsqueeze_rule(self, dim) -> Decision:
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement)
    at = _wrap(dim, self.ndim + 1)
    return Decision([self.placement], Shard(d + (d >= at)))


def squeeze_rule(self, dim) -> Decision:
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement)
    dims = _reduced_dims(dim, self.ndim)
    gone = [x for x in dims if self.shape[x] == 1]
    if d in gone:
        return Decision([R], R)
    return Decision([self.placement], Shard(d - sum(x < d for x in gone)))


def _out_shape(in_shape, size) -> list:
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = math.prod(in_shape) // known if known else 0
    return size


def _localize_view(op, self, size, *, ctx):
    return self.reshape(ctx.out_shapes[0])


def _localize_expand(op, self, size, implicit=False, *, ctx):
    return op(self, ctx.out_shapes[0], implicit=implicit)


def view_rule(self, size) -> Decision:
    """A shard survives a view when its dimension starts an output dimension and the cut lines up:
    kept whole, merged with the dimensions after it (when it divides evenly), or split with its first
    output part dividing evenly (attention's [B, S, H] -> [B, S, heads, head_dim])."""
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement, _localize_view)
    out = _out_shape(self.shape, size)
    n = self.mesh_size
    prefix = math.prod(self.shape[:d])
    j, acc = 0, 1
    while j < len(out) and acc < prefix:
        acc *= out[j]
        j += 1
    while j < len(out) and out[j] == 1 and self.shape[d] != 1:
        j += 1
    if acc == prefix and j < len(out):
        s, t = self.shape[d], out[j]
        ok = s == t or (t > s and t % s == 0 and s % n == 0) or (t < s and s % t == 0 and t % n == 0)
        if ok:
            return Decision([self.placement], Shard(j), _localize_view)
    return Decision([R], R, _localize_view)


def expand_rule(self, size, implicit=False) -> Decision:
    d = self.shard_dim()
    if d is None:
        return Decision([self.placement], self.placement, _localize_expand)
    shift = len(size) - self.ndim
    if self.shape[d] == 1:
        return Decision([R], R, _localize_expand)
    return Decision([self.placement], Shard(d + shift), _localize_expand)


def split_rule(self, split_sizes, dim=0) -> Decision:
    d = self.shard_dim()
    if d is not None and d == _wrap(dim, self.ndim):
        return Decision([R], R)
    return Decision([self.placement], self.placement)


def slice_rule(self, dim=0, start=None, end=None, step=1) -> Decision:
    d = self.shard_dim()
    if d is not None and d == _wrap(dim, self.ndim):
        return Decision([R], R)
    return Decision([self.placement], self.placement)


def select_rule(self, dim, index) -> Decision:
    d = self.shard_dim()
    at = _wrap(dim, self.ndim)
    if d is None:
        return Decision([self.placement], self.placement)
    if d == at:
        return Decision([R], R)
    return Decision([self.placement], Shard(d - (d > at)))


def slice_scatter_rule(self, src, dim=0, start=None, end=None, step=1) -> Decision:
    """Sharded along another dimension than the scattered one, both pieces line up (same size there):
    scatter locally. (A slice's backward: `grad.new_zeros(shape).slice_scatter(grad, ...)`.)"""
    at = _wrap(dim, self.ndim)
    for spec in (src, self):
        d = spec.shard_dim()
        if d is not None and d != at:
            return Decision([Shard(d), Shard(d)], Shard(d))
    return Decision([R, R], R)


def select_scatter_rule(self, src, dim, index) -> Decision:
    """As slice_scatter; `src` lacks dimension `dim`, so its dimension k is self's k + (k >= dim)."""
    at = _wrap(dim, self.ndim)
    d_src, d_self = src.shard_dim(), self.shard_dim()
    d = d_src + (d_src >= at) if d_src is not None else d_self if d_self != at else None
    if d is None:
        return Decision([R, R], R)
    return Decision([Shard(d), Shard(d - (d > at))], Shard(d))


# ---- nn ops ----------------------------------------------------------------------------------------------
def softmax_rule(self, dim, *rest) -> Decision:
    """softmax / log_softmax: shards on other dimensions stay; the softmax dimension is gathered."""
    d = self.shard_dim()
    if d is not None and d != _wrap(dim, self.ndim):
        return Decision([self.placement], self.placement)
    return Decision([R], R)


def layer_norm_rule(input, normalized_shape, weight=None, bias=None, eps=1e-5) -> Decision:
    """native_layer_norm: a shard on a leading (not normalized) dimension stays on all three outputs;
    weight and bias replicated."""
    extra = len(specs_of([weight, bias]))
    d = input.shard_dim()
    if d is not None and d < input.ndim - len(normalized_shape):
        return Decision([input.placement] + [R] * extra, input.placement)
    return Decision([R] * (1 + extra), R)


def embedding_rule(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False) -> Decision:
    """A shard of the indices (or of the embedding columns) carries to the output; a row-sharded
    (vocabulary-parallel) table looks up its own rows, zeros for the others: a Partial sum."""
    di, dw = indices.shard_dim(), weight.shard_dim()
    if dw == 1 and indices.placement == R:
        return Decision([weight.placement, R], Shard(indices.ndim))
    if dw == 0 and indices.placement == R:
        return Decision([weight.placement, R], P_SUM, _vocab_parallel_lookup(weight))
    if di is not None:
        return Decision([R, indices.placement], Shard(di))
    return Decision([R, R], R)


def _vocab_parallel_lookup(weight: ArgSpec):
    rows, n = weight.shape[0], weight.mesh_size

    def masked_lookup(op, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False, *, ctx):
        start, length = Shard.local_range(rows, n, ctx.rank)
        outside = (idx < start) | (idx >= start + length)
        if not length:
            return w.new_zeros(tuple(idx.shape) + tuple(w.shape[1:]))
        out = op(w, (idx - start).masked_fill(outside, 0), -1, scale_grad_by_freq, sparse)
        return out.masked_fill(outside.unsqueeze(-1), 0)
    return masked_lookup


def cross_entropy_rule(self, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0) -> Decision:
    """Batch-sharded input and target: per-sample losses stay sharded; a sum is Partial; a mean is the
    local sum over the global number of counted targets (one all-reduce of that count)."""
    extra = len(specs_of([weight]))
    if self.shard_dim() == 0 and self.ndim > 1:
        ins = [self.placement, Shard(0)] + [R] * extra
        if reduction == 0:
            return Decision(ins, Shard(0))
        if reduction == 2 or weight is not None:       # mean weighted by weight: gather instead
            return Decision(ins, P_SUM) if reduction != 1 else Decision([R] * (2 + extra), R)
        return Decision(ins, P_SUM, _ce_mean_term)
    return Decision([R] * (2 + extra), R)


def _ce_mean_term(op, self, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0, *, ctx):
    total = op(self, target, weight, 2, ignore_index, label_smoothing)
    count = (target != ignore_index).sum().to(total.dtype)
    ctx.all_reduce(count)
    return total / count
