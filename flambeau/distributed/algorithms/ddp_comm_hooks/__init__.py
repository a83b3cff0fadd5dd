"""DDP communication hooks: `default_hooks` (all-reduce, fp16 and bf16 compression)."""
from . import default_hooks  # noqa: F401
