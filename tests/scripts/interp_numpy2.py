"""Shared by the scripts that run flambeau's Triton kernels under Triton's interpreter
(TRITON_INTERPRET=1): Triton 3.6's interpreter turns a scalar into an index with int() of a
1-element array, which NumPy >= 2.3 refuses; importing this module makes it take .item() instead.
`report` runs a script's cases and judges them; `HostLauncher` and `HostCupy` stand in for flambeau's
launcher and CuPy so a kernel module's wrappers run on NumPy arrays."""
import triton.runtime.interpreter as _interp

_patch_lang_tensor = _interp._patch_lang_tensor


def _patch_index_for_numpy2(tensor, scope):
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


_interp._patch_lang_tensor = _patch_index_for_numpy2


def report(cases, run, label: str, tol: float) -> int:
    """Run `run(*case)` (its max abs error vs the float64 reference) for each case, print one line
    per case, and return the process exit status: 1 if any case is over `tol`."""
    bad = 0
    for case in cases:
        err = run(*case)
        ok = err < tol
        bad += not ok
        print(f"{label} = {case}: max abs err {err:.2e} {'ok' if ok else 'MISMATCH'}")
    return 1 if bad else 0


_TL_TYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "i64": "int64",
             "i32": "int32", "u64": "uint64"}


class HostLauncher:
    """flambeau's `triton_launch` as the interpreter runs a kernel, for a module whose wrappers take
    NumPy arrays in place of CuPy ones (`HostCupy`): `compile_kernel` keeps the signature, `launch`
    passes each array as a `HostArray` of its signature type (None as a one-element dummy), checks
    the argument count and records the kernel's name in `launches`."""
    launches: list = []

    @staticmethod
    def compile_kernel(fn, signature, constexprs, **options):
        return fn, signature, constexprs

    @classmethod
    def launch(cls, kernel, grid, *args):
        import numpy as np
        import triton.language as tl
        from flambeau._inductor.triton_runtime import HostArray
        fn, sig, const = kernel
        types = [sig[n] for n in fn.arg_names if sig[n] != "constexpr"]
        assert len(types) == len(args), (fn.__name__, len(types), len(args))
        cls.launches.append(fn.__name__)
        passed = [a if not t.startswith("*") else
                  HostArray(np.zeros(1, np.float32) if a is None else a, getattr(tl, _TL_TYPES[t[1:]]))
                  for t, a in zip(types, args)]
        fn[tuple(grid)](*passed, **const)

    current_device = staticmethod(lambda: 0)
    current_stream = staticmethod(lambda: 0)
    multiprocessors = staticmethod(lambda: 8)

    @staticmethod
    def type_of(dtype):
        from flambeau._backends import triton_launch
        return triton_launch.type_of(dtype)


class HostCupy:
    """What the eager Triton wrappers use of CuPy, on NumPy."""
    @staticmethod
    def ndarray(shape, dtype, memptr=None, strides=None):
        """CuPy's constructor: a new array, or one over `memptr` (a `cuda.alloc` block) with byte strides."""
        import numpy as np
        return np.ndarray(shape, dtype, buffer=memptr, strides=strides)

    class cuda:
        @staticmethod
        def alloc(nbytes):
            import numpy as np
            return np.empty(nbytes, np.uint8)

    @staticmethod
    def ascontiguousarray(a):
        import numpy as np
        return np.ascontiguousarray(a)
