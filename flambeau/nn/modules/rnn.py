"""Recurrent layers: RNN, LSTM (with proj_size), GRU and their cells.

Parameters are named exactly as PyTorch's (`weight_ih_l0`, `bias_hh_l1_reverse`, `weight_hr_l0`).
The input projection of every time step is one matmul; the recurrence is a Python loop over time
steps of flambeau ops. PackedSequence inputs run on the padded batch with a per-step mask, so
finished sequences keep their final state."""
from __future__ import annotations

import math
import numbers

from ..._ops import functions as torch   # the operator functions flambeau exports
from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module
from ..utils.rnn import PackedSequence, _packed_to_padded, _padded_to_packed

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class RNNBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None):
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        gate = _GATES[mode] * hidden_size
        ndir = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(ndir):
                in_sz = input_size if layer == 0 else real_hidden * ndir
                sfx = "_reverse" if d == 1 else ""
                shapes = [("weight_ih", (gate, in_sz)), ("weight_hh", (gate, real_hidden))]
                if bias:
                    shapes += [("bias_ih", (gate,)), ("bias_hh", (gate,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                for name, shape in shapes:
                    full = f"{name}_l{layer}{sfx}"
                    setattr(self, full, Parameter(torch.empty(*shape, device=device, dtype=dtype)))
                    self._flat_weights_names.append(full)
        self.reset_parameters()

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, n) for n in self._flat_weights_names if n.endswith(f"_l{layer}{sfx}")]
                for layer in range(self.num_layers) for sfx in (["", "_reverse"] if self.bidirectional else [""])]

    def flatten_parameters(self) -> None:
        return None

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # ---- the recurrence ------------------------------------------------------------------
    def _weights(self, layer, d):
        sfx = "_reverse" if d == 1 else ""
        g = lambda n: getattr(self, f"{n}_l{layer}{sfx}")  # noqa: E731
        b_ih = g("bias_ih") if self.bias else None
        b_hh = g("bias_hh") if self.bias else None
        w_hr = g("weight_hr") if self.proj_size > 0 else None
        return g("weight_ih"), g("weight_hh"), b_ih, b_hh, w_hr

    def _linear(self, x, w, b):
        """The layer's products (a dynamically quantized LSTM runs int8 ones: ao.nn.quantized.dynamic)."""
        return F.linear(x, w, b)

    def _cell(self, gi, h, c, w_hh, b_hh, w_hr):
        """One step given the precomputed input projection gi; returns (h', c')."""
        gh = self._linear(h, w_hh, b_hh)
        if self.mode == "LSTM":
            i, f, g, o = (gi + gh).chunk(4, -1)
            c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h2 = torch.sigmoid(o) * torch.tanh(c2)
            if w_hr is not None:
                h2 = F.linear(h2, w_hr)
            return h2, c2
        if self.mode == "GRU":
            ir, iz, in_ = gi.chunk(3, -1)
            hr, hz, hn = gh.chunk(3, -1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            n = torch.tanh(in_ + r * hn)
            return (1 - z) * n + z * h, None
        pre = gi + gh
        return (torch.tanh(pre) if self.mode == "RNN_TANH" else torch.relu(pre)), None

    def _run_direction(self, x, layer, d, h, c, mask):
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, d)
        gi_all = self._linear(x, w_ih, b_ih)
        steps = range(x.shape[0] - 1, -1, -1) if d == 1 else range(x.shape[0])
        outs = [None] * x.shape[0]
        for t in steps:
            h2, c2 = self._cell(gi_all[t], h, c, w_hh, b_hh, w_hr)
            if mask is not None:
                m = mask[t]
                h2 = torch.where(m, h2, h)
                if c2 is not None:
                    c2 = torch.where(m, c2, c)
                outs[t] = torch.where(m, h2, torch.zeros_like(h2))
            else:
                outs[t] = h2
            h, c = h2, c2
        return torch.stack(outs, 0), h, c

    def forward(self, input, hx=None):
        packed = isinstance(input, PackedSequence)
        is_lstm = self.mode == "LSTM"
        if packed:
            x, batch_sizes, sorted_idx, unsorted_idx = _packed_to_padded(input)
            batched = True
        else:
            batched = input.dim() == 3
            if input.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
            x = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                x = x.transpose(0, 1)
            sorted_idx = unsorted_idx = None
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {x.shape[-1]}")
        ndir = 2 if self.bidirectional else 1
        nb = x.shape[1]
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        if hx is None:
            h0 = torch.zeros(self.num_layers * ndir, nb, real_hidden, dtype=x.dtype, device=x.device)
            c0 = torch.zeros(self.num_layers * ndir, nb, self.hidden_size, dtype=x.dtype, device=x.device) \
                if is_lstm else None
        else:
            h0, c0 = hx if is_lstm else (hx, None)
            if not batched:
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
            if sorted_idx is not None:
                h0 = h0.index_select(1, sorted_idx)
                c0 = c0.index_select(1, sorted_idx) if c0 is not None else None
            exp = (self.num_layers * ndir, nb, real_hidden)
            if tuple(h0.shape) != exp:
                raise RuntimeError(f"Expected hidden size {exp}, got {list(h0.shape)}")
        mask = None
        if packed:
            mask = (torch.arange(nb).unsqueeze(0) < batch_sizes.unsqueeze(1)).unsqueeze(-1).to(x.device)
        hs, cs = [], []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(ndir):
                k = layer * ndir + d
                out, h, c = self._run_direction(layer_in, layer, d, h0[k], c0[k] if c0 is not None else None, mask)
                outs.append(out)
                hs.append(h)
                cs.append(c)
            layer_in = outs[0] if ndir == 1 else torch.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        h_n = torch.stack(hs, 0)
        c_n = torch.stack(cs, 0) if is_lstm else None
        if packed:
            output = _padded_to_packed(layer_in, input)
            if unsorted_idx is not None:
                h_n = h_n.index_select(1, unsorted_idx)
                c_n = c_n.index_select(1, unsorted_idx) if c_n is not None else None
        else:
            output = layer_in
            if not batched:
                output = output.squeeze(1)
                h_n = h_n.squeeze(1)
                c_n = c_n.squeeze(1) if c_n is not None else None
            elif self.batch_first:
                output = output.transpose(0, 1)
        return (output, (h_n, c_n)) if is_lstm else (output, h_n)


