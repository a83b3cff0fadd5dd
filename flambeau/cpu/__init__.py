"""flambeau.cpu: the cpu device module (PyTorch's torch.cpu); `amp` holds deprecated AMP aliases."""
from . import amp  # noqa: F401


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> str:
    return "cpu"


def synchronize(device=None) -> None:
    """Work on cpu is synchronous: nothing to wait for."""
