"""`flambeau.ao.quantization` (PyTorch's `torch.ao.quantization`): observers, fake quantization,
eager dynamic quantization (`quantize_dynamic`), and the PT2E flow in `quantize_pt2e` with its
quantizers in `quantizer`."""
from .observer import (ObserverBase, MinMaxObserver, MovingAverageMinMaxObserver,  # noqa: F401
                       PerChannelMinMaxObserver, MovingAveragePerChannelMinMaxObserver, HistogramObserver,
                       PlaceholderObserver, default_observer, default_weight_observer,
                       default_per_channel_weight_observer, default_dynamic_quant_observer,
                       default_histogram_observer)
from .qconfig import QConfig, default_dynamic_qconfig, per_channel_dynamic_qconfig  # noqa: F401
from .quantize import quantize_dynamic  # noqa: F401
from .fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize  # noqa: F401
from . import quantize_pt2e, quantizer  # noqa: F401
from .quantize_pt2e import move_exported_model_to_eval, move_exported_model_to_train  # noqa: F401
from .quantizer import x86_inductor_quantizer  # noqa: F401
