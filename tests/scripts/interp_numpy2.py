"""Imported first by the scripts that run flambeau's Triton kernels under Triton's interpreter
(TRITON_INTERPRET=1): Triton 3.6's interpreter turns a scalar into an index with int() of a
1-element array, which NumPy >= 2.3 refuses; this makes it take .item() instead."""
import triton.runtime.interpreter as _interp

_patch_lang_tensor = _interp._patch_lang_tensor


def _patch_index_for_numpy2(tensor, scope):
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


_interp._patch_lang_tensor = _patch_index_for_numpy2
