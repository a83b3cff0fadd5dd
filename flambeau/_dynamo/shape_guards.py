"""Symbolic-shape guards (sympy relations over size symbols) printed as Python over input sizes."""
from __future__ import annotations

from ..fx._symbolic_shapes import _sp


def to_python(e, mapping: dict) -> str:
    """Python source for the sympy expression `e`, each symbol replaced by `mapping[symbol]`."""
    sp = _sp()
    if e is sp.true:
        return "True"
    if e is sp.false:
        return "False"
    if e.is_Symbol:
        if e not in mapping:
            raise NotImplementedError(f"symbol {e} has no source")
        return mapping[e]
    if e.is_Integer:
        return str(int(e))
    if e.is_Rational:
        return f"({int(e.p)} / {int(e.q)})"
    rels = {sp.Eq: "==", sp.Ne: "!=", sp.Lt: "<", sp.Le: "<=", sp.Gt: ">", sp.Ge: ">="}
    for k, op in rels.items():
        if type(e) is k:
            return f"({to_python(e.args[0], mapping)} {op} {to_python(e.args[1], mapping)})"
    if isinstance(e, sp.And):
        return "(" + " and ".join(to_python(a, mapping) for a in e.args) + ")"
    if isinstance(e, sp.Or):
        return "(" + " or ".join(to_python(a, mapping) for a in e.args) + ")"
    if isinstance(e, sp.Not):
        return f"(not {to_python(e.args[0], mapping)})"
    if e.is_Add:
        return "(" + " + ".join(to_python(a, mapping) for a in e.args) + ")"
    if e.is_Mul:
        num, den = sp.fraction(e)
        if den != 1:
            return f"({to_python(num, mapping)} / {to_python(den, mapping)})"
        return "(" + " * ".join(to_python(a, mapping) for a in e.args) + ")"
    if e.is_Pow and e.args[1].is_Integer:
        if e.args[1] < 0:
            return f"(1 / {to_python(e.args[0], mapping)} ** {int(-e.args[1])})"
        return f"({to_python(e.args[0], mapping)} ** {int(e.args[1])})"
    if isinstance(e, sp.floor):
        num, den = sp.fraction(sp.together(e.args[0]))      # floor(s/2 + 1/2): (s + 1) // 2
        if den != 1:
            return f"({to_python(num, mapping)} // {to_python(den, mapping)})"
        return to_python(e.args[0], mapping)
    if isinstance(e, sp.ceiling):
        num, den = sp.fraction(sp.together(e.args[0]))
        return f"(-((-{to_python(num, mapping)}) // {to_python(den, mapping)}))"
    if isinstance(e, sp.Mod):
        return f"({to_python(e.args[0], mapping)} % {to_python(e.args[1], mapping)})"
    if isinstance(e, (sp.Max, sp.Min)):
        fn = "max" if isinstance(e, sp.Max) else "min"
        return f"{fn}({', '.join(to_python(a, mapping) for a in e.args)})"
    raise NotImplementedError(type(e).__name__)
