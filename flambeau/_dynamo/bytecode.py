"""Bytecode as editable instruction lists, and back: the one module that knows CPython's encoding.

`decode(code)` turns a code object into `Instr`s whose jumps point at other `Instr`s (not
offsets), with the exception table as `ExcEntry`s over instruction ranges; `assemble(...)` lays
them out again (EXTENDED_ARG prefixes, inline CACHE slots, relative jump arguments, the location
table and the exception table) and returns a new code object via `CodeType.replace`. Everything
that differs between CPython 3.11 and 3.12 (jump direction encoding, NULL-pushing flags of
LOAD_GLOBAL/LOAD_ATTR, the call sequence, FOR_ITER's exit) is answered here so the translator can
stay version-agnostic.
"""
from __future__ import annotations

import dis
import opcode
import sys
import types
from dataclasses import dataclass, field

PY312 = sys.version_info >= (3, 12)
if sys.version_info < (3, 11) or sys.version_info >= (3, 13):
    SUPPORTED = False
else:
    SUPPORTED = True

_CACHES = opcode._inline_cache_entries
OP = opcode.opmap
EXTENDED_ARG = OP["EXTENDED_ARG"]
HASJREL = set(dis.hasjrel)
HASFREE = set(dis.hasfree)
BACKWARD_JUMPS = {"JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "POP_JUMP_BACKWARD_IF_NOT_NONE",
                  "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE"}
