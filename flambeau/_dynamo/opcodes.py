"""The opcode handlers of the symbolic evaluator, one per opcode name (3.11 and 3.12 names side by side).

`DISPATCH[opname](tx, ins)` updates the translator `tx` (its stack, locals, cells) for instruction
`ins`; tensor work goes through `tx.output`, calls through `tx.call`. A handler that cannot model
an instruction raises `Unsupported` (the translator turns that into a graph break).
"""
from __future__ import annotations

import operator
import sys
import types

from . import bytecode as bc
from .exc import Unsupported
from .guards import ClosureSource
from .variables import (NULL, ConstantVariable, TupleVariable, ListVariable, DictVariable, SetVariable,
                        SliceVariable, ListIteratorVariable, TensorVariable, NestedUserFunctionVariable,
                        CellVariable, RealCellVariable, GradModeVariable, build, wrap_constant_like, const)
from .variables.base import VariableTracker, is_constant_value
from .variables.builtin import binary_op, unary_op, getitem, contains, identical
from .variables.objects import PythonModuleVariable
from .variables.torch import AutocastVariable
from .variables.containers import dict_key

_BINARY = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul, operator.mul,
           operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub, operator.truediv,
           operator.xor, operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
           operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
           operator.itruediv, operator.ixor]
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
            ">=": operator.ge}
DISPATCH: dict = {}


def handler(*names):
    def deco(fn):
        for n in names:
            DISPATCH[n] = fn
        return fn
    return deco




class _Return(Exception):
    """Raised by RETURN_VALUE to end the translator's loop."""


class LazyLocal(VariableTracker):
    """An argument of the root frame not read yet: built (and guarded) on first use; at a graph
    break it is passed on through its source, without guards."""

    def __init__(self, value, source):
        self.value = value
        self.source = source

    def reconstruct(self, cg):
        return self.source.expr


def _local(tx, name):
    v = tx.locals[name]
    if isinstance(v, LazyLocal):
        v = tx.locals[name] = build(tx, v.value, v.source)
    return v


@handler("NOP", "RESUME", "CACHE", "EXTENDED_ARG")
def _nop(tx, ins):
    pass


@handler("POP_TOP")
def _pop_top(tx, ins):
    tx.pop()


@handler("PUSH_NULL")
def _push_null(tx, ins):
    tx.push(NULL)


@handler("COPY")
def _copy(tx, ins):
    tx.push(tx.stack[-ins.arg])


@handler("SWAP")
def _swap(tx, ins):
    s = tx.stack
    s[-1], s[-ins.arg] = s[-ins.arg], s[-1]


@handler("LOAD_CONST")
def _load_const(tx, ins):
    v = ins.argval
    tx.push(ConstantVariable(v) if isinstance(v, types.CodeType) else wrap_constant_like(v))


@handler("RETURN_CONST")
def _return_const(tx, ins):
    tx.push(wrap_constant_like(ins.argval))
    _return_value(tx, ins)


@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(tx, ins):
    if ins.argval not in tx.locals:
        raise Unsupported(f"UnboundLocalError: {ins.argval!r} referenced before assignment")
    tx.push(_local(tx, ins.argval))


@handler("LOAD_FAST_AND_CLEAR")
def _load_fast_and_clear(tx, ins):
    tx.push(_local(tx, ins.argval) if ins.argval in tx.locals else NULL)
    tx.locals.pop(ins.argval, None)


@handler("STORE_FAST")
def _store_fast(tx, ins):
    v = tx.pop()
    if v is NULL:
        tx.locals.pop(ins.argval, None)
    else:
        tx.locals[ins.argval] = v


@handler("DELETE_FAST")
def _delete_fast(tx, ins):
    if ins.argval not in tx.locals:
        raise Unsupported(f"UnboundLocalError: {ins.argval!r}")
    del tx.locals[ins.argval]


@handler("MAKE_CELL")
def _make_cell(tx, ins):
    name = ins.argval
    tx.cells[name] = CellVariable(_local(tx, name) if name in tx.locals else None)
    tx.locals.pop(name, None)


@handler("COPY_FREE_VARS")
def _copy_free_vars(tx, ins):
    names = tx.code.co_freevars
    if tx.closure is not None:
        for name, c in zip(names, tx.closure):
            tx.cells[name] = c
        return
    closure = tx.fn.__closure__ or ()
    for i, (name, c) in enumerate(zip(names, closure)):
        tx.cells[name] = RealCellVariable(c, ClosureSource(i, name), f"F.__closure__[{i}]")


