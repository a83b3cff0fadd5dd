"""flambeau.nn: modules, parameters, initialisation and functional API.

Layer 7 (library, with optim, utils, amp, cuda, serialization, ...) of tests/test_layers.py's order:
imports autograd and below; `Module.compile` reaches the compiler through `register_compiler`.
"""
from . import functional  # noqa: F401
from .parameter import Parameter, Buffer, UninitializedParameter  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules.module import Module  # noqa: F401
from . import init, utils, parallel  # noqa: F401
from .parallel import DataParallel  # noqa: F401
