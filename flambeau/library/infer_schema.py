"""`infer_schema`: an operator schema from a Python function's type hints (PyTorch's
`torch.library.infer_schema`, same accepted types, same `ValueError`s).

`def f(x: Tensor, n: int, *, scale: float = 1.0) -> Tensor` gives
`(Tensor x, SymInt n, *, float scale=1.0) -> Tensor`; an argument named in `mutates_args` is
annotated `Tensor(a<i>!)` (i: its position), `mutates_args="unknown"` marks every Tensor argument.
"""
from __future__ import annotations

import collections.abc
import inspect
import typing
from types import GenericAlias
from typing import Callable

from .._device import device
from .._dtype import dtype
from .._tensor import Tensor

__all__ = ["infer_schema"]

UNKNOWN_MUTATES = "unknown"


def _sequences(t) -> tuple:
    return (typing.Sequence[t], typing.List[t], GenericAlias(collections.abc.Sequence, (t,)),  # noqa: UP006
            GenericAlias(list, (t,)))


def _derived(base, name: str, list_base: bool, optional_base_list: bool, optional_list_base: bool) -> list:
    """The annotations that spell `base` and its optional / list forms, with their schema types."""
    out = [(base, name), (typing.Optional[base], f"{name}?")]  # noqa: UP045
    if list_base:
        out += [(s, f"{name}[]") for s in _sequences(base)]
    if optional_base_list:
        out += [(s, f"{name}?[]") for s in _sequences(typing.Optional[base])]  # noqa: UP045
    if optional_list_base:
        out += [(typing.Optional[s], f"{name}[]?") for s in _sequences(base)]  # noqa: UP045
    return out


_NUMBER = typing.Union[int, float, bool]    # torch.types.Number
_PARAM_BASES = [(Tensor, "Tensor", True, True, False), (int, "SymInt", True, False, True),
                (float, "float", True, False, True), (bool, "bool", True, False, True),
                (str, "str", False, False, False), (_NUMBER, "Scalar", True, False, False),
                (dtype, "ScalarType", False, False, False), (device, "Device", False, False, False)]
SUPPORTED_PARAM_TYPES: dict = dict(x for b in _PARAM_BASES for x in _derived(*b))
SUPPORTED_RETURN_TYPES: dict = {Tensor: "Tensor", typing.List[Tensor]: "Tensor[]", list[Tensor]: "Tensor[]",  # noqa: UP006
                                int: "SymInt", float: "float", bool: "bool", _NUMBER: "Scalar"}


def _default_text(name: str, value, error_fn) -> str:
    if value is None or isinstance(value, (int, float, bool)):
        return str(value)
    if isinstance(value, (str, device)):
        return f'"{value}"'
    if isinstance(value, dtype):
        return str(value).split(".")[-1]
    error_fn(f"Parameter {name} has an unsupported default value type {type(value)}. "
             f"Please file an issue on GitHub so we can prioritize this.")


