"""flambeau: the PyTorch 2 system written in Python.

`import flambeau as torch` gives PyTorch's API: tensors with autograd on cpu (NumPy), cuda
(CuPy) and meta devices, every operator declared once in `flambeau._ops` and run through one
dispatcher (`flambeau._dispatch`). See DESIGN.md in the repository for the map.

Layer 14 (entry) of tests/test_layers.py's order: the package imports every layer; below the top,
only call-time reads reach it (`flambeau._public`).
"""
from __future__ import annotations

from . import _state
from . import torch_version, version  # noqa: F401
from .version import __version__  # noqa: F401

from ._dtype import (dtype, bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32,  # noqa: F401,A004
                     float64, complex64, complex128, uint16, uint32, uint64, float8_e4m3fn, float8_e5m2,
                     promote_types, quint8, qint8, qint32, qscheme, per_tensor_affine, per_channel_affine,
                     per_tensor_symmetric, per_channel_symmetric, per_channel_affine_float_qparams)
from ._dtype import float32 as float, float64 as double, float16 as half, int16 as short  # noqa: A001,F401
from ._dtype import int32 as int, int64 as long, complex64 as cfloat, complex128 as cdouble  # noqa: A001,F401
from ._device import device  # noqa: F401
from ._tags import Tag  # noqa: F401
from ._tensor import (Tensor, Size, is_tensor, strided, sparse_coo, sparse_csr, contiguous_format,  # noqa: F401
                      sparse_csc, sparse_bsr, sparse_bsc,
                      channels_last, channels_last_3d, preserve_format, memory_format)
from . import _ops
from ._ops import EXPORTS as _EXPORTS
from . import autograd  # noqa: F401
from .autograd import no_grad, enable_grad, set_grad_enabled, inference_mode, is_grad_enabled  # noqa: F401
from .autograd.grad_mode import is_inference_mode_enabled, is_anomaly_enabled, is_anomaly_check_nan_enabled  # noqa: F401
globals().update(_EXPORTS)
_ops.install()
from . import cuda  # noqa: F401,E402
from .random import manual_seed, seed, initial_seed, Generator, get_rng_state, set_rng_state, default_generator  # noqa: F401,E402
from ._api import *  # noqa: F401,F403,E402
from ._tensor_types import CPU_TYPES as _CPU_TYPES  # noqa: E402
from . import storage  # noqa: E402,F401
from .storage import UntypedStorage, TypedStorage  # noqa: E402,F401
globals().update(_CPU_TYPES)          # torch.FloatTensor, torch.LongTensor, ... (legacy tensor types)
from . import nn, linalg, special  # noqa: F401,E402
from . import sparse  # noqa: E402,F401
from .sparse import (sparse_coo_tensor, sparse_csr_tensor, sparse_csc_tensor, sparse_bsr_tensor,  # noqa: E402,F401
                     sparse_bsc_tensor, sparse_compressed_tensor)
from .serialization import save, load  # noqa: E402,F401
from . import multiprocessing  # noqa: E402,F401  (installs Tensor.share_memory_ / is_shared)
from . import compat  # noqa: E402,F401
from . import amp, cpu  # noqa: E402,F401
from . import accelerator  # noqa: E402,F401
from .accelerator import get_device_module  # noqa: E402,F401
from . import backends  # noqa: E402,F401
from . import testing  # noqa: E402,F401
from .cuda import amp as _cuda_amp  # noqa: E402,F401  (makes flambeau.cuda.amp an attribute)
from ._backends import OutOfMemoryError  # noqa: E402,F401  (torch.OutOfMemoryError; also flambeau.cuda's)
from .amp.autocast_mode import (autocast, is_autocast_enabled, set_autocast_enabled,  # noqa: E402,F401
                                get_autocast_dtype, set_autocast_dtype, is_autocast_cache_enabled,
                                set_autocast_cache_enabled, clear_autocast_cache, autocast_increment_nesting,
                                autocast_decrement_nesting, is_autocast_cpu_enabled, set_autocast_cpu_enabled,
                                get_autocast_cpu_dtype, set_autocast_cpu_dtype, get_autocast_gpu_dtype,
                                set_autocast_gpu_dtype)
from .amp.grad_scaler import _amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_  # noqa: E402,F401
from . import fx  # noqa: E402,F401
from . import distributed  # noqa: E402,F401
from .fx._aten import ops  # noqa: E402,F401
from . import library  # noqa: E402,F401
from . import jit  # noqa: E402,F401
from . import profiler  # noqa: E402,F401
from .autograd import profiler as _autograd_profiler  # noqa: E402,F401  (torch.autograd.profiler, the legacy API)
from . import _decomp  # noqa: E402,F401  (sets op.decomposition: the compiler and derivative-less ops use it)
from . import compiler  # noqa: E402,F401
from . import func  # noqa: E402,F401
from .compiler import compile  # noqa: E402,F401
from . import ao  # noqa: E402,F401
from . import export  # noqa: E402,F401
from . import onnx  # noqa: E402,F401
from . import _higher_order_ops  # noqa: E402,F401
from ._higher_order_ops import cond  # noqa: E402,F401

from ._gc import freeze_import_objects as _freeze_import_objects, raise_young_threshold as _raise_young  # noqa: E402
_freeze_import_objects()               # last: flambeau's import-time objects leave the collector's scans
_raise_young()                         # and an eager step's transient objects stop triggering collections
