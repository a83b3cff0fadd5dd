"""flambeau.export: PyTorch's `torch.export` — sound full-graph capture, saving and loading.

    ep = flambeau.export.export(module, args, kwargs=None, dynamic_shapes=None, strict=False)
    ep.module()(*args)                      # run it; ep.graph_module.print_readable() to read it
    flambeau.export.save(ep, "m.pt2"); flambeau.export.load("m.pt2")

`_trace.py` captures (non-strict: tracing with fake tensors and functionalization; strict: dynamo
first), `exported_program.py` is the result, `graph_signature.py` its inputs/outputs, `dynamic_shapes.py`
the Dims and their checks, `serde.py` the file format (JSON graph + safetensors weights, no pickle),
`unflatten.py` the module hierarchy rebuilt from the program.

Layer 14 of tests/test_layers.py's order: imports dynamo (strict export) and below.
"""
from __future__ import annotations

from ._trace import export
from .dynamic_shapes import Dim, DerivedDim, DimHint, ShapesCollection
from .exported_program import ExportedProgram, ModuleCallEntry, ModuleCallSignature
from .graph_signature import ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec
from . import graph_signature  # noqa: F401
from .serde import save, load, SerializeError
from .unflatten import FlatArgsAdapter, InterpreterModule, InterpreterModuleDispatcher, UnflattenedModule, unflatten

__all__ = ["export", "save", "load", "Dim", "DerivedDim", "DimHint", "ShapesCollection", "ExportedProgram",
           "ModuleCallSignature", "ModuleCallEntry", "ExportGraphSignature", "InputKind", "InputSpec", "OutputKind", "OutputSpec",
           "SerializeError", "unflatten", "UnflattenedModule", "InterpreterModule", "InterpreterModuleDispatcher",
           "FlatArgsAdapter"]
