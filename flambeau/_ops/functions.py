"""The operator functions that `flambeau` exports (`flambeau.cat`, `flambeau.sigmoid`, ...), as one
module, for the layers above the operators that call them as PyTorch code does:

    from ..._ops import functions as torch      # in flambeau.nn.modules.rnn
    h = torch.tanh(torch.cat([x, h], 1) @ w)

The objects are the public ones (`functions.cat is flambeau.cat`), so a trace or a graph records
the same call either way. Dtypes, devices and the non-operator functions (`get_default_dtype`,
`manual_seed`) are not here: they come from their own modules (`_dtype`, `_device`, `_api`, `random`).
"""
from . import EXPORTS as _EXPORTS

globals().update(_EXPORTS)
