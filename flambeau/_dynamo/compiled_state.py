"""What the variable kinds ask of compiled code without importing it (eval_frame imports them,
through convert_frame): whether a frame is being translated (`is_compiling`), and the original
callable behind a compiled wrapper (`unwrap_compiled`, which a compiled caller inlines instead of
calling the wrapper). eval_frame's wrappers derive from `CompiledWrapper` and count, per thread
(`thread`), the frames being translated and the `disable`d functions running: another thread calling a
compiled function meanwhile runs its compiled code, and `is_compiling()` is False there, as in PyTorch."""
from __future__ import annotations

from typing import Callable

from .._compile_lock import _ThreadCompileState, is_compiling, thread  # noqa: F401  (the state lives below the library)

class CompiledWrapper:
    """Base of the callables eval_frame makes of a function or a module."""

    def original(self) -> Callable:
        """What the wrapper compiles: the function (bound when it was a method) or the module."""
        raise NotImplementedError


def unwrap_compiled(v):
    """The original function behind a compiled wrapper (inlined when a compiled function calls it)."""
    if isinstance(v, CompiledWrapper):
        return v.original()
    inner = getattr(v, "_torchdynamo_orig_callable", None)
    if inner is not None and getattr(v, "_compiled", None) is not None:
        return inner
    return v
