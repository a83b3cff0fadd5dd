"""torch.distributed.nn: autograd-aware collectives (`functional`)."""
from .functional import *  # noqa: F401,F403
from .functional import __all__
