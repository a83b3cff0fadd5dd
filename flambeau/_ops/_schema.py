"""Operator schemas in PyTorch's syntax: `add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`.

A parsed schema gives each argument's name, type, default and keyword-only flag, the returns
(with their names for named-tuple results), and the alias annotations that mark views
(`Tensor(a) self -> Tensor(a)`) and in-place mutation (`Tensor(a!) self`). `make_binder` turns it
into a generated Python function that normalises `(args, kwargs)` to one positional tuple at C speed.
"""
from __future__ import annotations

import ast
import collections
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Arg:
    name: str
    type: str            # e.g. 'Tensor', 'Tensor?', 'Tensor[]', 'int[]', 'Scalar'
    default: object      # _NODEFAULT when required
    kwarg_only: bool
    alias: str | None    # 'a' or 'a!' or None

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor") and "[" not in self.type

    @property
    def is_tensor_list(self) -> bool:
        return self.type.startswith("Tensor") and "[" in self.type

    @property
    def mutated(self) -> bool:
        return bool(self.alias and self.alias.endswith("!"))


class _NoDefault:
    def __repr__(self):
        return "<required>"


_NODEFAULT = _NoDefault()

_ARG_RE = re.compile(r"^(?P<type>[A-Za-z]+(?:\[\d*\])?)(?:\((?P<alias>[a-z]\d*!?)\))?(?P<opt>\??)(?P<list>(?:\[\d*\])?\??)\s+(?P<name>\w+)(?:=(?P<default>.+))?$")


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _parse_default(text: str):
    text = text.strip()
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    if text.startswith('"') or text.startswith("'"):
        return ast.literal_eval(text)
    if text.startswith("["):
        v = ast.literal_eval(text)
        return tuple(v)
    if text in ("contiguous_format", "long", "float"):
        return text
    try:
        return ast.literal_eval(text)
    except Exception:
        return text


@dataclass
class Schema:
    name: str
    overload: str
    args: list
    returns: list          # list of (type, name or None, alias)
    text: str

    @property
    def is_view(self) -> bool:
        return any(r[2] and not r[2].endswith("!") for r in self.returns) and not self.is_inplace

    @property
    def is_inplace(self) -> bool:
        return bool(self.args) and self.args[0].mutated

    def arg(self, name: str) -> Arg:
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    def __str__(self):
        return self.text


def parse(text: str) -> Schema:
    m = re.match(r"^([\w.]+)\((.*)\)\s*->\s*(.+)$", text.strip())
    if not m:
        raise ValueError(f"bad schema: {text}")
    full, argtext, rettext = m.groups()
    name, _, overload = full.partition(".")
    args, kw = [], False
    for part in _split_top(argtext):
        if part == "*":
            kw = True
            continue
        am = _ARG_RE.match(part)
        if not am:
            raise ValueError(f"bad argument '{part}' in schema {text}")
        typ = am["type"] + am["opt"] + (am["list"] or "")
        default = _parse_default(am["default"]) if am["default"] is not None else _NODEFAULT
        args.append(Arg(am["name"], typ, default, kw, am["alias"]))
    rettext = rettext.strip()
    if rettext.startswith("("):
        rettext = rettext[1:-1]
    returns = []
    for r in _split_top(rettext):
        if not r:
            continue
        rm = re.match(r"^([A-Za-z]+(?:\[\])?)(?:\(([a-z]\d*!?)\))?(?:\[\])?(?:\s+(\w+))?$", r)
        if not rm:
            raise ValueError(f"bad return '{r}' in schema {text}")
        returns.append((rm[1] + ("[]" if r.split(" ")[0].endswith(")[]") else ""), rm[3], rm[2]))
    return Schema(name, overload, args, returns, text.strip())


def make_binder(schema: Schema, qualname: str):
    """A function with the schema's Python signature that returns all arguments positionally."""
    params, seen_kw = [], False
    env = {}
    for i, a in enumerate(schema.args):
        if a.kwarg_only and not seen_kw:
            params.append("*")
            seen_kw = True
        if a.default is _NODEFAULT:
            params.append(a.name)
        else:
            env[f"_d{i}"] = a.default
            params.append(f"{a.name}=_d{i}")
    names = ", ".join(a.name for a in schema.args)
    src = f"def {qualname}({', '.join(params)}):\n    return ({names}{',' if len(schema.args) == 1 else ''})\n"
    exec(src, env)
    return env[qualname]


_return_types: dict = {}


def return_type(schema: Schema):
    """A named tuple class for multi-output ops, like `torch.return_types.max`."""
    names = [r[1] for r in schema.returns]
    if len(names) < 2 or not all(names):
        return None
    key = (schema.name, tuple(names))
    if key not in _return_types:
        cls = collections.namedtuple(schema.name, names)
        cls.__module__ = "torch.return_types"
        _return_types[key] = cls
    return _return_types[key]
