"""Generated code objects for graph breaks: the break code and resume functions.

At a graph break at instruction(s) I of frame code C, with a stack of S items (some NULL) and the
frame's locals:

* the *resume function* R_t(*locals, *stack) is C with a prologue that deletes the locals that
  were unbound, pushes the stack back (PUSH_NULL where NULLs were) and jumps to offset t. Its
  parameters are all of C's local names followed by `___stack<i>`; it is called (and itself
  captured, with its own cache) by:
* the *break code* B(*locals, *stack, *resume_fns): C with the same kind of prologue jumping to I,
  where I is followed by a jump to an epilogue that stores what I left on the stack and returns
  `resume_fn(*locals, *stack)`; a conditional jump I gets one epilogue per outcome. I runs in the
  real interpreter with C's exception table and line numbers, so errors and tracebacks are eager's.

C's cell variables become leading free variables of B and R: the frame's cells (real cells made for
the traced values) are handed over in the closure, so closures created before the break keep
sharing them. The original instructions are copied as a whole (jump targets are `Instr` objects and everything
is re-assembled), so loops, handlers and with-blocks around I keep working.
"""
from __future__ import annotations

import types
from inspect import CO_VARARGS, CO_VARKEYWORDS

from . import bytecode as bc
from .exc import Unsupported

_resume_codes: dict = {}


def _drop_null():
    return None


# how many stack items a breakable instruction consumes and produces: (pops, pushes_next, pushes_jump)
def break_effect(ins) -> tuple:
    op, arg = ins.opname, ins.arg
    if op == "CALL":
        return arg + 2, 1, None
    if op == "CALL_FUNCTION_EX":
        return 3 + bool(arg & bc.CALL_FUNCTION_EX_KWARGS), 1, None
    if op.startswith("POP_JUMP"):
        return 1, 0, 0
    if op in ("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"):
        return 1, 0, 1
    table = {"STORE_ATTR": (2, 0), "STORE_SUBSCR": (3, 0), "DELETE_SUBSCR": (2, 0), "BINARY_OP": (2, 1),
             "COMPARE_OP": (2, 1), "CONTAINS_OP": (2, 1), "IS_OP": (2, 1), "BINARY_SUBSCR": (2, 1),
             "UNARY_NEGATIVE": (1, 1), "UNARY_POSITIVE": (1, 1), "UNARY_INVERT": (1, 1), "UNARY_NOT": (1, 1),
             "GET_ITER": (1, 1), "STORE_GLOBAL": (1, 0), "BUILD_STRING": (arg or 0, 1),
             "FORMAT_VALUE": (2 if (arg or 0) & bc.FVS_HAVE_SPEC else 1, 1), "BEFORE_WITH": (1, 2),
             "UNPACK_SEQUENCE": (1, arg or 0), "LIST_TO_TUPLE": (1, 1), "BINARY_SLICE": (3, 1),
             "STORE_SLICE": (4, 0), "RAISE_VARARGS": (arg or 0, None)}
    if op == "LOAD_ATTR" and not (bc.PY312 and arg & bc.LOAD_PUSHES_NULL):
        return 1, 1, None
    if op == "UNPACK_EX":
        return 1, (arg & 0xFF) + (arg >> 8) + 1, None
    if op in table:
        pops, pushes = table[op]
        return pops, pushes, None
    raise Unsupported(f"graph break at {op} is not supported")


def successors(instrs, end: int) -> list:
    """[(kind, target Instr, stack pushes)] for the ways execution leaves instruction `end`."""
    ins = instrs[end]
    pops, p_next, p_jump = break_effect(ins)
    out = []
    if p_next is not None and ins.opname not in bc.UNCONDITIONAL_JUMPS:
        out.append(("next", instrs[end + 1], pops, p_next))
    if ins.target is not None and p_jump is not None:
        out.append(("jump", ins.target, pops, p_jump))
    return out


def _fresh(prefix: str, count: int, taken: list) -> list:
    """`count` names `<prefix><i>` that are not in `taken` (resume functions of resume functions)."""
    out, i = [], 0
    used = set(taken)
    while len(out) < count:
        name = f"{prefix}{i}"
        if name not in used:
            out.append(name)
            used.add(name)
        i += 1
    return out


def _localsplus_shift(instrs, n_orig: int, shift: int) -> None:
    if not shift:
        return
    for i in instrs:
        if i.opcode in bc.HASFREE and i.arg is not None and i.arg >= n_orig:
            i.arg += shift


def _prologue(code, varnames_all: list, unbound: set, layout: list, stack_names: list, target) -> list:
    P = bc.make
    out = bc.prologue_head(code)
    for name in unbound:
        out.append(P("DELETE_FAST", varnames_all.index(name), name))
    k = 0
    for is_null in layout:
        if is_null:
            out.append(P("PUSH_NULL"))
        else:
            out.append(bc.load_fast(varnames_all.index(stack_names[k]), stack_names[k]))
            k += 1
    out.append(P("JUMP_FORWARD", 0, target=target))
    return out


def _flags(code) -> int:
    return code.co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)


