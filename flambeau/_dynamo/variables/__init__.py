"""Variable trackers: the symbolic values of the symbolic bytecode evaluator (see base.py)."""
from .base import VariableTracker, ConstantVariable, NullVariable, NULL, const  # noqa: F401
from .containers import (TupleVariable, ListVariable, DictVariable, SetVariable, SliceVariable,  # noqa: F401
                         ListIteratorVariable, RangeVariable)
from .tensor import TensorVariable, SymNodeVariable  # noqa: F401
from .builtin import BuiltinVariable, GetAttrVariable  # noqa: F401
from .functions import (UserFunctionVariable, NestedUserFunctionVariable, UserMethodVariable,  # noqa: F401
                        CellVariable, RealCellVariable)
from .nn_module import NNModuleVariable  # noqa: F401
from .objects import ObjectVariable, ClassVariable, PythonModuleVariable, SuperVariable  # noqa: F401
from .torch import TorchFunctionVariable, GradModeVariable, GradModeExitVariable  # noqa: F401
from .builder import build, wrap_constant_like  # noqa: F401
