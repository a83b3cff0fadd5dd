"""What the minifier and its repro scripts share: where scripts are written, a graph's inputs as
plain records and random tensors made from them, and the accuracy judgement.

Inputs are recorded as `(shape, stride, dtype name, device, requires_grad)` tuples (Python ints
as themselves, None as None), so a script can rebuild tensors of the same layout with random
values (`make_inputs`: normal floats, zero integers, as PyTorch's `rand_strided`). An input whose
sizes were symbolic in the failing graph (`dynamic=True`, `mark_dynamic`, automatic dynamic shapes)
has a sixth entry, the tuple of those dims, so the script compiles the graph with them symbolic
again (`dynamic_dims`, read from the graph's placeholders by `placeholder_dynamic_dims`).

Accuracy is PyTorch's `same()`: a compiled result passes when it is allclose to eager within the
tolerance, or when its RMS error against a float64 run of the same graph is at most a multiplier
(2, or 3 for small or half-precision tensors) times eager's error plus tol/10.
"""
from __future__ import annotations

import copy
import math
import os
from difflib import SequenceMatcher

import numpy as np

from .. import config
from ... import _dtype as D
from ..._ops import functions
from ..._tensor import Tensor, preserve_format
from ...autograd import no_grad
from ...random import manual_seed
from ...fx.node import map_aggregate

FP64_MULTIPLIER = 2.0            # compiled may be this many times further from float64 than eager is
FP64_MULTIPLIER_SMALL = 3.0      # ... for tensors under SMALL_NUMEL elements and fp16/bf16 results
SMALL_NUMEL = 1000
SCRIPT_NAME = "repro.py"
LAUNCHER_NAME = "minifier_launcher.py"


class AccuracyError(Exception):
    """A compiled graph's output differs from eager beyond tolerance (judged against float64)."""


def minifier_dir() -> str:
    """Where repro scripts go: `config.minifier_dir`, else `minifier/` in the inductor debug dir
    (`$FLAMBEAU_COMPILE_DEBUG_DIR`, default `./flambeau_compile_debug`)."""
    if config.minifier_dir:
        return config.minifier_dir
    root = os.environ.get("FLAMBEAU_COMPILE_DEBUG_DIR") or os.path.join(os.getcwd(), "flambeau_compile_debug")
    return os.path.join(root, "minifier")


def check_config() -> None:
    """Raise for settings the minifier cannot act on (named after the setting)."""
    if config.repro_after not in (None, "dynamo", "aot"):
        raise ValueError(f"flambeau._dynamo.config.repro_after (FLAMBEAU_REPRO_AFTER) must be 'dynamo', 'aot' or "
                         f"None, got {config.repro_after!r}")
    if config.repro_level not in (1, 2, 3, 4):
        raise ValueError(f"flambeau._dynamo.config.repro_level (FLAMBEAU_REPRO_LEVEL) must be 1, 2, 3 or 4, got "
                         f"{config.repro_level!r}")


# ---- inputs --------------------------------------------------------------------------------------
def input_spec(a, keep_grad: bool = True, dynamic: tuple = ()) -> tuple | int | float | bool | None:
    """The record of one graph input; `dynamic`: its dims that were symbolic (see module docstring)."""
    if isinstance(a, Tensor):
        spec = (tuple(a.shape), tuple(a.stride()), a.dtype.name, str(a.device), bool(keep_grad and a.requires_grad))
        return spec + (tuple(dynamic),) if dynamic else spec
    if a is None or isinstance(a, (bool, int, float)):
        return a
    raise TypeError(f"flambeau minifier: cannot record a graph input of type {type(a).__name__} in a repro script")


def rand_strided(shape, stride, dtype: str, device: str = "cpu", requires_grad: bool = False,
                 dynamic: tuple = ()) -> "Tensor":
    """A tensor of `shape` and `stride` over fresh storage: normal floats, zeros otherwise
    (`dynamic`, a spec's dims that were symbolic, is for `dynamic_dims`, not the tensor)."""
    dt = D.BY_NAME[dtype] if dtype in D.BY_NAME else D.ALIASES[dtype]
    needed = 0 if any(s == 0 for s in shape) else 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    if dt.is_floating_point or dt.is_complex:
        base = functions.randn(needed, dtype=dt, device=device)
    else:
        base = functions.zeros(needed, dtype=dt, device=device)
    t = functions.as_strided(base, tuple(shape), tuple(stride)).detach()
    return t.requires_grad_() if requires_grad else t


def make_inputs(specs: list, seed: int = 0) -> list:
    """Graph inputs rebuilt from their records, with random values from `seed`."""
    manual_seed(seed)
    return [rand_strided(*s) if isinstance(s, tuple) else s for s in specs]


def dynamic_dims(specs: list) -> list:
    """Per input record, the dims that were symbolic in the failing graph (empty when static)."""
    return [tuple(s[5]) if isinstance(s, tuple) and len(s) > 5 else () for s in specs]


