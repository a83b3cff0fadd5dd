"""The PT2E quantizer interface (PyTorch's `torch.ao.quantization.quantizer`): a `Quantizer`
annotates graph nodes with `QuantizationAnnotation`s saying how each input and output is to be
quantized (`QuantizationSpec`); `prepare_pt2e` turns the annotations into observers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .... import _dtype as D
from ....fx.graph_module import GraphModule
from ....fx.node import Node

ANNOTATION_KEY = "quantization_annotation"


@dataclass(eq=True, frozen=True)
class QuantizationSpec:
    """How one tensor is quantized: dtype and range, qscheme (and channel axis), and the observer or
    fake-quantize constructor that watches it (called with the spec's fields as keywords)."""
    dtype: Any
    observer_or_fake_quant_ctr: Callable
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: Any = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def __post_init__(self):
        if self.quant_min is not None and self.quant_max is not None and self.quant_min > self.quant_max:
            raise ValueError(f"quant_min {self.quant_min} must be <= quant_max {self.quant_max}.")
        if self.ch_axis is not None and self.ch_axis < 0:
            raise ValueError("Ch_axis is < 0.")

    def observer_kwargs(self) -> dict:
        kw = {"dtype": self.dtype, "quant_min": self.quant_min, "quant_max": self.quant_max,
              "qscheme": self.qscheme, "is_dynamic": self.is_dynamic}
        if self.qscheme in (D.per_channel_affine, D.per_channel_symmetric):
            kw["ch_axis"] = self.ch_axis
        return {k: v for k, v in kw.items() if v is not None or k in ("dtype",)}


@dataclass(eq=True, frozen=True)
class SharedQuantizationSpec:
    """Quantize with the observer of another edge `(producer, consumer)` or of a node's output: both
    read the same observer instance (called on each), so they get the same qparams."""
    edge_or_node: Any


@dataclass
class QuantizationAnnotation:
    """A node's annotation: a spec per input node it reads, and one for its output."""
    input_qspec_map: dict = field(default_factory=dict)
    output_qspec: QuantizationSpec | None = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False


class Quantizer:
    """Base class: `annotate` marks nodes; `transform_for_annotation` may rewrite the graph first;
    `validate` checks the result."""

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        return model

    def annotate(self, model: GraphModule) -> GraphModule:
        raise NotImplementedError(f"{type(self).__name__}.annotate")

    def validate(self, model: GraphModule) -> None:
        return None


def annotation_of(node: Node) -> QuantizationAnnotation | None:
    return node.meta.get(ANNOTATION_KEY)
