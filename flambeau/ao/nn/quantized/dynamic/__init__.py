"""Dynamically quantized modules (PyTorch's `torch.ao.nn.quantized.dynamic`): int8 weights quantized
once, activations quantized per call from their own min/max, int32 accumulation, float output.
`Linear` and the `linear_dynamic` product in `linear.py`; LSTM, GRU and the three cells in `rnn.py`."""
from .linear import Linear, choose_qparams, linear_dynamic
from .rnn import GRU, LSTM, GRUCell, LSTMCell, RNNCell, RNNCellBase

__all__ = ["Linear", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell", "choose_qparams",
           "linear_dynamic"]
