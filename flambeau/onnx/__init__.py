"""torch.onnx: importable; exporting to ONNX is not implemented yet (it has its own open issue).

`export` / `dynamo_export` raise NotImplementedError naming what to use instead; `is_in_onnx_export()`
answers False (model code asks it to pick an export-friendly path), as PyTorch's does outside export.
"""
from __future__ import annotations

__all__ = ["export", "dynamo_export", "is_in_onnx_export", "OnnxExporterError"]

NOT_BUILT = ("flambeau.onnx.{}: exporting to ONNX is not implemented in flambeau yet. Save the weights with "
             "flambeau.save(model.state_dict(), path, format='pt') and export from PyTorch.")


class OnnxExporterError(RuntimeError):
    """Raised by PyTorch's exporter when an export fails."""


def export(model, args=(), f=None, *pargs, **kwargs):
    """Raises NotImplementedError: there is no ONNX exporter yet."""
    raise NotImplementedError(NOT_BUILT.format("export"))


def dynamo_export(model, *args, **kwargs):
    """Raises NotImplementedError: there is no ONNX exporter yet."""
    raise NotImplementedError(NOT_BUILT.format("dynamo_export"))


def is_in_onnx_export() -> bool:
    """False: nothing is ever being exported to ONNX."""
    return False
