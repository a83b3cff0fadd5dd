"""Dynamically quantized recurrent modules (PyTorch's `torch.ao.nn.quantized.dynamic` LSTM, GRU,
LSTMCell, GRUCell, RNNCell): qint8 weights quantized once (per tensor, by the qconfig's weight
observer), float biases packed with them, every product a `linear_dynamic` (`linear.py`), the gates
in float32.

`LSTM` and `GRU` run the float layers' recurrence (`nn.LSTM`/`nn.GRU`: layers, bidirectional,
batch_first, initial states, packed sequences) with the input projection of a whole sequence
quantized at once and the hidden state's at each step, as PyTorch's cpu `quantized_lstm`/
`quantized_gru`; the GRU gates in the order of ATen's `GRUCell` (`(h - n) * z + n`). The cells
quantize the input and the hidden state of their one step, ATen's `quantized_*_cell_dynamic`.
"""
from __future__ import annotations

import copy

from ..... import _dtype as D
from ....._tensor import Tensor
from .....nn.modules.module import Module
from .....nn.modules import rnn as float_rnn
from ....._ops import EXPORTS as F
from ....._backends import cpu_int8
from ....quantization.observer import MinMaxObserver
from .linear import linear_dynamic

REDUCE_RANGE = True     # PyTorch's layers make their cell params with reduce_range=True; the cells' default is too


class _PackedWeight:
    """A qint8 weight and its `cpu_int8.pack_weight` layout, made once."""

    def __init__(self, qweight: Tensor):
        self.qweight, self.packed = qweight, cpu_int8.pack_weight(qweight._data)


def _default_weight_observer() -> MinMaxObserver:
    return MinMaxObserver(dtype=D.qint8, qscheme=D.per_tensor_symmetric)


def _observer_factory(mod: Module, weight_observer):
    """One fresh weight observer per weight: a copy of the one given, else the qconfig's, else the default."""
    if weight_observer is not None:
        return lambda: copy.deepcopy(weight_observer)
    qconfig = getattr(mod, "qconfig", None)
    return qconfig.weight if qconfig is not None else _default_weight_observer


def _quantize_weight(w: Tensor, make_observer) -> _PackedWeight:
    obs = make_observer()
    if obs.dtype is not D.qint8:
        raise RuntimeError(f"Unsupported dtype for dynamic RNN quantization: {obs.dtype}")
    w = w.detach().float()
    obs(w)
    scale, zp = obs.calculate_qparams()
    return _PackedWeight(F["quantize_per_tensor"](w, float(scale), int(zp), D.qint8))


def _zero_qweight(rows: int, cols: int) -> Tensor:
    return F["quantize_per_tensor"](F["zeros"](rows, cols), 1.0, 0, D.qint8)


def _float_bias(b: Tensor | None) -> Tensor | None:
    return None if b is None else b.detach().float().clone()


def _check_bias(cls, mod: Module) -> None:
    """PyTorch's dynamic recurrent layers and cells have no bias-free form: `from_float` refuses one."""
    if not mod.bias:
        raise AssertionError(f"mod.bias must be True: nnqd.{cls.__name__}.from_float has no bias-free form "
                             f"(PyTorch's neither); leave this {type(mod).__name__} out of quantize_dynamic's "
                             f"qconfig_spec or give it biases")