@handler("LOAD_CLOSURE")
def _load_closure(tx, ins):
    tx.push(tx.cells[ins.argval])


@handler("LOAD_DEREF")
def _load_deref(tx, ins):
    c = tx.cells.get(ins.argval)
    if isinstance(c, CellVariable):
        if c.value is None:
            raise Unsupported(f"NameError: free variable {ins.argval!r} referenced before assignment")
        tx.push(c.value)
    elif isinstance(c, RealCellVariable):
        pending = tx.output.side_effects.pending_cell(c)
        if pending is not None:
            tx.push(pending)
            return
        try:
            value = c.cell.cell_contents
        except ValueError:
            raise Unsupported(f"NameError: free variable {ins.argval!r} referenced before assignment")
        tx.push(build(tx, value, c.source) if c.source is not None else _sourceless(value))
    else:
        raise Unsupported(f"LOAD_DEREF {ins.argval}")


def _sourceless(value):
    if is_constant_value(value) or isinstance(value, (types.FunctionType, type, types.ModuleType)):
        return wrap_constant_like(value)
    raise Unsupported("closure variable of a function reached without a source")


@handler("STORE_DEREF")
def _store_deref(tx, ins):
    v = tx.pop()
    c = tx.cells.get(ins.argval)
    if isinstance(c, CellVariable):
        c.value = v
    elif isinstance(c, RealCellVariable) and c.source is not None:
        tx.output.side_effects.store_cell(c, v)
    else:
        raise Unsupported(f"STORE_DEREF {ins.argval}")


@handler("LOAD_GLOBAL")
def _load_global(tx, ins):
    if bc.load_global_pushes_null(ins):
        tx.push(NULL)
    tx.push(tx.load_global(ins.argval))


@handler("STORE_GLOBAL")
def _store_global(tx, ins):
    tx.output.side_effects.store_global(tx.f_globals, ins.argval, tx.pop())


@handler("LOAD_ATTR")
def _load_attr(tx, ins):
    obj = tx.pop()
    if bc.PY312 and ins.arg & bc.LOAD_PUSHES_NULL:
        tx.push(NULL)
    tx.push(obj.var_getattr(tx, ins.argval))


@handler("LOAD_SUPER_ATTR")
def _load_super_attr(tx, ins):
    """Python 3.12's `super().name` / `super(cls, obj).name` in one instruction: pops obj, cls and the
    global `super` (CPython calls it normally when that name is not the builtin); arg bit 0 asks for a
    method load (NULL, then the bound attribute), as LOAD_ATTR's."""
    obj, cls, sup = tx.pop(), tx.pop(), tx.pop()
    if getattr(sup, "value", None) is not super:
        raise Unsupported("LOAD_SUPER_ATTR: the global 'super' is not the builtin")
    attr = tx.make_super((cls, obj)).var_getattr(tx, ins.argval)
    if ins.arg & 1:
        tx.push(NULL)
    tx.push(attr)


@handler("LOAD_METHOD")
def _load_method(tx, ins):
    obj = tx.pop()
    tx.push(NULL)
    tx.push(obj.var_getattr(tx, ins.argval))


@handler("STORE_ATTR")
def _store_attr(tx, ins):
    obj = tx.pop()
    value = tx.pop()
    tx.store_attr(obj, ins.argval, value)


@handler("BINARY_OP")
def _binary_op(tx, ins):
    b = tx.pop()
    a = tx.pop()
    tx.push(binary_op(tx, _BINARY[ins.arg], a, b))


@handler("COMPARE_OP")
def _compare_op(tx, ins):
    b = tx.pop()
    a = tx.pop()
    tx.push(binary_op(tx, _COMPARE[ins.argval], a, b))


@handler("IS_OP")
def _is_op(tx, ins):
    b = tx.pop()
    a = tx.pop()
    if isinstance(a, (TensorVariable,)) != isinstance(b, (TensorVariable,)) and not (
            isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable)):
        raise Unsupported("`is` between a tensor and another object")
    r = identical(a, b)
    tx.push(const(r != bool(ins.arg)))


