"""Autocast op lists vs PyTorch, op by op: every op-database entry runs its samples under
`torch.autocast` and `flambeau.autocast` and the output dtypes must agree. Three input kinds find
each policy: float32 inputs (lower-precision ops go to the autocast dtype), autocast-dtype inputs
(fp32 ops go back to float32) and mixed inputs (promote ops widen, others follow their policy).
An op missing its tag, or tagged for the wrong list, fails here for that op. On cpu against
PyTorch 2.13's CPU lists; the cuda variant runs on the GPU machine against PyTorch's CUDA lists.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import flambeau
from tests.opdb import all_opinfos, materialize

MAX_SAMPLES = 4
KINDS = ("float32", "low", "mixed")
OPINFOS = [i for i in all_opinfos() if "float32" in i.dtypes]
# Differences that are not autocast's: flambeau differs from PyTorch on these inputs without autocast too
# (cpu with bfloat16; with cuda's float16 inputs PyTorch refuses these calls or agrees with us).
EAGER_GAPS = {
    ("setitem_mask", "mixed"): "index_put refuses a 0-dim value of another dtype (PyTorch casts it)",
    ("index_put", "mixed"): "index_put refuses a 0-dim value of another dtype (PyTorch casts it)",
    ("addr", "mixed"): "addr of float32 self and a bfloat16 vector gives bfloat16 (PyTorch: float32)",
}


def _params(device):
    return [pytest.param(info, kind, id=f"{info.name}-{kind}",
                         marks=[pytest.mark.xfail(strict=True, reason=EAGER_GAPS[info.name, kind])]
                         if device == "cpu" and (info.name, kind) in EAGER_GAPS else [])
            for info in OPINFOS for kind in KINDS]


def _low(mod, device):
    return mod.bfloat16 if device == "cpu" else mod.float16


def _convert(x, mod, device, low, kind, counter):
    if isinstance(x, mod.Tensor):
        if x.dtype == mod.float32 and kind != "float32":
            counter[0] += 1
            if kind == "low" or counter[0] % 2 == 0:
                x = x.detach().to(low)
        return x.to(device)
    if isinstance(x, list):
        return [_convert(y, mod, device, low, kind, counter) for y in x]
    if isinstance(x, tuple):
        return tuple(_convert(y, mod, device, low, kind, counter) for y in x)
    return x


def _dtypes(out, mod) -> list:
    if isinstance(out, mod.Tensor):
        return [str(out.dtype).split(".")[-1]]
    if isinstance(out, (list, tuple)):
        return [d for o in out for d in _dtypes(o, mod)]
    return []


def _run(info, mod, sample, kind, seed, device):
    args, kwargs, _ = materialize(mod, sample, "float32", seed, False)
    low = _low(mod, device)
    counter = [0]
    args = _convert(args, mod, device, low, kind, counter)
    kwargs = {k: _convert(v, mod, device, low, kind, counter) for k, v in kwargs.items()}
    if not any(isinstance(a, mod.Tensor) for a in list(args) + list(kwargs.values())) and device != "cpu":
        kwargs["device"] = device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mod.autocast(device, dtype=low):
            return _dtypes(info.resolve(mod)(*args, **kwargs), mod)


def _compare(info, kind, device):
    compared = 0
    for i, s in enumerate(info.samples("float32")[:MAX_SAMPLES]):
        try:
            ref = _run(info, torch, s, kind, 7000 + i, device)
        except Exception:
            continue                       # not a valid call in PyTorch (mixed dtypes, ...): nothing to compare
        try:
            ours = _run(info, flambeau, s, kind, 7000 + i, device)
        except Exception as e:
            raise AssertionError(f"{info.name} sample {i} ({kind} inputs): PyTorch gives {ref}, "
                                 f"flambeau raises {type(e).__name__}: {e}") from e
        assert ours == ref, f"{info.name} sample {i} ({kind} inputs) under autocast: {ours} != PyTorch's {ref}"
        compared += 1
    return compared


@pytest.mark.parametrize("info,kind", _params("cpu"))
def test_autocast_cpu_output_dtypes_match_pytorch(info, kind):
    _compare(info, kind, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("info,kind", _params("cuda"))
def test_autocast_cuda_output_dtypes_match_pytorch(info, kind):
    if not torch.cuda.is_available():
        pytest.skip("the reference PyTorch has no CUDA here")
    _compare(info, kind, "cuda")
