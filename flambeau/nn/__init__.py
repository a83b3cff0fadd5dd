"""flambeau.nn: modules, parameters, initialisation and functional API."""
from . import functional  # noqa: F401
from .parameter import Parameter, Buffer, UninitializedParameter  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules.module import Module  # noqa: F401
from . import init, utils, parallel  # noqa: F401
from .parallel import DataParallel  # noqa: F401
