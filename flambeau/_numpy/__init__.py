"""flambeau._numpy: NumPy's API over flambeau tensors (PyTorch's torch._numpy).

`import flambeau._numpy as tnp` gives `tnp.ndarray` (a Tensor seen as a NumPy array) and NumPy's
functions, ufuncs, dtypes and constants with NumPy's semantics (float64 default, NumPy 2 promotion,
views, `out=`), computed by flambeau operators. Its main user is `flambeau.compile`: dynamo maps a
traced function's `np.*` calls, ndarray methods and operators to these functions (see
`flambeau._numpy._wrappers`), so NumPy code becomes graph nodes. Files: _ndarray.py (the array,
conversions, ufuncs, operators), _funcs.py (creation, reductions, shapes, products, methods),
linalg.py, _wrappers.py (the callables recorded in graphs: Tensors in, Tensors out).
"""
from __future__ import annotations

import numpy as _np

from ._ndarray import ndarray, ufunc, UFUNCS, matmul  # noqa: F401
from ._funcs import *  # noqa: F401,F403
from ._funcs import __all__ as _FUNCS
from . import linalg  # noqa: F401

globals().update(UFUNCS)
abs = UFUNCS["absolute"]  # noqa: A001

# dtypes and constants are NumPy's own objects (user code passes np.float32 either way)
bool_, int8, int16, int32, int64, uint8 = _np.bool_, _np.int8, _np.int16, _np.int32, _np.int64, _np.uint8
float16, float32, float64, complex64, complex128 = (_np.float16, _np.float32, _np.float64, _np.complex64,
                                                     _np.complex128)
dtype, pi, e, inf, nan, newaxis = _np.dtype, _np.pi, _np.e, _np.inf, _np.nan, None

__all__ = ["ndarray", "ufunc", "matmul", "linalg", "abs"] + list(UFUNCS) + list(_FUNCS)