@handler("CONTAINS_OP")
def _contains_op(tx, ins):
    b = tx.pop()
    a = tx.pop()
    r = contains(tx, b, a)
    tx.push(const(r.as_python_constant() != bool(ins.arg)))


@handler("UNARY_NEGATIVE")
def _neg(tx, ins):
    tx.push(unary_op(tx, operator.neg, tx.pop()))


@handler("UNARY_POSITIVE")
def _pos(tx, ins):
    tx.push(unary_op(tx, operator.pos, tx.pop()))


@handler("UNARY_INVERT")
def _inv(tx, ins):
    tx.push(unary_op(tx, operator.invert, tx.pop()))


@handler("UNARY_NOT")
def _not(tx, ins):
    v = tx.stack[-1]
    r = const(not v.truthy(tx))
    tx.pop()
    tx.push(r)


@handler("CALL_INTRINSIC_1")
def _intrinsic(tx, ins):
    name = ins.argrepr if hasattr(ins, "argrepr") else ""
    if ins.arg == 5:
        tx.push(unary_op(tx, operator.pos, tx.pop()))
    elif ins.arg == 6:
        tx.push(TupleVariable(tx.pop().unpack_var_sequence(tx)))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {ins.arg} {name}")


@handler("BINARY_SUBSCR")
def _binary_subscr(tx, ins):
    k = tx.pop()
    obj = tx.pop()
    tx.push(getitem(tx, obj, k))


@handler("BINARY_SLICE")
def _binary_slice(tx, ins):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    tx.push(getitem(tx, obj, _slice([start, stop])))


def _slice(parts):
    if all(p.is_python_constant() for p in parts):
        return ConstantVariable(slice(*(p.as_python_constant() for p in parts)))
    return SliceVariable(parts)


@handler("STORE_SUBSCR")
def _store_subscr(tx, ins):
    k = tx.pop()
    obj = tx.pop()
    v = tx.pop()
    tx.store_subscr(obj, k, v)


@handler("STORE_SLICE")
def _store_slice(tx, ins):
    stop = tx.pop()
    start = tx.pop()
    obj = tx.pop()
    v = tx.pop()
    tx.store_subscr(obj, _slice([start, stop]), v)


@handler("DELETE_SUBSCR")
def _delete_subscr(tx, ins):
    k = tx.pop()
    obj = tx.pop()
    obj.call_method(tx, "__delitem__", [k], {})


@handler("BUILD_TUPLE")
def _build_tuple(tx, ins):
    tx.push(TupleVariable(tx.popn(ins.arg)))


@handler("BUILD_LIST")
def _build_list(tx, ins):
    tx.push(ListVariable(tx.popn(ins.arg)))


@handler("BUILD_SET")
def _build_set(tx, ins):
    tx.push(SetVariable(tx.popn(ins.arg)))


@handler("BUILD_MAP")
def _build_map(tx, ins):
    items = tx.popn(2 * ins.arg)
    tx.push(DictVariable({dict_key(items[i]): items[i + 1] for i in range(0, len(items), 2)}))


@handler("BUILD_CONST_KEY_MAP")
def _build_const_key_map(tx, ins):
    keys = tx.pop().as_python_constant()
    vals = tx.popn(ins.arg)
    tx.push(DictVariable(dict(zip(keys, vals))))


@handler("BUILD_SLICE")
def _build_slice(tx, ins):
    tx.push(_slice(tx.popn(ins.arg)))


@handler("BUILD_STRING")
def _build_string(tx, ins):
    parts = tx.popn(ins.arg)
    tx.push(const("".join(p.as_python_constant() for p in parts)))


@handler("FORMAT_VALUE")
def _format_value(tx, ins):
    spec = tx.pop().as_python_constant() if ins.arg & bc.FVS_HAVE_SPEC else ""
    v = tx.pop()
    if not v.is_python_constant():
        raise Unsupported(f"formatting {v} into a string")
    val = v.as_python_constant()
    conv = ins.arg & bc.FVC_MASK
    val = {0: val, 1: str(val), 2: repr(val), 3: ascii(val)}[conv] if conv else val
    tx.push(const(format(val, spec)))


@handler("LIST_APPEND")
def _list_append(tx, ins):
    v = tx.pop()
    tx.stack[-ins.arg].items.append(v)


@handler("SET_ADD")
def _set_add(tx, ins):
    v = tx.pop()
    tx.stack[-ins.arg].call_method(tx, "add", [v], {})


