"""cuDNN ids by name (flambeau._backends.cudnn_enums) without a GPU: a fake libcudnn records every call
that building graph-API and legacy plans makes, and the recorded descriptor types, attribute ids,
attribute types and enum arguments must be the integers cudnn.py passed before they had names
(cuDNN's headers give the same values). The GPU tests in test_cudnn.py run the real library."""
import ctypes
import sys
import types

import pytest

from flambeau._backends import cudnn

SHAPES = ((2, 4, 9, 8), (6, 4, 3, 3), (2, 6, 9, 8), (1, 1), (1, 1), (1, 1))
_NUMERICAL_NOTE_TYPE = 11
_CREATED = ("cudnnBackendCreateDescriptor", "cudnnCreateTensorDescriptor", "cudnnCreateFilterDescriptor",
            "cudnnCreateConvolutionDescriptor")


class _FakeCudnn:
    """Stands in for libcudnn: every call succeeds and is recorded with its integer arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("cudnn"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            if name in _CREATED:
                args[-1]._obj.value = len(self.calls)
            elif name == "cudnnBackendGetAttribute":      # one of everything, no numerical notes
                args[4]._obj.value = 0 if args[2] == _NUMERICAL_NOTE_TYPE else 1
            elif name.endswith("Algorithm_v7"):
                args[-2]._obj.value = 1
                perf = args[-1][0]
                perf.algo, perf.status, perf.memory, perf.determinism, perf.mathType = 1, 0, 0, 1, 0
            return 0
        return call


def _ints(values):
    return tuple(values) if isinstance(values, ctypes.Array) else values


def _trace(calls):
    """The calls reduced to what carries a cuDNN enum: descriptor types, (attribute, type) pairs with
    the enum-valued payloads, and the legacy calls' data type, layout, mode and math arguments."""
    out = []
    for name, a in calls:
        n = name[len("cudnn"):]
        if n == "BackendCreateDescriptor":
            out.append(("Create", a[0]))
        elif n == "BackendSetAttribute":
            out.append(("Set", a[1], a[2]) + ((_ints(a[4]),) if a[2] in (1, 7, 8) else ()))
        elif n == "BackendGetAttribute":
            out.append(("Get", a[1], a[2], a[3]))
        elif n == "SetTensorNdDescriptor":
            out.append((n, a[1]))
        elif n == "SetFilterNdDescriptor":
            out.append((n, a[1], a[2]))
        elif n == "SetConvolutionNdDescriptor":
            out.append((n, a[5], a[6]))
        elif n == "SetConvolutionMathType":
            out.append((n, a[1]))
        elif n.endswith("WorkspaceSize"):
            out.append((n, a[5]))
    return [tuple(int(v) if isinstance(v, int) else v for v in t) for t in out]


# What cudnn.py passed as bare integers. Operations: descriptor type, tensor attributes in the
# order set, conv-desc attribute, alpha, beta.
_OLD_OPS = {"forward": (10, (704, 703, 705), 702, 700, 701, "Forward"),
            "backward_data": (12, (709, 710, 711), 708, 706, 707, "BackwardData"),
            "backward_filter": (11, (716, 717, 715), 714, 712, 713, "BackwardFilter")}


def _old_trace(dtype, kind):
    dt = {"float32": 0, "float64": 1, "float16": 2}[dtype]
    compute = 1 if dtype == "float64" else 0
    scalar = 5 if dtype == "float64" else 4
    math = {"float32": 0, "float64": 0, "float16": 1}[dtype]
    op, tensor_attrs, conv_attr, alpha, beta, legacy = _OLD_OPS[kind]
    tensor = [("Create", 17), ("Set", 901, 1, (dt,)), ("Set", 902, 3), ("Set", 903, 3), ("Set", 906, 3),
              ("Set", 900, 3)]
    return (tensor * 3 + [("Create", 1), ("Set", 106, 3), ("Set", 100, 1, (compute,)), ("Set", 101, 7, (1,)),
                          ("Set", 102, 3), ("Set", 103, 3), ("Set", 104, 3), ("Set", 105, 3)]
            + [("Create", op)] + [("Set", a, 15) for a in tensor_attrs]
            + [("Set", conv_attr, 15), ("Set", alpha, scalar), ("Set", beta, scalar)]
            + [("Create", 15), ("Set", 801, 15), ("Set", 800, 0)]
            + [("Create", 4), ("Set", 201, 15), ("Set", 200, 8, (0,)), ("Get", 202, 15, 0), ("Create", 3),
               ("Get", 202, 15, 1), ("Create", 2), ("Get", 300, 15, 1), ("Get", 1303, 11, 10)]
            + [("Create", 5), ("Set", 400, 0), ("Set", 401, 15), ("Get", 402, 3, 1)]
            + [("Create", 16), ("Set", 1000, 3), ("Set", 1001, 6), ("Set", 1003, 6)]
            + [("SetTensorNdDescriptor", dt)] * 2
            + [("SetFilterNdDescriptor", dt, 0), ("SetConvolutionNdDescriptor", 1, compute),
               ("SetConvolutionMathType", math), ("SetConvolutionMathType", 0),
               (f"GetConvolution{legacy}WorkspaceSize", 1)])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("kind", ["forward", "backward_data", "backward_filter"])
def test_plans_pass_the_same_cudnn_ids_as_before(monkeypatch, dtype, kind):
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))   # the plan builders import it
    monkeypatch.setattr(cudnn, "_workspace_limit", lambda: 1 << 30)
    lib = _FakeCudnn()
    monkeypatch.setitem(cudnn._state, "lib", lib)
    monkeypatch.setattr(cudnn, "allow_tf32", True)
    monkeypatch.setattr(cudnn, "deterministic", False)
    h = ctypes.c_void_p(7)
    graph = cudnn._GraphPlan(*SHAPES, dtype, kind, h)
    graph._variant_pack((11, 12, 13, 14))
    legacy = cudnn._Plan(*SHAPES, 1, dtype, kind)
    assert legacy.choose(h)
    assert _trace(lib.calls) == _old_trace(dtype, kind)


def test_enum_members_used_keep_their_old_values():
    from flambeau._backends import cudnn_enums as E
    assert (E.Status.SUCCESS, E.Determinism.DETERMINISTIC, E.TensorFormat.NCHW) == (0, 1, 0)
    assert [E.MathType.DEFAULT_MATH, E.MathType.TENSOR_OP_MATH, E.MathType.FMA_MATH] == [0, 1, 3]
    assert [cudnn._DATA[k] for k in ("float32", "float64", "float16", "bfloat16")] == [0, 1, 2, 9]
    assert [E.NumericalNote.TENSOR_CORE, E.NumericalNote.DOWN_CONVERT_INPUTS, E.NumericalNote.NONDETERMINISTIC,
            E.NumericalNote.TYPE_COUNT] == [0, 1, 4, 10]
    assert cudnn.heuristic_modes == (0, 2)
