"""Variable trackers: the symbolic values of the symbolic bytecode evaluator (see base.py).

The kinds build one another (a constant's method is a builtin, an object's attribute a function, a
call's result any kind through builder.py). This package imports its modules below in dependency
order (base, tensor, torch, objects, containers, builder, functions, nn_module, builtin: each imports
at module level only from those before it). A module that needs a kind defined after it imports
this package as `kinds` at module level and names `kinds.<module>.<Name>` inside its functions,
which run after the whole package has loaded. What they ask of compiled code (is a frame being
translated, what does a compiled wrapper wrap) is in `compiled_state`, below eval_frame."""
from .base import VariableTracker, ConstantVariable, NullVariable, NULL, const  # noqa: F401
from .tensor import TensorVariable, SymNodeVariable  # noqa: F401
from .torch import TorchFunctionVariable, GradModeVariable, GradModeExitVariable  # noqa: F401
from .objects import ObjectVariable, ClassVariable, PythonModuleVariable, SuperVariable  # noqa: F401
from .containers import (TupleVariable, ListVariable, DictVariable, SetVariable, SliceVariable,  # noqa: F401
                         ListIteratorVariable, RangeVariable)
from .builder import build, wrap_constant_like  # noqa: F401
from .functions import (UserFunctionVariable, NestedUserFunctionVariable, UserMethodVariable,  # noqa: F401
                        CellVariable, RealCellVariable)
from .nn_module import NNModuleVariable  # noqa: F401
from .builtin import BuiltinVariable, GetAttrVariable  # noqa: F401