def infer_schema(prototype_function: Callable, /, *, mutates_args, op_name: str | None = None) -> str:
    """The schema of `prototype_function` from its type hints (see the module docstring)."""
    sig = inspect.signature(prototype_function)
    fn_globals = getattr(prototype_function, "__globals__", {})
    if type(mutates_args) is not str:
        mutates_args = tuple(mutates_args)

    def error_fn(what: str):
        raise ValueError(f"infer_schema(func): {what} Got func with signature {sig})")

    def resolve(ty):
        if isinstance(ty, str):
            try:
                return eval(ty, dict(fn_globals))   # a postponed annotation: its name in the function's module
            except Exception as e:
                error_fn(f"Unsupported type annotation {ty}. It is not a type. ({type(e).__name__}: {e})")
        origin = typing.get_origin(ty)
        if origin is not None and any(isinstance(a, str) for a in typing.get_args(ty)):
            return GenericAlias(origin, tuple(resolve(a) for a in typing.get_args(ty)))
        return ty

    params, seen = [], set()
    kw_only_seen = False
    for idx, (name, param) in enumerate(sig.parameters.items()):
        if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            error_fn("We do not support positional-only args, varargs, or varkwargs.")
        if param.kind == inspect.Parameter.KEYWORD_ONLY and not kw_only_seen:
            params.append("*")
            kw_only_seen = True
        if param.annotation is inspect.Parameter.empty:
            error_fn(f"Parameter {name} must have a type annotation.")
        ann = resolve(param.annotation)
        schema_type = SUPPORTED_PARAM_TYPES.get(ann)
        if schema_type is None:
            if typing.get_origin(ann) is tuple:
                as_list = _tuple_to_list(ann)
                example = f"For example, {as_list}.\n\n" if as_list in SUPPORTED_PARAM_TYPES else "\n\n"
                error_fn(f"Parameter {name} has unsupported type {param.annotation}. We do not support Tuple "
                         f"inputs in schema. As a workaround, please try to use List instead. {example}"
                         f"The valid types are: {SUPPORTED_PARAM_TYPES.keys()}.")
            error_fn(f"Parameter {name} has unsupported type {param.annotation}. "
                     f"The valid types are: {SUPPORTED_PARAM_TYPES.keys()}.")
        if type(mutates_args) is str:
            if mutates_args != UNKNOWN_MUTATES:
                raise ValueError("mutates_args must either be a sequence of the names of the arguments that are "
                                 "mutated or the string 'unknown'. ")
            if schema_type.startswith("Tensor"):
                schema_type = f"Tensor(a{idx}!){schema_type[len('Tensor'):]}"
        elif name in mutates_args:
            if not schema_type.startswith("Tensor"):
                error_fn(f"Parameter {name} is in mutable_args but only Tensors or collections of Tensors can be mutated")
            schema_type = f"Tensor(a{idx}!){schema_type[len('Tensor'):]}"
        seen.add(name)
        if param.default is inspect.Parameter.empty:
            params.append(f"{schema_type} {name}")
        else:
            params.append(f"{schema_type} {name}={_default_text(name, param.default, error_fn)}")
    if mutates_args != UNKNOWN_MUTATES:
        unseen = set(mutates_args) - seen
        if unseen:
            error_fn(f"{unseen} in mutates_args were not found in the custom op's signature. mutates_args should "
                     f"contain the names of all args that the custom op mutates, or just the string 'unknown' if "
                     f"you don't know.")
    ret = _parse_return(resolve(sig.return_annotation), error_fn)
    head = op_name if op_name is not None else ""
    return f"{head}({', '.join(params)}) -> {ret}"


def _tuple_to_list(tuple_type):
    """The list annotation PyTorch suggests for a tuple one (`Tuple[T, T]` -> `list[T]`)."""
    args = typing.get_args(tuple_type)
    if not args:
        return list
    if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
        return list[args[0]]
    return list[typing.Union[args]]


def _parse_return(annotation, error_fn) -> str:
    if annotation is None:
        return "()"
    if annotation is inspect.Parameter.empty:
        error_fn("No return type annotation was provided. Please add one.")
    if typing.get_origin(annotation) is not tuple:
        if annotation not in SUPPORTED_RETURN_TYPES:
            error_fn(f"Return has unsupported type {annotation}. The valid types are: {SUPPORTED_RETURN_TYPES}.")
        return SUPPORTED_RETURN_TYPES[annotation]
    args = typing.get_args(annotation)
    for a in args:
        if a not in SUPPORTED_RETURN_TYPES:
            error_fn(f"Return has unsupported type {annotation}. The valid types are: {SUPPORTED_RETURN_TYPES}.")
    text = ", ".join(SUPPORTED_RETURN_TYPES[a] for a in args)
    return f"(({text}))" if len(args) == 1 else f"({text})"
