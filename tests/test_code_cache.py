"""The on-disk cache of code objects of generated Python (`flambeau._code_cache`, issue 13's warm first step):
a hit only for the identical source, under the caller's file name; damaged entries recompiled; a second compile
of a model (after `flambeau._dynamo.reset()`, as a warm process) takes its wrapper, FX and guard code from it
and still computes what eager PyTorch computes."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau import _code_cache, _cpp_builder


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path))
    monkeypatch.setattr(_code_cache, "enabled", True)
    monkeypatch.setattr(_code_cache, "stats", {"hits": 0, "misses": 0, "corrupt": 0})
    return tmp_path


def _source(value: int) -> str:
    """A module of more than MIN_CHARS characters whose `f()` returns `value` from a nested function."""
    pad = "".join(f"c{i} = {i}\n" for i in range(_code_cache.MIN_CHARS // 8))
    return pad + f"def f():\n    def inner():\n        return {value}\n    return inner()\n"


def _run(code) -> int:
    ns: dict = {}
    exec(code, ns)
    return ns["f"]()


def test_a_hit_only_for_the_same_source_under_the_callers_file_name(cache):
    a = _code_cache.compile_source(_source(1), "<first>")
    assert _run(a) == 1 and _code_cache.stats == {"hits": 0, "misses": 1, "corrupt": 0}
    b = _code_cache.compile_source(_source(1), "<second>")
    assert _run(b) == 1 and _code_cache.stats["hits"] == 1
    ns: dict = {}
    exec(b, ns)
    assert b.co_filename == "<second>" and ns["f"].__code__.co_filename == "<second>"
    assert ns["f"].__code__.co_consts[1].co_filename == "<second>"        # inner()
    c = _code_cache.compile_source(_source(2), "<first>")                  # one character differs
    assert _run(c) == 2 and _code_cache.stats["misses"] == 2 and _code_cache.stats["hits"] == 1


def test_short_sources_and_the_switch_write_nothing(cache, monkeypatch):
    assert _run(_code_cache.compile_source("def f():\n    return 3\n", "<s>")) == 3
    monkeypatch.setattr(_code_cache, "enabled", False)
    assert _run(_code_cache.compile_source(_source(4), "<s>")) == 4
    assert not os.path.exists(cache / "pycode")


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty"])
def test_a_damaged_entry_is_compiled_again(cache, damage):
    _code_cache.compile_source(_source(5), "<x>")
    p = _code_cache.path(_code_cache.key(_source(5)))
    data = open(p, "rb").read()
    data = {"truncated": data[:len(data) // 2], "flipped": data[:-3] + bytes([data[-3] ^ 1]) + data[-2:],
            "foreign": b"something else\n" + data, "empty": b""}[damage]
    with open(p, "wb") as f:
        f.write(data)
    assert _run(_code_cache.compile_source(_source(5), "<x>")) == 5
    assert _code_cache.stats["hits"] == 0 and _code_cache.stats["misses"] == 2
    assert _run(_code_cache.compile_source(_source(5), "<x>")) == 5 and _code_cache.stats["hits"] == 1


def _params(rng):
    return [rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (16,), (4, 16), (4,))]


def _step(lib, compile_fn, params, xs, ys):
    """Loss and first-layer weight gradient of an MLP with these parameters, `compile_fn(model)` run."""
    model = lib.nn.Sequential(lib.nn.Linear(8, 16), lib.nn.ReLU(), lib.nn.Linear(16, 4))
    with lib.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(lib.tensor(v))
    loss = ((compile_fn(model)(lib.tensor(xs)) - lib.tensor(ys)) ** 2).mean()
    loss.backward()
    return float(loss.item()), np.asarray(model[0].weight.grad.numpy())


def test_a_second_compile_takes_its_code_from_the_cache_and_matches_pytorch(cache, monkeypatch):
    monkeypatch.setattr(_code_cache, "MIN_CHARS", 0)
    looked_up = []
    real_key = _code_cache.key
    monkeypatch.setattr(_code_cache, "key",
                        lambda source, mode="exec": looked_up.append(source) or real_key(source, mode))
    rng = np.random.default_rng(0)
    params = _params(rng)
    xs, ys = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    ref_loss, ref_grad = _step(torch, lambda m: m, params, xs, ys)

    def ours():
        fl._dynamo.reset()
        try:
            return _step(fl, fl.compile, params, xs, ys)
        finally:
            fl._dynamo.reset()
    for run in range(2):
        before = dict(_code_cache.stats)
        loss, grad = ours()
        np.testing.assert_allclose(loss, ref_loss, rtol=1.3e-6, atol=1e-5)
        np.testing.assert_allclose(grad, ref_grad, rtol=1.3e-6, atol=1e-5)
        new = {k: _code_cache.stats[k] - before[k] for k in before}
        if run == 0:            # dynamo's graph, AOT's forward/backward, the wrappers, the guards: all compiled
            assert new["misses"] >= 5 and new["hits"] == 0, new
            first = new["misses"]
            firsts = {s.lstrip().split("(")[0] for s in looked_up}
            assert {"def forward", "def call", "def ___guard", "def ___entry"} <= firsts, firsts
        else:                   # the same sources again: every one from the cache
            assert new == {"hits": first, "misses": 0, "corrupt": 0}, new
