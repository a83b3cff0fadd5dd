"""AOTInductor packages calling the fused CPU attention with masks and 3-d operands.

`F.scaled_dot_product_attention` with an additive float mask broadcast over heads, a bool (L, S) mask,
3-d (heads, L, E) operands, and bfloat16 operands with a bfloat16 mask: each package's model.cpp calls
the fused kernel once with the mask (no math decomposition), run from Python (batch 2 and 5) and from
the C++ program (batch 3), against PyTorch's float64 attention on the same values (float32 to 1e-5;
bfloat16: RMSE no worse than 1.5x PyTorch's own bfloat16 attention's).
"""
from __future__ import annotations

import re
import zipfile

import numpy as np
import pytest

import flambeau as fl
from flambeau._inductor import aoti_compile_and_package, aoti_load_package
from flambeau._inductor.aoti_package import read_tensor_file
from flambeau.export import Dim, export
from tests.test_aoti import _run_cpp

H, L, S, E = 4, 7, 9, 16


class Attn(fl.nn.Module):
    def forward(self, q, k, v, mask):
        return fl.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _inputs(case, b, seed):
    """(q, k, v, mask) as float64 NumPy arrays (the mask bool for 'bool')."""
    rng = np.random.default_rng(seed)
    lead = () if case == "3d" else (b,)
    q, k, v = (rng.standard_normal(lead + (H, n, E)) for n in (L, S, S))
    if case == "bool" or case == "3d":
        mask = rng.random((L, S)) < 0.7
        mask[:, 0] = True                          # no fully masked row
    else:
        mask = rng.standard_normal((b, 1, L, S))
    return q, k, v, mask


def _to(a, dtype):
    return fl.tensor(a) if a.dtype == bool else fl.tensor(a).to(dtype)


def _torch_attention(arrays, dtype):
    import torch
    q, k, v, mask = (torch.tensor(a) if a.dtype == bool else torch.tensor(a).to(dtype) for a in arrays)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).double().numpy()


@pytest.mark.parametrize("case,dtype", [("float", "float32"), ("bool", "float32"), ("3d", "float32"),
                                        ("float", "bfloat16")])
def test_aoti_fused_attention_with_masks_and_3d_operands(tmp_path, case, dtype):
    import torch
    low = getattr(fl, dtype)
    args = [_to(a, low) for a in _inputs(case, 2, 0)]
    b = Dim("b", max=8)
    dyn = None if case == "3d" else {"q": {0: b}, "k": {0: b}, "v": {0: b}, "mask": {0: b} if case == "float" else None}
    pkg = aoti_compile_and_package(export(Attn(), tuple(args), dynamic_shapes=dyn), package_path=str(tmp_path / "a.pt2"))
    with zipfile.ZipFile(pkg) as z:
        calls = re.findall(r"fl_attention_forward\(fl_sz, fl_st, \d, [^,]+, [^,]+, [^,]+, ([^,]+),",
                           z.read("model.cpp").decode())
    assert len(calls) == 1 and calls[0] != "nullptr", calls        # the kernel, with the mask
    run = aoti_load_package(pkg)
    x3 = _inputs(case, 3, 3)
    r, _ = _run_cpp(pkg, tmp_path, [_to(a, low) for a in x3])
    assert r.returncode == 0, r.stderr
    runs = [(_inputs(case, b, b), None) for b in ((2, 5) if dyn else (2,))]
    for arrays, got in runs + [(x3, read_tensor_file(str(tmp_path / "output0.bin")))]:
        got = (run(*[_to(a, low) for a in arrays]) if got is None else got).double().numpy()
        rounded = [a if a.dtype == bool else _to(a, low).double().numpy() for a in arrays]
        want = _torch_attention(rounded, torch.float64)
        if dtype == "float32":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            theirs = _torch_attention(rounded, getattr(torch, dtype))
            rmse, ref = np.sqrt(np.mean((got - want) ** 2)), np.sqrt(np.mean((theirs - want) ** 2))
            assert rmse <= 1.5 * ref + 1e-6, (rmse, ref)
