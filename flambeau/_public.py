"""The public namespace `flambeau`, as users see it, for the few places below the top layer whose
job is to name or resolve what users name: generated graph code (its globals are that namespace),
the capture front end resolving `torch.x` in user bytecode, the minifier's repro scripts.

A lookup at call time, not an import: Python loads a package before any of its submodules, so the
package is in `sys.modules` whenever this runs, and no module below the top needs the package's
contents while it is being imported. tests/test_layers.py lists the modules allowed to call it.
"""
from __future__ import annotations

import sys
import types

PACKAGE = __name__.rpartition(".")[0]


def public_namespace() -> types.ModuleType:
    """The `flambeau` module (partly filled while `import flambeau` is still running)."""
    return sys.modules[PACKAGE]
