"""nn.functional operators: convolution (nn_conv), pooling and interpolation (nn_pool), padding,
pixel shuffle, embedding and one_hot (nn_pad), over the separable resampling engine (nn_resample)."""
from . import nn_resample, nn_conv, nn_pool, nn_pad  # noqa: F401
