"""flambeau.nn.utils: gradient clipping, parameter/vector conversion, RNN sequence packing, weight norm."""
from . import rnn  # noqa: F401
from .clip_grad import clip_grad_norm_, clip_grad_norm, clip_grad_value_, get_total_norm, clip_grads_with_norm_  # noqa: F401
from .convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
from .weight_norm import weight_norm, remove_weight_norm  # noqa: F401
from . import parametrizations  # noqa: F401
