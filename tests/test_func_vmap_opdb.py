"""vmap over the op database: every entry's samples batched (three examples stacked along a new
dimension 0) give, under `flambeau.func.vmap`, what a Python loop over the examples gives; and the
ops without a batching rule are counted and listed.

An op's batching rule (declared with it in `flambeau/_ops`) that puts the batch in the wrong
dimension, mixes examples or loses a dtype fails its entry here."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import flambeau as fl
from flambeau._functorch import batched
from flambeau._ops import OPS
from tests.opdb import all_opinfos, flat_tensors, materialize

BATCH = 3
MAX_SAMPLES = 4
INFOS = all_opinfos()

# entries whose samples vmap cannot express, each with its reason
SKIP = {
    "nonzero": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "masked_select": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "unique": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "unique_consecutive": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "bincount": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "repeat_interleave": "data-dependent output shape with tensor repeats",
    "argwhere": "data-dependent output shape (PyTorch's vmap has no rule either)",
    "where_cond": "where(cond) is nonzero: data-dependent output shape",
    "getitem_mask": "a boolean mask index is nonzero: data-dependent output shape",
    "one_hot": "num_classes=-1 reads the data (.item()); PyTorch's vmap raises too",
    "as_strided": "strides address the storage: PyTorch maps them per example, flambeau's fallback does not",
    "resize_": "resizes storage; PyTorch's vmap has no rule",
    "batch_norm_running_stats": "updates captured running statistics in place; PyTorch's vmap raises too",
    "instance_norm_running_stats": "updates captured running statistics in place; PyTorch's vmap raises too",
    "instance_norm": "its running-statistics sample writes captured tensors in place; PyTorch's vmap raises too",
    "gaussian_nll_loss": "checks `any(var < 0)` in Python: data-dependent control flow (PyTorch's raises too)",
    "tensor_of_tensors": "builds a tensor from Python values of tensors (.item())",
    "embedding_bag": "reads offsets on the host (data-dependent); runs by no rule",
    "scaled_dot_product_attention": "its kernel draws dropout noise even at p=0 (randomness='error' refuses)",
    "scaled_dot_product_attention_blocked": "its kernel draws dropout noise even at p=0 (randomness='error' refuses)",
    "item": "`.item()` is an error under vmap (tested in test_func.py)",
    "tolist": "converts to Python: an error under vmap",
}


def _stack_like(items):
    """Examples of one argument -> (batched argument, in_dim)."""
    first = items[0]
    if isinstance(first, fl.Tensor):
        return fl.stack([t.detach() for t in items]), 0
    if isinstance(first, (list, tuple)) and any(isinstance(t, fl.Tensor) for t in first):
        tensor = [isinstance(x, fl.Tensor) for x in first]
        return (type(first)(fl.stack([it[k].detach() for it in items]) if tensor[k] else first[k]
                            for k in range(len(first))),
                tuple(0 if t else None for t in tensor))
    return first, None


def _examples(info, sample, dtype, seed):
    return [materialize(fl, sample, dtype, seed + 17 * b, False)[:2] for b in range(BATCH)]


def _check_entry(info, dtype):
    fn = info.resolve(fl)
    ran = 0
    for i, s in enumerate(info.samples(dtype)[:MAX_SAMPLES]):
        exs = _examples(info, s, dtype, 300 + i)
        kwargs = exs[0][1]            # keyword arguments are not mapped: the first example's serve all
        try:
            refs = [fn(*a, **kwargs) for a, _ in exs]
        except Exception:
            continue
        if any(not isinstance(r, (fl.Tensor, tuple, list)) for r in refs) or not flat_tensors(fl, refs[0]):
            continue
        cols = [_stack_like([e[0][j] for e in exs]) for j in range(len(exs[0][0]))]
        args = tuple(c[0] for c in cols)
        dims = tuple(c[1] for c in cols)
        if all(d is None for d in dims):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fl.func.vmap(lambda *a: fn(*a, **kwargs), in_dims=dims,
                               randomness="different" if info.random else "error")(*args)
        want = [fl.stack(list(col)) for col in zip(*[flat_tensors(fl, r) for r in refs])]
        got = flat_tensors(fl, out)
        where = f"{info.name} sample {i} {s.name}"
        assert len(got) == len(want), where
        for g, w in zip(got, want):
            assert g.dtype == w.dtype, f"{where}: dtype {g.dtype} != {w.dtype}"
            assert tuple(g.shape) == tuple(w.shape), f"{where}: shape {tuple(g.shape)} != {tuple(w.shape)}"
            if not info.random:
                a, b = g.detach(), w.detach()
                if a.is_floating_point():
                    np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), rtol=1e-5, atol=1e-6,
                                               equal_nan=True, err_msg=where)
                else:
                    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=where)
        ran += 1
    return ran


def _dtype(info):
    for d in ("float64", "float32", "int64", "bool"):
        if d in info.dtypes:
            return d
    return info.dtypes[0]


@pytest.mark.parametrize("info", INFOS, ids=[i.name for i in INFOS])
def test_vmap_matches_a_loop_over_the_batch(info):
    if info.name in SKIP:
        pytest.skip(SKIP[info.name])
    _check_entry(info, _dtype(info))


def test_ops_without_a_batching_rule_are_counted():
    """The ops vmap runs by decomposition or by the loop fallback (no rule of their own and no
    pointwise tag). The count may only shrink: add a rule, then lower it."""
    functional = [op for op in OPS.values() if not op.is_inplace]
    missing = sorted(op.name for op in functional if batched.rule_of(op) is None)
    with_rule = len(functional) - len(missing)
    print(f"{with_rule} of {len(functional)} functional ops have a batching rule; without: {', '.join(missing)}")
    assert with_rule >= 272, with_rule
    assert len(missing) <= 96, len(missing)
    for name in ("add.Tensor", "sum.dim_IntList", "view", "matmul", "convolution", "native_layer_norm",
                 "softmax.int", "cross_entropy_loss", "index.Tensor", "linear", "relu"):
        assert batched.rule_of(OPS[name]) is not None, name
