"""flambeau.nn: modules, parameters, initialisation and functional API."""
from . import functional  # noqa: F401
