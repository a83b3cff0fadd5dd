"""flambeau.special: gathered from operators declared with namespace="special"."""
from ._ops._registry import SPECIAL as _S

globals().update(_S)
