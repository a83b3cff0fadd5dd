"""All nn layers, re-exported by `flambeau.nn`."""
from .module import Module  # noqa: F401
from .container import Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict  # noqa: F401
from .linear import Identity, Linear, Bilinear, LazyLinear  # noqa: F401
from .flatten import Flatten, Unflatten  # noqa: F401
from .activation import *  # noqa: F401,F403
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d  # noqa: F401
from .batchnorm import (BatchNorm1d, BatchNorm2d, BatchNorm3d, InstanceNorm1d, InstanceNorm2d,  # noqa: F401
                        InstanceNorm3d)
from .normalization import LayerNorm, GroupNorm, RMSNorm, LocalResponseNorm  # noqa: F401
from .sparse import Embedding, EmbeddingBag  # noqa: F401
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d, AlphaDropout, FeatureAlphaDropout  # noqa: F401
from .pooling import *  # noqa: F401,F403
from .padding import *  # noqa: F401,F403
from .misc import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .rnn import RNNBase, RNN, LSTM, GRU, RNNCellBase, RNNCell, LSTMCell, GRUCell  # noqa: F401
from .transformer import (MultiheadAttention, TransformerEncoderLayer, TransformerEncoder,  # noqa: F401
                          TransformerDecoderLayer, TransformerDecoder, Transformer)