@handler("MAP_ADD")
def _map_add(tx, ins):
    v = tx.pop()
    k = tx.pop()
    tx.stack[-ins.arg].call_method(tx, "__setitem__", [k, v], {})


@handler("LIST_EXTEND")
def _list_extend(tx, ins):
    v = tx.pop()
    tx.stack[-ins.arg].items.extend(v.unpack_var_sequence(tx))


@handler("SET_UPDATE")
def _set_update(tx, ins):
    v = tx.pop()
    for x in v.unpack_var_sequence(tx):
        tx.stack[-ins.arg].call_method(tx, "add", [x], {})


@handler("DICT_UPDATE", "DICT_MERGE")
def _dict_update(tx, ins):
    v = tx.pop()
    d = tx.stack[-ins.arg]
    if not isinstance(v, DictVariable):
        raise Unsupported(f"** of {v}")
    if ins.opname == "DICT_MERGE" and set(d.items) & set(v.items):
        raise Unsupported("TypeError: got multiple values for keyword argument")
    d.items.update(v.items)


@handler("LIST_TO_TUPLE")
def _list_to_tuple(tx, ins):
    tx.push(TupleVariable(tx.pop().items))


@handler("UNPACK_SEQUENCE")
def _unpack_sequence(tx, ins):
    seq = tx.pop()
    if isinstance(seq, TensorVariable):
        items = seq.unpack_var_sequence(tx)
    elif seq.has_unpack_var_sequence(tx):
        items = seq.unpack_var_sequence(tx)
    else:
        raise Unsupported(f"unpacking {seq}")
    if len(items) != ins.arg:
        raise Unsupported(f"ValueError: unpacking {len(items)} values into {ins.arg}")
    for x in reversed(items):
        tx.push(x)


@handler("UNPACK_EX")
def _unpack_ex(tx, ins):
    seq = tx.pop()
    items = seq.unpack_var_sequence(tx)
    lo, hi = ins.arg & 0xFF, ins.arg >> 8
    if len(items) < lo + hi:
        raise Unsupported("ValueError: not enough values to unpack")
    mid = ListVariable(items[lo:len(items) - hi])
    out = items[:lo] + [mid] + items[len(items) - hi:]
    for x in reversed(out):
        tx.push(x)


@handler("GET_ITER")
def _get_iter(tx, ins):
    tx.push(tx.get_iter(tx.pop()))


@handler("FOR_ITER")
def _for_iter(tx, ins):
    it = tx.stack[-1]
    if not isinstance(it, ListIteratorVariable):
        raise Unsupported(f"for loop over {it}")
    try:
        tx.push(it.next(tx))
    except StopIteration:
        tx.pop()
        tx.ip = bc.jump_exit_index(tx.instrs, tx.index_of, ins)


@handler("END_FOR")
def _end_for(tx, ins):
    tx.popn(2)


@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def _jump(tx, ins):
    tx.jump(ins)


def _cond_jump(when: bool):
    def fn(tx, ins):
        v = tx.stack[-1]
        t = v.truthy(tx)
        tx.pop()
        if t == when:
            tx.jump(ins)
    return fn


def _none_jump(when: bool):
    def fn(tx, ins):
        v = tx.stack[-1]
        if isinstance(v, ConstantVariable):
            is_none = v.value is None
        elif v is NULL:
            raise Unsupported("NULL in a None test")
        else:
            is_none = False
        tx.pop()
        if is_none == when:
            tx.jump(ins)
    return fn


for _n in ("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_IF_TRUE"):
    DISPATCH[_n] = _cond_jump(True)
for _n in ("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_IF_FALSE"):
    DISPATCH[_n] = _cond_jump(False)
for _n in ("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_IF_NONE"):
    DISPATCH[_n] = _none_jump(True)
for _n in ("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", "POP_JUMP_IF_NOT_NONE"):
    DISPATCH[_n] = _none_jump(False)


def _or_pop(when: bool):
    def fn(tx, ins):
        t = tx.stack[-1].truthy(tx)
        if t == when:
            tx.jump(ins)
        else:
            tx.pop()
    return fn


DISPATCH["JUMP_IF_TRUE_OR_POP"] = _or_pop(True)
DISPATCH["JUMP_IF_FALSE_OR_POP"] = _or_pop(False)


