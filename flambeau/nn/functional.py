"""flambeau.nn.functional: the functional layer API (conv, pooling, normalisation, losses,
activations, attention...). Each entry is an operator or a composite declared in `flambeau._ops`
with `namespace="nn.functional"`; this module only gathers them."""
from .._ops._registry import NN_FUNCTIONAL as _NNF

globals().update(_NNF)
