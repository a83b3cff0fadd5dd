"""`import torch` in a process that multiprocessing started from a `flambeau.run` script (a `spawn` child
re-runs the script's imports before anything else): `flambeau.compat.enable()` puts this folder on sys.path,
which the child inherits, so its first `import torch` lands here and makes `torch` flambeau, as in the parent
(the import system hands back what `sys.modules["torch"]` holds once this module has run)."""
from flambeau import compat as _compat

_compat.enable()
