"""flambeau.optim: optimizers (each with a per-parameter and a multi-tensor "foreach" step) and
learning-rate schedulers, with PyTorch's semantics and state_dict structure."""
from .optimizer import Optimizer  # noqa: F401
from .sgd import SGD  # noqa: F401
from .adam import Adam, AdamW, Adamax, NAdam, RAdam  # noqa: F401
from .rmsprop import RMSprop, Adagrad, Adadelta  # noqa: F401
from .lbfgs import LBFGS  # noqa: F401
from . import lr_scheduler  # noqa: F401