def placeholder_dynamic_dims(gm) -> list:
    """Per placeholder of `gm`, the dims of its example value whose size is symbolic: from
    meta["dynamic_dims"] (set by a repro script), else the fake value after aot ("val") or after
    dynamo ("example_value")."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        if "dynamic_dims" in n.meta:
            out.append(tuple(n.meta["dynamic_dims"]))
            continue
        v = n.meta.get("val", n.meta.get("example_value"))
        shape = tuple(v.shape) if isinstance(v, Tensor) else ()
        out.append(tuple(d for d, s in enumerate(shape) if not isinstance(s, int)))
    return out


def clone_inputs(args: list) -> list:
    """Copies of the tensor inputs (same strides, same requires_grad), so a run cannot change them."""
    out = []
    for a in args:
        if isinstance(a, Tensor):
            c = a.detach().clone(memory_format=preserve_format)
            out.append(c.requires_grad_() if a.requires_grad else c)
        else:
            out.append(a)
    return out


# ---- accuracy --------------------------------------------------------------------------------------
def _float_dtypes() -> set:
    return {D.float32, D.float16, D.bfloat16}


def fp64_reference(gm, args: list) -> object:
    """The outputs of `gm` run eagerly with float inputs and float dtype arguments in float64
    (None when the graph cannot run that way)."""
    floats = _float_dtypes()
    g = copy.deepcopy(gm)
    for n in g.graph.nodes:
        n.args = map_aggregate(n.args, lambda v: D.float64 if v in floats else v)
        n.kwargs = map_aggregate(n.kwargs, lambda v: D.float64 if v in floats else v)
    g.recompile()
    args64 = [a.detach().to(D.float64) if isinstance(a, Tensor) and a.dtype in floats
              else (a.detach() if isinstance(a, Tensor) else a) for a in args]
    try:
        with no_grad():
            return g(*args64)
    except Exception:                        # a graph that needs its own dtypes: judge without float64
        return None


def _array(t) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy())


def _rmse(ref64: np.ndarray, x: np.ndarray) -> float:
    if ref64.size == 0:
        return 0.0
    d = ref64.astype(np.float64) - x.astype(np.float64)
    return float(np.sqrt(np.mean(d * d)))


def accuracy_failure(ref, res, fp64_ref=None, tol: float = 1e-4, ignore_non_fp: bool = False,
                     where: str = "output") -> str | None:
    """Why `res` (compiled) is not `ref` (eager) within `tol` judged against `fp64_ref`, or None."""
    if fp64_ref is None:
        fp64_ref = ref
    if isinstance(ref, (list, tuple)):
        if not isinstance(res, (list, tuple)) or len(ref) != len(res):
            return f"{where}: {len(ref)} values in eager, {res!r:.80} compiled"
        refs64 = fp64_ref if isinstance(fp64_ref, (list, tuple)) and len(fp64_ref) == len(ref) else ref
        for i, (a, b, c) in enumerate(zip(ref, res, refs64)):
            why = accuracy_failure(a, b, c, tol, ignore_non_fp, f"{where}[{i}]")
            if why:
                return why
        return None
    if not isinstance(ref, Tensor):
        if isinstance(ref, float) and isinstance(res, (int, float)):
            ok = math.isclose(ref, res, rel_tol=tol, abs_tol=tol) or (math.isnan(ref) and math.isnan(res))
            return None if ok else f"{where}: {res} compiled, {ref} eager"
        return None if ref == res else f"{where}: {res!r} compiled, {ref!r} eager"
    if not isinstance(res, Tensor):
        return f"{where}: a Tensor in eager, {type(res).__name__} compiled"
    if ref.dtype != res.dtype:
        return f"{where}: dtype {res.dtype} compiled, {ref.dtype} eager"
    if tuple(ref.shape) != tuple(res.shape):
        return f"{where}: shape {tuple(res.shape)} compiled, {tuple(ref.shape)} eager"
    a, b = _array(ref), _array(res)
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        if ignore_non_fp or np.array_equal(a, b):
            return None
        return f"{where}: {int(np.sum(a != b))} of {a.size} {ref.dtype} values differ"
    if np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol, equal_nan=True):
        return None
    c = _array(fp64_ref) if isinstance(fp64_ref, Tensor) else None
    if c is None or c.dtype != np.float64 or c.shape != a.shape:
        return f"{where}: not allclose (tol={tol}), max abs difference {float(np.nanmax(np.abs(a - b))):.3g}"
    ref_err, res_err = _rmse(c, a), _rmse(c, b)
    small = a.size < SMALL_NUMEL or res.dtype in (D.float16, D.bfloat16)
    mult = FP64_MULTIPLIER_SMALL if small else FP64_MULTIPLIER
    if res_err <= mult * ref_err + tol / 10.0:
        return None
    return (f"{where}: RMSE (compiled-fp64) {res_err:.5g}, (eager-fp64) {ref_err:.5g}, shape {tuple(a.shape)}, "
            f"dtype {res.dtype}, multiplier {mult}, tol {tol}")


def same(ref, res, fp64_ref=None, tol: float = 1e-4, ignore_non_fp: bool = False) -> bool:
    """PyTorch's `torch._dynamo.utils.same` (see module docstring)."""
    return accuracy_failure(ref, res, fp64_ref, tol, ignore_non_fp) is None


def _unwrapped(e: BaseException) -> BaseException:
    """The error a wrapper (inductor's LoweringException, BackendCompilerFailed) reports."""
    while getattr(e, "inner_exception", None) is not None:
        e = e.inner_exception
    return e


def same_failure(orig: BaseException, new: BaseException) -> bool:
    """Whether `new` is the failure `orig` again: the same type and a similar message (as PyTorch's
    after-dynamo minifier judges, since messages name nodes that minification renames)."""
    orig, new = _unwrapped(orig), _unwrapped(new)
    if type(new) is not type(orig):
        return False
    return SequenceMatcher(None, str(orig), str(new)).ratio() > 0.5
