"""flambeau.linalg: gathered from operators declared with namespace="linalg"."""
from ._ops._registry import LINALG as _L

globals().update(_L)
