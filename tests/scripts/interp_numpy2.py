"""Shared by the scripts that run flambeau's Triton kernels under Triton's interpreter
(TRITON_INTERPRET=1): Triton 3.6's interpreter turns a scalar into an index with int() of a
1-element array, which NumPy >= 2.3 refuses; importing this module makes it take .item() instead.
`report` runs a script's cases and judges them."""
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