UNCONDITIONAL_JUMPS = {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"}
TERMINATORS = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"} | UNCONDITIONAL_JUMPS

# Oparg bits of MAKE_FUNCTION: which optional values sit on the stack (dis.MAKE_FUNCTION_FLAGS order).
MAKE_FUNCTION_DEFAULTS, MAKE_FUNCTION_KWDEFAULTS, MAKE_FUNCTION_ANNOTATIONS, MAKE_FUNCTION_CLOSURE = 0x01, 0x02, 0x04, 0x08
# Oparg of FORMAT_VALUE (CPython's ceval names): low bits pick the conversion (none, str, repr,
# ascii: dis.FORMAT_VALUE_CONVERTERS order); FVS_HAVE_SPEC says a format spec is on the stack.
FVC_MASK, FVS_HAVE_SPEC = 0x03, 0x04
# Low oparg bit of CALL_FUNCTION_EX: a kwargs mapping is on the stack; of LOAD_GLOBAL (and of
# LOAD_ATTR on 3.12): a NULL (or the method's self) is pushed for a following call.
CALL_FUNCTION_EX_KWARGS = LOAD_PUSHES_NULL = 0x01

# Location table (Objects/locations.md): an entry's first byte has the start bit, a 4-bit code and
# the unit count - 1; varints carry 6 bits a byte with a continuation bit.
_LOC_ENTRY_START, _VARINT_MORE, _VARINT_BITS = 0x80, 0x40, 6
_LOC_NO_COLUMNS, _LOC_LONG, _LOC_NONE = 13, 14, 15
# Exception table entries start with the same start bit on their first varint.
_EXC_ENTRY_START = 0x80


@dataclass(eq=False)
class Instr:
    """One instruction; `target` is the Instr a jump goes to (None for other instructions)."""
    opname: str
    arg: int | None = None
    argval: object = None
    target: "Instr | None" = None
    positions: object = None          # dis.Positions or None
    offset: int | None = None         # offset in the code it was decoded from

    @property
    def opcode(self) -> int:
        return OP[self.opname]

    def __repr__(self) -> str:
        return f"Instr({self.opname}, {self.arg}, {self.argval!r}@{self.offset})"


@dataclass(eq=False)
class ExcEntry:
    start: Instr
    end: Instr                        # inclusive
    target: Instr
    depth: int
    lasti: bool


@dataclass
class Decoded:
    instrs: list
    exc: list = field(default_factory=list)
    by_offset: dict = field(default_factory=dict)


def cache_count(opname: str) -> int:
    return _CACHES[OP[opname]]


def decode(code: types.CodeType) -> Decoded:
    """The instructions of `code` (EXTENDED_ARG folded into arguments)."""
    instrs, by_offset = [], {}
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":
            continue
        i = Instr(ins.opname, ins.arg, ins.argval, None, ins.positions, ins.offset)
        instrs.append(i)
        by_offset[ins.offset] = i
    for i in instrs:
        if i.opcode in HASJREL:
            i.target = _at_or_after(by_offset, i.argval)
    exc = []
    for e in dis._parse_exception_table(code):
        inside = [i for i in instrs if e.start <= i.offset < e.end]
        if inside:
            exc.append(ExcEntry(inside[0], inside[-1], _at_or_after(by_offset, e.target), e.depth, e.lasti))
    return Decoded(instrs, exc, by_offset)


def _at_or_after(by_offset: dict, off: int) -> Instr:
    while off not in by_offset:       # an offset may name the EXTENDED_ARG before an instruction
        off += 2
    return by_offset[off]


def jump_exit_index(instrs: list, index_of: dict, ins: Instr) -> int:
    """Where execution continues when FOR_ITER is exhausted (3.12 skips the END_FOR it targets)."""
    k = index_of[id(ins.target)]
    if PY312 and instrs[k].opname == "END_FOR":
        k += 1
    return k


# ---- assembling ---------------------------------------------------------------------------------
def _ext_count(arg: int) -> int:
    n = 0
    while arg > 0xFF:
        arg >>= 8
        n += 1
    return n


def _jump_arg(ins: Instr, off_after: int, target_off: int) -> int:
    units = (target_off - off_after) // 2
    if ins.opname in BACKWARD_JUMPS:
        units = -units
    if units < 0:
        raise ValueError(f"bad jump direction for {ins.opname}")
    return units


def _layout(instrs: list):
    """Offsets (in bytes) of each instruction's first code unit, EXTENDED_ARGs included."""
    sizes = [1 + _ext_count(i.arg or 0) for i in instrs]
    while True:
        offs, pos = [], 0
        for i, s in zip(instrs, sizes):
            offs.append(pos)
            pos += 2 * (s + cache_count(i.opname))
        changed = False
        index = {id(i): k for k, i in enumerate(instrs)}
        for k, i in enumerate(instrs):
            if i.target is not None:
                after = offs[k] + 2 * (sizes[k] + cache_count(i.opname))
                i.arg = _jump_arg(i, after, offs[index[id(i.target)]])
                need = 1 + _ext_count(i.arg)
                if need > sizes[k]:
                    sizes[k] = need
                    changed = True
        if not changed:
            return offs, sizes, pos


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 1 << _VARINT_BITS:
        out.append(_VARINT_MORE | (v & ((1 << _VARINT_BITS) - 1)))
        v >>= _VARINT_BITS
    out.append(v)
    return bytes(out)


def _svarint(v: int) -> bytes:
    return _varint((-v << 1) | 1 if v < 0 else v << 1)


def _linetable(instrs: list, sizes: list, firstlineno: int) -> bytes:
    out = bytearray()
    line = firstlineno
    for i, s in zip(instrs, sizes):
        units = s + cache_count(i.opname)
        p = i.positions
        while units:
            n = min(units, 8)
            units -= n
            if p is None or p.lineno is None:
                out.append(_LOC_ENTRY_START | (_LOC_NONE << 3) | (n - 1))
            elif p.col_offset is None or p.end_col_offset is None or p.end_lineno is None:
                out.append(_LOC_ENTRY_START | (_LOC_NO_COLUMNS << 3) | (n - 1))
                out += _svarint(p.lineno - line)
                line = p.lineno
            else:
                out.append(_LOC_ENTRY_START | (_LOC_LONG << 3) | (n - 1))
                out += _svarint(p.lineno - line)
                out += _varint(p.end_lineno - p.lineno)
                out += _varint(p.col_offset + 1)
                out += _varint(p.end_col_offset + 1)
                line = p.lineno
    return bytes(out)


def _exc_varint(v: int, first: bool) -> bytes:
    chunks = []
    while True:
        chunks.append(v & ((1 << _VARINT_BITS) - 1))
        v >>= _VARINT_BITS
        if not v:
            break
    chunks.reverse()
    out = bytearray()
    for k, c in enumerate(chunks):
        b = c | (_VARINT_MORE if k < len(chunks) - 1 else 0)
        if k == 0 and first:
            b |= _EXC_ENTRY_START
        out.append(b)
    return bytes(out)


def _exctable(exc: list, index: dict, offs: list, sizes: list, instrs: list) -> bytes:
    out = bytearray()
    for e in exc:
        ks, ke = index[id(e.start)], index[id(e.end)]
        start = offs[ks]
        end = offs[ke] + 2 * (sizes[ke] + cache_count(instrs[ke].opname))
        out += _exc_varint(start // 2, True)
        out += _exc_varint((end - start) // 2, False)
        out += _exc_varint(offs[index[id(e.target)]] // 2, False)
        out += _exc_varint((e.depth << 1) | int(e.lasti), False)
    return bytes(out)


def assemble(instrs: list, exc: list, base: types.CodeType, **replace) -> types.CodeType:
    """A code object running `instrs` (other fields from `base`, overridden by `replace`; pass
    `co_stacksize` when the new code needs a deeper stack)."""
    offs, sizes, total = _layout(instrs)
    index = {id(i): k for k, i in enumerate(instrs)}
    code = bytearray()
    for i, s in zip(instrs, sizes):
        arg = i.arg or 0
        for k in range(s - 1, 0, -1):
            code += bytes((EXTENDED_ARG, (arg >> (8 * k)) & 0xFF))
        code += bytes((i.opcode, arg & 0xFF))
        code += b"\x00\x00" * cache_count(i.opname)
    fields = dict(co_code=bytes(code),
                  co_linetable=_linetable(instrs, sizes, replace.get("co_firstlineno", base.co_firstlineno)),
                  co_exceptiontable=_exctable(exc, index, offs, sizes, instrs))
    fields.update(replace)
    return base.replace(**fields)


# ---- version-specific instruction builders ----------------------------------------------------
def make(opname: str, arg: int | None = None, argval=None, target=None, positions=None) -> Instr:
    return Instr(opname, arg, argval, target, positions)


def call_instrs(nargs: int, positions=None) -> list:
    """Call the callable under `nargs` arguments (stack: NULL, callable, args...)."""
    seq = [] if PY312 else [make("PRECALL", nargs, positions=positions)]
    return seq + [make("CALL", nargs, positions=positions)]


def load_global_pushes_null(ins: Instr) -> bool:
    return bool(ins.arg & LOAD_PUSHES_NULL)


def load_global_name(ins: Instr) -> str:
    return ins.argval


def prologue_head(code: types.CodeType) -> list:
    """The frame set-up instructions a generated code object starts with."""
    out = []
    n = len(code.co_freevars) + len(code.co_cellvars)      # generated code takes cells as free variables
    if n:
        out.append(make("COPY_FREE_VARS", n))
    out.append(make("RESUME", 0))
    return out


def load_fast(i: int, name: str) -> Instr:
    return make("LOAD_FAST", i, name)
