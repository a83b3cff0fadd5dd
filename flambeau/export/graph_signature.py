"""`torch.export.graph_signature`: what each placeholder and each output of an exported graph is.

An `ExportGraphSignature` lists `input_specs` (one per placeholder, in order: parameters, buffers,
constant tensors, then user inputs) and `output_specs` (one per graph output: the new values of
mutated buffers / user inputs first, then the user outputs). Each spec has a kind, an argument
(the graph value's name) and, for module state, a target (its fully qualified name).
"""
from __future__ import annotations

import dataclasses
from enum import Enum, auto

__all__ = ["InputKind", "OutputKind", "InputSpec", "OutputSpec", "TensorArgument", "SymIntArgument",
           "ConstantArgument", "ExportGraphSignature"]


class InputKind(Enum):
    USER_INPUT = auto()
    PARAMETER = auto()
    BUFFER = auto()
    CONSTANT_TENSOR = auto()
    CUSTOM_OBJ = auto()
    TOKEN = auto()


class OutputKind(Enum):
    USER_OUTPUT = auto()
    LOSS_OUTPUT = auto()
    BUFFER_MUTATION = auto()
    PARAMETER_MUTATION = auto()
    GRADIENT_TO_PARAMETER = auto()
    GRADIENT_TO_USER_INPUT = auto()
    USER_INPUT_MUTATION = auto()
    TOKEN = auto()


@dataclasses.dataclass
class TensorArgument:
    name: str


@dataclasses.dataclass
class SymIntArgument:
    name: str


@dataclasses.dataclass
class ConstantArgument:
    name: str
    value: object


@dataclasses.dataclass
class InputSpec:
    kind: InputKind
    arg: object
    target: str | None
    persistent: bool | None = None

    def __str__(self) -> str:
        target = "" if self.target is None else f" target={self.target!r}"
        persistent = "" if self.persistent is None else f" persistent={self.persistent}"
        return f"{self.arg.name}: {self.kind.name}{target}{persistent}"


@dataclasses.dataclass
class OutputSpec:
    kind: OutputKind
    arg: object
    target: str | None

    def __str__(self) -> str:
        target = "" if self.target is None else f" target={self.target!r}"
        return f"{self.arg.name}: {self.kind.name}{target}"


@dataclasses.dataclass
class ExportGraphSignature:
    input_specs: list
    output_specs: list

    def _inputs(self, kind: InputKind) -> tuple:
        return tuple(s.target for s in self.input_specs if s.kind is kind)

    @property
    def parameters(self) -> tuple:
        return self._inputs(InputKind.PARAMETER)

    @property
    def buffers(self) -> tuple:
        return self._inputs(InputKind.BUFFER)

    @property
    def non_persistent_buffers(self) -> tuple:
        return tuple(s.target for s in self.input_specs if s.kind is InputKind.BUFFER and s.persistent is False)

    @property
    def lifted_tensor_constants(self) -> tuple:
        return self._inputs(InputKind.CONSTANT_TENSOR)

    @property
    def user_inputs(self) -> tuple:
        return tuple(s.arg.name if not isinstance(s.arg, ConstantArgument) else s.arg.value
                     for s in self.input_specs if s.kind is InputKind.USER_INPUT)

    @property
    def user_outputs(self) -> tuple:
        return tuple(s.arg.name if not isinstance(s.arg, ConstantArgument) else s.arg.value
                     for s in self.output_specs if s.kind is OutputKind.USER_OUTPUT)

    def _by_name(self, kind) -> dict:
        return {s.arg.name: s.target for s in self.input_specs if s.kind is kind}

    @property
    def inputs_to_parameters(self) -> dict:
        return self._by_name(InputKind.PARAMETER)

    @property
    def inputs_to_buffers(self) -> dict:
        return self._by_name(InputKind.BUFFER)

    @property
    def inputs_to_lifted_tensor_constants(self) -> dict:
        return self._by_name(InputKind.CONSTANT_TENSOR)

    @property
    def buffers_to_mutate(self) -> dict:
        return {s.arg.name: s.target for s in self.output_specs if s.kind is OutputKind.BUFFER_MUTATION}

    @property
    def user_inputs_to_mutate(self) -> dict:
        return {s.arg.name: s.target for s in self.output_specs if s.kind is OutputKind.USER_INPUT_MUTATION}

    def __str__(self) -> str:
        ins = "\n".join(str(s) for s in self.input_specs)
        outs = "\n".join(str(s) for s in self.output_specs)
        return f"\n# inputs\n{ins}\n\n# outputs\n{outs}\n"