class RNN(RNNBase):
    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if len(args) > 3:
            nonlinearity = args[3]
            args = args[:3] + args[4:]
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", *args, **kwargs)


class LSTM(RNNBase):
    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


class RNNCellBase(Module):
    _gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(torch.empty(num_chunks * hidden_size, input_size, device=device, dtype=dtype))
        self.weight_hh = Parameter(torch.empty(num_chunks * hidden_size, hidden_size, device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(torch.empty(num_chunks * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(torch.empty(num_chunks * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def _prep(self, input, hx, n_states):
        if input.dim() not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            z = torch.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hx = z if n_states == 1 else (z, z)
        elif not batched:
            hx = hx.unsqueeze(0) if n_states == 1 else tuple(h.unsqueeze(0) for h in hx)
        return x, hx, batched


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx, 1)
        pre = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        if self.nonlinearity == "tanh":
            out = torch.tanh(pre)
        elif self.nonlinearity == "relu":
            out = torch.relu(pre)
        else:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        return out if batched else out.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        x, (h, c), batched = self._prep(input, hx, 2)
        gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        i, f, g, o = gates.chunk(4, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        return (h2, c2) if batched else (h2.squeeze(0), c2.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx, 1)
        ir, iz, in_ = F.linear(x, self.weight_ih, self.bias_ih).chunk(3, 1)
        hr, hz, hn = F.linear(h, self.weight_hh, self.bias_hh).chunk(3, 1)
        r = torch.sigmoid(ir + hr)
        z = torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        out = (1 - z) * n + z * h
        return out if batched else out.squeeze(0)