class _DynamicRNNBase:
    """What the dynamically quantized LSTM and GRU add to the float layer: int8 products, weights
    quantized from a float module, no parameters of their own (eval-mode semantics)."""

    def _linear(self, x, w, b):
        if x._dtype is not D.float32:
            raise RuntimeError(f"quantized::quantized_{self.mode.lower()}: expected a float32 input, got {x._dtype}")
        return linear_dynamic(x, w.qweight, b, reduce_range=REDUCE_RANGE, packed=w.packed)

    def _weights(self, layer, d):
        w_ih, w_hh, b_ih, b_hh = self._qweights[(layer, d)]
        return w_ih, w_hh, b_ih, b_hh, None

    def _run_direction(self, x, layer, d, h, c, mask):
        """A packed batch as ATen's PackedLayer: each step runs the cell on the running sequences only
        (a prefix of the length-sorted batch), so the hidden state's quantization range is theirs;
        the input projection of the padded batch equals the packed data's (the padding's zeros lie in
        every range)."""
        if mask is None:
            return super()._run_direction(x, layer, d, h, c, mask)
        w_ih, w_hh, b_ih, b_hh, _ = self._weights(layer, d)
        gi_all = self._linear(x, w_ih, b_ih)
        running = [int(n) for n in mask.sum((1, 2)).tolist()]
        steps = range(x.shape[0] - 1, -1, -1) if d == 1 else range(x.shape[0])
        outs = [None] * x.shape[0]
        for t in steps:
            k = running[t]
            h2, c2 = self._cell(gi_all[t][:k], h[:k], None if c is None else c[:k], w_hh, b_hh, None)
            outs[t] = F["cat"]([h2, F["zeros_like"](h[k:])], 0)
            h = F["cat"]([h2, h[k:]], 0)
            c = None if c is None else F["cat"]([c2, c[k:]], 0)
        return F["stack"](outs, 0), h, c

    @classmethod
    def from_float(cls, mod: Module, weight_observer=None):
        """Quantize each weight with its qconfig's weight observer (default: MinMax, qint8, symmetric)."""
        if type(mod) is not cls._FLOAT_MODULE:
            raise AssertionError(f"nnqd.{cls.__name__}.from_float only works for {cls._FLOAT_MODULE.__name__}, "
                                 f"got {type(mod).__name__}")
        _check_bias(cls, mod)
        if getattr(mod, "proj_size", 0):
            raise RuntimeError(f"nnqd.{cls.__name__}.from_float: an LSTM with proj_size is not supported")
        make_observer = _observer_factory(mod, weight_observer)
        out = object.__new__(cls)
        Module.__init__(out)
        for name in ("mode", "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                     "bidirectional", "proj_size"):
            setattr(out, name, getattr(mod, name))
        out._flat_weights_names = []
        out._qweights = {}
        for layer in range(mod.num_layers):
            for d in range(2 if mod.bidirectional else 1):
                w_ih, w_hh, b_ih, b_hh, _ = float_rnn.RNNBase._weights(mod, layer, d)
                out._qweights[(layer, d)] = (_quantize_weight(w_ih, make_observer), _quantize_weight(w_hh, make_observer),
                                             _float_bias(b_ih), _float_bias(b_hh))
        return out.train(False)


class LSTM(_DynamicRNNBase, float_rnn.LSTM):
    """`torch.ao.nn.quantized.dynamic.LSTM`: `nn.LSTM`'s recurrence with int8 products."""
    _FLOAT_MODULE = float_rnn.LSTM


class GRU(_DynamicRNNBase, float_rnn.GRU):
    """`torch.ao.nn.quantized.dynamic.GRU`: `nn.GRU`'s recurrence with int8 products, gates as ATen's."""
    _FLOAT_MODULE = float_rnn.GRU

    def _cell(self, gi, h, c, w_hh, b_hh, w_hr):
        return _gru_gates(gi, self._linear(h, w_hh, b_hh), h), None


def _gru_gates(gi: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """ATen's GRUCell on the two projections, in its order of float operations."""
    ir, iz, in_ = gi.chunk(3, -1)
    hr, hz, hn = gh.chunk(3, -1)
    r = F["sigmoid"](hr + ir)
    z = F["sigmoid"](hz + iz)
    n = F["tanh"](in_ + hn * r)
    return (h - n) * z + n


class RNNCellBase(Module):
    """`torch.ao.nn.quantized.dynamic.RNNCellBase`: one step of a cell, both products int8."""
    _FLOAT_MODULE = float_rnn.RNNCellBase
    _CHUNKS = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, dtype=D.qint8):
        super().__init__()
        if dtype is not D.qint8:
            raise RuntimeError(f"Unsupported dtype for dynamic RNN quantization: {dtype}")
        self.input_size, self.hidden_size, self.bias, self.weight_dtype = input_size, hidden_size, bias, dtype
        gates = self._CHUNKS * hidden_size
        biases = (F["zeros"](gates), F["zeros"](gates)) if bias else (None, None)
        self.set_weight_bias({"weight": {"weight_ih": _zero_qweight(gates, input_size),
                                         "weight_hh": _zero_qweight(gates, hidden_size)},
                              "bias": {"bias_ih": biases[0], "bias_hh": biases[1]}})

    def set_weight_bias(self, weight_bias: dict) -> None:
        """PyTorch's `{"weight": {"weight_ih", "weight_hh"}, "bias": {"bias_ih", "bias_hh"}}`."""
        w, b = weight_bias["weight"], weight_bias["bias"]
        self._packed_weight_ih, self._packed_weight_hh = _PackedWeight(w["weight_ih"]), _PackedWeight(w["weight_hh"])
        self.bias_ih, self.bias_hh = b["bias_ih"], b["bias_hh"]

    def _weight_bias(self) -> dict:
        return {"weight": {"weight_ih": self._packed_weight_ih.qweight, "weight_hh": self._packed_weight_hh.qweight},
                "bias": {"bias_ih": self.bias_ih, "bias_hh": self.bias_hh}}

    def get_weight(self) -> dict:
        return self._weight_bias()["weight"]

    def get_bias(self) -> dict:
        return self._weight_bias()["bias"]

    extra_repr = float_rnn.RNNCellBase.extra_repr      # the float cells' repr, as PyTorch's dynamic cells

    def _check(self, x: Tensor, hx: Tensor, label: str = "") -> None:
        """PyTorch's check_forward_input/check_forward_hidden (a cell takes batched 2-D input only)."""
        if x.dim() != 2:
            raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got 1)")
        if x.shape[1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {x.shape[1]}, expected {self.input_size}")
        if x.shape[0] != hx.shape[0]:
            raise RuntimeError(f"Input batch size {x.shape[0]} doesn't match hidden{label} batch size {hx.shape[0]}")
        if hx.shape[1] != self.hidden_size:
            raise RuntimeError(f"hidden{label} has inconsistent hidden_size: got {hx.shape[1]}, "
                               f"expected {self.hidden_size}")

    def _zeros(self, x: Tensor) -> Tensor:
        return F["zeros"](x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)

    def _products(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        if x._dtype is not D.float32:
            raise RuntimeError(f"quantized::{type(self).__name__}: expected a float32 input, got {x._dtype}")
        gi = linear_dynamic(x, self._packed_weight_ih.qweight, self.bias_ih, REDUCE_RANGE,
                            self._packed_weight_ih.packed)
        gh = linear_dynamic(h, self._packed_weight_hh.qweight, self.bias_hh, REDUCE_RANGE,
                            self._packed_weight_hh.packed)
        return gi, gh

    @classmethod
    def from_float(cls, mod: Module, weight_observer=None) -> "RNNCellBase":
        """Quantize both weights with the qconfig's weight observer (default: MinMax, qint8, symmetric)."""
        if type(mod) is not cls._FLOAT_MODULE:
            raise AssertionError(f"nnqd.{cls.__name__}.from_float only works for {cls._FLOAT_MODULE.__name__}, "
                                 f"got {type(mod).__name__}")
        _check_bias(cls, mod)
        make_observer = _observer_factory(mod, weight_observer)
        kwargs = {"nonlinearity": mod.nonlinearity} if isinstance(mod, float_rnn.RNNCell) else {}
        out = cls(mod.input_size, mod.hidden_size, mod.bias, **kwargs)
        out._packed_weight_ih = _quantize_weight(mod.weight_ih, make_observer)
        out._packed_weight_hh = _quantize_weight(mod.weight_hh, make_observer)
        out.bias_ih, out.bias_hh = _float_bias(mod.bias_ih), _float_bias(mod.bias_hh)
        return out


class RNNCell(RNNCellBase):
    """`torch.ao.nn.quantized.dynamic.RNNCell` (tanh or relu)."""
    _FLOAT_MODULE = float_rnn.RNNCell

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 dtype=D.qint8):
        super().__init__(input_size, hidden_size, bias, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        hx = self._zeros(input) if hx is None else hx
        self._check(input, hx)
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        gi, gh = self._products(input, hx)
        return F[self.nonlinearity](gh + gi)


class LSTMCell(RNNCellBase):
    """`torch.ao.nn.quantized.dynamic.LSTMCell`."""
    _FLOAT_MODULE = float_rnn.LSTMCell
    _CHUNKS = 4

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hx is None:
            hx = (self._zeros(input), self._zeros(input))
        self._check(input, hx[0], "[0]")
        self._check(input, hx[1], "[1]")
        gi, gh = self._products(input, hx[0])
        i, f, g, o = (gh + gi).chunk(4, 1)
        c = F["sigmoid"](f) * hx[1] + F["sigmoid"](i) * F["tanh"](g)
        return F["sigmoid"](o) * F["tanh"](c), c


class GRUCell(RNNCellBase):
    """`torch.ao.nn.quantized.dynamic.GRUCell`."""
    _FLOAT_MODULE = float_rnn.GRUCell
    _CHUNKS = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        hx = self._zeros(input) if hx is None else hx
        self._check(input, hx)
        gi, gh = self._products(input, hx)
        return _gru_gates(gi, gh, hx)