def _cells_as_freevars(code) -> dict:
    """`replace` fields turning the cell variables of `code` into leading free variables: a generated
    code object receives the frame's cells through its closure (their slots keep their numbers)."""
    if not code.co_cellvars:
        return {}
    return dict(co_cellvars=(), co_freevars=tuple(code.co_cellvars) + tuple(code.co_freevars))


def resume_code(code, target_offset: int, layout: tuple, unbound: frozenset) -> types.CodeType:
    """R_t: the code of `code` continuing at `target_offset` (see module docstring); cached."""
    key = (code, target_offset, layout, unbound)
    hit = _resume_codes.get(key)
    if hit is not None:
        return hit
    dec = bc.decode(code)
    n = code.co_nlocals
    orig = list(code.co_varnames)
    stack_names = _fresh("___stack", sum(1 for x in layout if not x), orig)
    varnames = orig + stack_names
    _localsplus_shift(dec.instrs, n, len(stack_names))
    target = dec.by_offset[target_offset]
    pro = _prologue(code, varnames, set(unbound), list(layout), stack_names, target)
    line = target.positions.lineno if target.positions is not None and target.positions.lineno else code.co_firstlineno
    base = code.co_name
    if base.startswith("flambeau_resume_in_"):
        base = base[len("flambeau_resume_in_"):].rsplit("_at_", 1)[0]
    name = f"flambeau_resume_in_{base}_at_{line}"
    new = bc.assemble(pro + dec.instrs, dec.exc, code, co_varnames=tuple(varnames), co_argcount=len(varnames),
                      co_posonlyargcount=0, co_kwonlyargcount=0, co_nlocals=len(varnames), co_flags=_flags(code),
                      co_name=name, co_qualname=name, co_stacksize=code.co_stacksize + len(layout) + 2,
                      **_cells_as_freevars(code))
    _resume_codes[key] = new
    return new


def break_code(code, start: int, end: int, layout: tuple, unbound: frozenset, bound_names: list):
    """B: runs instructions start..end of `code` for real, then hands over to a resume function.

    Returns (code object, [(kind, resume target offset, stack layout after)] per exit)."""
    dec = bc.decode(code)
    instrs = dec.instrs
    n = code.co_nlocals
    orig = list(code.co_varnames)
    exits = successors(instrs, end)
    k = sum(1 for x in layout if not x)
    stack_names = _fresh("___stack", k, orig)
    resume_names = _fresh("___resume", len(exits), orig)
    max_after = max([len(layout) - e[2] + e[3] for e in exits] + [0])
    tmp_names = _fresh("___tmp", max_after, orig)
    varnames = orig + stack_names + resume_names + tmp_names
    _localsplus_shift(instrs, n, len(varnames) - n)
    P = bc.make
    pos = instrs[end].positions
    pro = _prologue(code, varnames, set(unbound), list(layout), stack_names, instrs[start])
    body = list(instrs)
    epilogues, exit_info = [], []
    for j, (kind, target, pops, pushes) in enumerate(exits):
        after = list(layout[:len(layout) - pops]) + [False] * pushes
        epi = []
        t = 0
        names_top_down = []
        for is_null in reversed(after):
            if is_null:
                epi += [P("LOAD_CONST", _const_index(code, _drop_null), _drop_null, positions=None)]
                epi += bc.call_instrs(0) + [P("POP_TOP")]
            else:
                nm = tmp_names[t]
                t += 1
                epi.append(P("STORE_FAST", varnames.index(nm), nm))
                names_top_down.append(nm)
        epi.append(P("PUSH_NULL"))
        epi.append(bc.load_fast(varnames.index(resume_names[j]), resume_names[j]))
        for v in orig:
            if v in bound_names:
                epi.append(bc.load_fast(varnames.index(v), v))
            else:
                epi.append(P("LOAD_CONST", _const_index(code, None), None))
        for nm in reversed(names_top_down):
            epi.append(bc.load_fast(varnames.index(nm), nm))
        epi += bc.call_instrs(len(orig) + len(names_top_down), positions=pos)
        epi.append(P("RETURN_VALUE"))
        epilogues.append(epi)
        exit_info.append((kind, target.offset, tuple(after)))
        if kind == "next":
            body.insert(body.index(instrs[end]) + 1, P("JUMP_FORWARD", 0, target=epi[0]))
        else:
            instrs[end].target = epi[0]
    consts = tuple(_extra_consts(code))
    new = bc.assemble(pro + body + [i for e in epilogues for i in e], dec.exc, code,
                      co_varnames=tuple(varnames), co_argcount=n + k + len(exits), co_posonlyargcount=0,
                      co_kwonlyargcount=0, co_nlocals=len(varnames), co_flags=_flags(code), co_consts=consts,
                      co_stacksize=code.co_stacksize + len(layout) + len(orig) + max_after + 4,
                      **_cells_as_freevars(code))
    return new, exit_info


def _extra_consts(code) -> list:
    return list(code.co_consts) + [_drop_null, None]


def _const_index(code, value) -> int:
    base = len(code.co_consts)
    return base if value is _drop_null else base + 1
