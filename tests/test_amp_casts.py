"""The casts autocast issues, counted against PyTorch's: a dispatch mode in each framework logs
every `_to_copy` and the tensors each op receives.

Cast-once cache: inside the outermost autocast region a leaf weight that requires grad is cast to
the low dtype once and the copy reused (`cache_enabled`, default on); the cache is cleared when the
outermost region exits. No cast of a tensor that already has the target dtype: the op receives the
same tensor (same storage), and no copy is issued.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau.utils._python_dispatch import TorchDispatchMode as FlMode
from torch.utils._python_dispatch import TorchDispatchMode as TorchMode

rng = np.random.default_rng(0)
X, W, B = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (5, 4), (5,)))


def _log(mod):
    """A dispatch mode of `mod` recording op names and, per call, the data pointers of its tensor args."""
    base = TorchMode if mod is torch else FlMode

    class Log(base):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1]
            flat = [x for a in args for x in (a if isinstance(a, (list, tuple)) else (a,))]
            ptrs = [_ptr(a) for a in flat if isinstance(a, mod.Tensor)]
            self.calls.append((name, ptrs))
            return func(*args, **(kwargs or {}))

        def count(self, name):
            return sum(1 for n, _ in self.calls if n == name)
    return Log()


def _ptr(t):
    return t.data_ptr() if isinstance(t, torch.Tensor) else t._data.__array_interface__["data"][0]


def _two_linears(mod, **region):
    x = mod.tensor(X)
    w = mod.tensor(W, requires_grad=True)
    b = mod.tensor(B, requires_grad=True)
    log = _log(mod)
    with mod.autocast("cpu", **region), log:
        y1 = mod.nn.functional.linear(x, w, b)
        y2 = mod.nn.functional.linear(x * 2, w, b)
    (y1.float().sum() + (y2.float() ** 2).sum()).backward()
    return log, w.grad


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_weight_cast_once_per_region_like_pytorch(cache_enabled):
    counts = []
    for mod in (torch, fl):
        log, _ = _two_linears(mod, cache_enabled=cache_enabled)
        counts.append(log.count("_to_copy"))
    assert counts[1] == counts[0], f"flambeau casts {counts[1]} times, PyTorch {counts[0]}"
    # the weight and bias once each (cached) + the two activations; without the cache, all four twice
    assert counts[1] == (4 if cache_enabled else 6)


def test_cache_lives_for_the_outermost_region():
    counts = []
    for mod in (torch, fl):
        w = mod.tensor(W, requires_grad=True)
        x = mod.tensor(X).to(mod.bfloat16)             # no cast for x: only the weight's casts are counted
        log = _log(mod)
        with log:
            with mod.autocast("cpu"):
                with mod.autocast("cpu"):
                    mod.nn.functional.linear(x, w)
                mod.nn.functional.linear(x, w)              # inner region left: still cached
            with mod.autocast("cpu"):
                mod.nn.functional.linear(x, w)              # a new outermost region: cast again
        counts.append(log.count("_to_copy"))
    assert counts[1] == counts[0] == 2


def test_cached_cast_keeps_gradients_right():
    g = [_two_linears(mod)[1] for mod in (torch, fl)]
    np.testing.assert_allclose(g[1].numpy(), g[0].numpy(), rtol=2e-2, atol=5e-2)


def test_weight_changed_in_place_is_cast_again():
    """flambeau checks the weight's version: an in-place update inside the region gives a fresh cast."""
    w = fl.tensor(W, requires_grad=True)
    x = fl.tensor(X).to(fl.bfloat16)
    with fl.autocast("cpu"):
        a = fl.nn.functional.linear(x, w)
        with fl.no_grad():
            w.mul_(2)
        b = fl.nn.functional.linear(x, w)
    np.testing.assert_allclose(b.detach().float().numpy(), 2 * a.detach().float().numpy(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["lower", "fp32", "promote"])
def test_no_cast_when_the_dtype_already_matches(case):
    """An input already in the policy's dtype reaches the op itself: no `_to_copy`, same storage."""
    for mod in (torch, fl):
        low = mod.bfloat16
        if case == "lower":
            a, b = mod.tensor(X).to(low), mod.tensor(W.T.copy()).to(low)
            run, op = (lambda: mod.mm(a, b)), "mm"
        elif case == "fp32":
            a, b = mod.tensor(X), mod.tensor(X + 1)
            run, op = (lambda: mod.nn.functional.mse_loss(a, b)), "mse_loss"
        else:
            a, b = mod.tensor(X), mod.tensor(X + 1)
            run, op = (lambda: mod.cat([a, b])), "cat"
        log = _log(mod)
        with mod.autocast("cpu"), log:
            run()
        assert log.count("_to_copy") == 0, (mod.__name__, log.calls)
        (ptrs,) = [p for n, p in log.calls if n == op]
        assert ptrs == [_ptr(a), _ptr(b)], mod.__name__
