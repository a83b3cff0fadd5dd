"""torch.backends.mha: the switch of the Transformer layers' inference fast path (`TransformerEncoder` with a
key padding mask in eval mode: padded positions come out as zeros, as PyTorch's nested-tensor path gives)."""

_fastpath_enabled = True


def get_fastpath_enabled() -> bool:
    """Whether the Transformer layers may take their inference fast path (PyTorch's default: True)."""
    return _fastpath_enabled


def set_fastpath_enabled(value: bool) -> None:
    """Allow (True) or forbid (False) the Transformer layers' inference fast path."""
    global _fastpath_enabled
    _fastpath_enabled = bool(value)