@handler("RETURN_VALUE")
def _return_value(tx, ins):
    v = tx.pop()
    if tx.is_inlining:
        tx.return_value = v
        raise _Return()
    tx.output.compile_return(tx, v)
    raise _Return()


@handler("KW_NAMES")
def _kw_names(tx, ins):
    if tx.call_start is None:
        tx.call_start = tx.ip - 1
    tx.kw_names = ins.argval if isinstance(ins.argval, tuple) else tx.code.co_consts[ins.arg]


@handler("PRECALL")
def _precall(tx, ins):
    if tx.call_start is None:
        tx.call_start = tx.ip - 1


@handler("CALL")
def _call(tx, ins):
    if tx.call_start is None:
        tx.call_start = tx.ip - 1
    n = ins.arg
    args = tx.popn(n)
    kw = tx.kw_names or ()
    tx.kw_names = None
    b = tx.pop()
    a = tx.pop()
    if a is NULL:
        fn = b
    else:
        fn = a
        args = [b] + args
    kwargs = {}
    if kw:
        kwargs = dict(zip(kw, args[len(args) - len(kw):]))
        args = args[:len(args) - len(kw)]
    r = tx.call(fn, args, kwargs)
    tx.call_start = None
    tx.push(r)


@handler("CALL_FUNCTION_EX")
def _call_function_ex(tx, ins):
    kwargs = tx.pop() if ins.arg & bc.CALL_FUNCTION_EX_KWARGS else DictVariable({})
    args = tx.pop()
    fn = tx.pop()
    null = tx.pop()
    if null is not NULL:
        raise Unsupported("CALL_FUNCTION_EX without NULL")
    if not args.has_unpack_var_sequence(tx) or not isinstance(kwargs, DictVariable):
        raise Unsupported("*args/**kwargs that are not known sequences/dicts")
    r = tx.call(fn, args.unpack_var_sequence(tx), dict(kwargs.items))
    tx.call_start = None
    tx.push(r)


@handler("MAKE_FUNCTION")
def _make_function(tx, ins):
    code = tx.pop().as_python_constant()
    flags = ins.arg
    closure = tx.pop().items if flags & bc.MAKE_FUNCTION_CLOSURE else None
    annotations = tx.pop() if flags & bc.MAKE_FUNCTION_ANNOTATIONS else None
    kwdefaults = tx.pop() if flags & bc.MAKE_FUNCTION_KWDEFAULTS else None
    defaults = tx.pop() if flags & bc.MAKE_FUNCTION_DEFAULTS else None
    tx.push(NestedUserFunctionVariable(code, tx.f_globals, code.co_name, defaults, kwdefaults, closure, annotations))


@handler("BEFORE_WITH")
def _before_with(tx, ins):
    ctx = tx.stack[-1]
    if not isinstance(ctx, (GradModeVariable, AutocastVariable)):
        raise Unsupported(f"with-block over {ctx} (grad-mode and autocast context managers are captured)")
    tx.pop()
    tx.push(ctx.enter(tx))
    tx.push(const(None))


@handler("IMPORT_NAME")
def _import_name(tx, ins):
    fromlist = tx.pop().as_python_constant()
    level = tx.pop().as_python_constant()
    if level != 0 or ins.argval not in sys.modules:
        raise Unsupported(f"import of {ins.argval}")
    mod = sys.modules[ins.argval]
    if not fromlist:
        mod = sys.modules[ins.argval.split(".")[0]]
    tx.push(PythonModuleVariable(mod))


@handler("IMPORT_FROM")
def _import_from(tx, ins):
    tx.push(tx.stack[-1].var_getattr(tx, ins.argval))


@handler("RETURN_GENERATOR")
def _return_generator(tx, ins):
    if getattr(tx, "yields", None) is None:
        raise Unsupported("generator")
    tx.push(const(None))


@handler("YIELD_VALUE")
def _yield_value(tx, ins):
    if getattr(tx, "yields", None) is None:
        raise Unsupported("yield")
    tx.yields.append(tx.pop())
    tx.push(const(None))


@handler("LOAD_ASSERTION_ERROR")
def _load_assertion_error(tx, ins):
    raise Unsupported("assertion failed (AssertionError raised in traced code)")


@handler("RAISE_VARARGS")
def _raise(tx, ins):
    raise Unsupported("raise statement in traced code")
