"""torch.backends.mps: Apple's Metal backend. flambeau has none: not built, not available."""
from __future__ import annotations


def is_built() -> bool:
    return False


def is_available() -> bool:
    return False


def is_macos_or_newer(major: int, minor: int) -> bool:
    return False
