"""Deterministic per-rank inputs shared by the collectives worker and its test (NumPy only)."""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np

DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
          "complex64": np.complex64}
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")


def ops_for(dtype: str, backend: str = "gloo") -> list:
    """The ReduceOps each dtype supports (as PyTorch: no bitwise ops on floats, no MIN/MAX on complex; on
    NCCL no bitwise ops at all, and complex only SUM and AVG)."""
    if backend != "gloo":
        return [op for op in ops_for(dtype) if op not in ("BAND", "BOR", "BXOR")
                and not (dtype == "complex64" and op == "PRODUCT")]
    if dtype in FLOATS:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
    if dtype == "complex64":
        return ["SUM", "AVG", "PRODUCT"]
    if dtype == "bool":
        return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def make(rank: int, key: str, shape, dtype: str) -> np.ndarray:
    """Small integer values (sums and products stay exact in every dtype), or normals for wide floats."""
    rng = np.random.default_rng(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in ("float32", "float64"):
        return rng.standard_normal(size=shape).astype(DTYPES[dtype])
    if dtype == "complex64":
        return (rng.integers(-3, 4, size=shape) + 1j * rng.integers(-3, 4, size=shape)).astype(np.complex64)
    low = 0 if dtype == "uint8" else -3
    return rng.integers(low, 4, size=shape).astype(DTYPES[dtype])


def reduce_ref(arrays: list, op: str) -> np.ndarray:
    """PyTorch's reduction over ranks, in float64/complex128/int64, cast back to the input dtype."""
    dt = arrays[0].dtype
    if dt == np.bool_:
        stack = np.stack(arrays).astype(np.uint8)
        out = {"SUM": stack.max(0), "MAX": stack.max(0), "BOR": stack.max(0), "PRODUCT": stack.min(0),
               "MIN": stack.min(0), "BAND": stack.min(0), "BXOR": np.bitwise_xor.reduce(stack, 0)}[op]
        return out.astype(np.bool_)
    wide = np.complex128 if dt.kind == "c" else np.float64 if dt.kind == "f" or dt == ml_dtypes.bfloat16 else np.int64
    stack = np.stack([a.astype(wide) for a in arrays])
    if op == "AVG":
        s = stack.sum(0)
        if wide is np.int64:
            q = np.abs(s) // len(arrays)
            return np.where(s < 0, -q, q).astype(dt)
        return (s / len(arrays)).astype(dt)
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        return fn.reduce(np.stack(arrays), 0).astype(dt)
    fn = {"SUM": np.sum, "PRODUCT": np.prod, "MIN": np.min, "MAX": np.max}[op]
    return fn(stack, 0).astype(dt)


def stored(a: np.ndarray) -> np.ndarray:
    """How results travel to the test: bfloat16 as float32 (npz knows no bfloat16), bool as uint8."""
    if a.dtype == ml_dtypes.bfloat16:
        return a.astype(np.float32)
    return a
