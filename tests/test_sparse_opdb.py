"""The op database drives the sparse element-wise ops: every zero-preserving unary operator that
flambeau's sparse tensors take (`flambeau.sparse._elementwise.ZERO_PRESERVING_UNARY`) runs over its
database entry's samples, sparsified (a fixed mask zeroes about half of each sample), as COO, and for
2-D samples as CSR, CSC, BSR and BSC: layout and values against torch 2.13's sparse kernels, and the
gradient reaching the dense input (through the conversion) against the dense operator's own gradient
read at the stored entries (every element of a stored block)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import flambeau
from flambeau.sparse._elementwise import ZERO_PRESERVING_UNARY
from flambeau.sparse._ops import to_dense
from flambeau.sparse._tensor import values_of, with_values
from tests.opdb import T, all_opinfos, materialize

INFOS = {i.name: i for i in all_opinfos()}
UNARY = [INFOS[n] for n in ZERO_PRESERVING_UNARY if n in INFOS]
LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
# names of ZERO_PRESERVING_UNARY without an entry of their own: NumPy-style aliases of entries that have one
ALIASES_WITHOUT_ENTRY = {"arctan": "atan", "arcsinh": "asinh"}


def test_every_sparse_unary_op_has_a_database_entry():
    missing = {n for n in ZERO_PRESERVING_UNARY if n not in INFOS}
    assert missing == set(ALIASES_WITHOUT_ENTRY)
    assert all(target in INFOS for target in ALIASES_WITHOUT_ENTRY.values())


def _dtype(info) -> str:
    return "float64" if "float64" in info.dtypes else info.dtypes[0]


def _samples(info, layout):
    """(index, sample) of the entry's one-tensor samples a sparse layout can hold."""
    for i, s in enumerate(info.samples(_dtype(info))):
        if len(s.args) != 1 or not isinstance(s.args[0], T):
            continue
        nd = len(s.args[0].shape)
        if nd == 0 or (layout != "coo" and nd != 2):
            continue
        yield i, s


def _sparse_input(m, info, s, i, layout, grad):
    args, kwargs, _ = materialize(m, s, _dtype(info), 500 + i, False)
    x = args[0].detach()
    mask = np.random.default_rng(i).random(tuple(x.shape)) < 0.5
    x = x * m.tensor(mask).to(x.dtype) if x.dtype is not m.bool else x & m.tensor(mask)
    if grad:
        x = x.requires_grad_()
    if layout in ("bsr", "bsc"):        # blocks of 2 where the extent is even
        return x, getattr(x, f"to_sparse_{layout}")(tuple(2 if n % 2 == 0 else 1 for n in x.shape)), kwargs
    return x, (x.to_sparse() if layout == "coo" else getattr(x, f"to_sparse_{layout}")()), kwargs


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("info", UNARY, ids=[i.name for i in UNARY])
def test_sparse_unary_op_matches_pytorch(info, layout):
    compared = 0
    for i, s in _samples(info, layout):
        outs = []
        for m in (torch, flambeau):
            _, sp, kwargs = _sparse_input(m, info, s, i, layout, False)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    outs.append(info.resolve(m)(sp, **kwargs))
            except (RuntimeError, NotImplementedError, TypeError) as e:
                outs.append(e)
        want, got = outs
        if isinstance(want, Exception):        # PyTorch has no sparse kernel for this op and layout
            continue
        assert not isinstance(got, Exception), f"{info.name}[{i}]: {got!r}"
        assert str(got.layout) == str(want.layout) and str(got.dtype) == str(want.dtype), (got.layout, want.layout)
        np.testing.assert_allclose(got.to_dense().double().numpy() if got.dtype.is_floating_point else
                                   got.to_dense().numpy(),
                                   want.to_dense().double().numpy() if want.dtype.is_floating_point else
                                   want.to_dense().numpy(), rtol=1e-6, atol=1e-6, equal_nan=True,
                                   err_msg=f"{info.name}[{i}] {layout}")
        compared += 1
    if compared == 0:
        pytest.skip(f"no {layout} sample of {info.name} that PyTorch runs sparse")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("info", [i for i in UNARY if i.grad], ids=[i.name for i in UNARY if i.grad])
def test_sparse_unary_op_gradient_is_the_dense_ones_at_the_stored_entries(info, layout):
    ran = 0
    for i, s in _samples(info, layout):
        x, sp, kwargs = _sparse_input(flambeau, info, s, i, layout, True)
        if not x.dtype.is_floating_point:
            continue
        out = info.resolve(flambeau)(sp, **kwargs)
        if not out.dtype.is_floating_point:
            continue
        g = flambeau.tensor(np.random.default_rng(7 + i).standard_normal(tuple(x.shape))).to(x.dtype)
        (out.to_dense() * g).sum().backward()
        xd = x.detach().clone().requires_grad_()
        (info.resolve(flambeau)(xd, **kwargs) * g).sum().backward()
        stored = to_dense(with_values(flambeau.ones_like(values_of(sp.detach())), sp._pattern)).numpy() != 0
        np.testing.assert_allclose(x.grad.numpy(), np.where(stored, xd.grad.numpy(), 0), rtol=1e-10, atol=1e-12,
                                   err_msg=f"{info.name}[{i}] {layout}")
        ran += 1
    if ran == 0:
        pytest.skip(f"no floating sample of {info.name} for {layout}")
