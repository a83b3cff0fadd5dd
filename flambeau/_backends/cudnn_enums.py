"""cuDNN's enum values by name, for the ctypes calls in `cudnn.py`.

One `IntEnum` per cuDNN enum family, named after its C type without the `cudnn` prefix and `_t`
suffix (`cudnnBackendAttributeName_t` -> `BackendAttributeName`), each member after its C name
without the family prefix (`CUDNN_ATTR_TENSOR_DATA_TYPE` -> `TENSOR_DATA_TYPE`). Values are those of
cuDNN 9's public headers (`cudnn_graph.h`, `cudnn_ops.h`, `cudnn_cnn.h`; unchanged since 8 for the
members listed here, except `NumericalNote.TYPE_COUNT`, which 9.1 moved to 10). Only the members
flambeau uses are listed, plus their neighbours where that makes a numbering readable. They are
written here rather than taken from `nvidia-cudnn-frontend`, whose Python module binds the frontend's
graph objects, not the backend API's descriptor and attribute ids that these ctypes calls need.
"""
from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """cudnnStatus_t: what every cuDNN call returns."""
    SUCCESS = 0


class DataType(enum.IntEnum):
    """cudnnDataType_t."""
    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    BFLOAT16 = 9


class TensorFormat(enum.IntEnum):
    """cudnnTensorFormat_t (the legacy API's filter layout)."""
    NCHW = 0
    NHWC = 1


class ConvolutionMode(enum.IntEnum):
    """cudnnConvolutionMode_t: PyTorch's convolution is cuDNN's cross-correlation."""
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class MathType(enum.IntEnum):
    """cudnnMathType_t (the legacy API's tensor-core policy)."""
    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class Determinism(enum.IntEnum):
    """cudnnDeterminism_t, as the legacy API's algorithm reports give it."""
    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class BackendDescriptorType(enum.IntEnum):
    """cudnnBackendDescriptorType_t: what cudnnBackendCreateDescriptor makes."""
    POINTWISE_DESCRIPTOR = 0
    CONVOLUTION_DESCRIPTOR = 1
    ENGINE_DESCRIPTOR = 2
    ENGINECFG_DESCRIPTOR = 3
    ENGINEHEUR_DESCRIPTOR = 4
    EXECUTION_PLAN_DESCRIPTOR = 5
    OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
    OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
    OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
    OPERATIONGRAPH_DESCRIPTOR = 15
    VARIANT_PACK_DESCRIPTOR = 16
    TENSOR_DESCRIPTOR = 17


class BackendAttributeType(enum.IntEnum):
    """cudnnBackendAttributeType_t: the C type of the values handed to Set/GetAttribute."""
    HANDLE = 0
    DATA_TYPE = 1
    BOOLEAN = 2
    INT64 = 3
    FLOAT = 4
    DOUBLE = 5
    VOID_PTR = 6
    CONVOLUTION_MODE = 7
    HEUR_MODE = 8
    KNOB_TYPE = 9
    NAN_PROPOGATION = 10          # sic: cuDNN's spelling
    NUMERICAL_NOTE = 11
    LAYOUT_TYPE = 12
    ATTRIB_NAME = 13
    POINTWISE_MODE = 14
    BACKEND_DESCRIPTOR = 15


class BackendAttributeName(enum.IntEnum):
    """cudnnBackendAttributeName_t: attribute ids, numbered in blocks of 100 per descriptor type."""
    CONVOLUTION_COMP_TYPE = 100
    CONVOLUTION_CONV_MODE = 101
    CONVOLUTION_DILATIONS = 102
    CONVOLUTION_FILTER_STRIDES = 103
    CONVOLUTION_POST_PADDINGS = 104
    CONVOLUTION_PRE_PADDINGS = 105
    CONVOLUTION_SPATIAL_DIMS = 106
    ENGINEHEUR_MODE = 200
    ENGINEHEUR_OPERATION_GRAPH = 201
    ENGINEHEUR_RESULTS = 202
    ENGINECFG_ENGINE = 300
    EXECUTION_PLAN_HANDLE = 400
    EXECUTION_PLAN_ENGINE_CONFIG = 401
    EXECUTION_PLAN_WORKSPACE_SIZE = 402
    OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
    OPERATION_CONVOLUTION_FORWARD_BETA = 701
    OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
    OPERATION_CONVOLUTION_FORWARD_W = 703
    OPERATION_CONVOLUTION_FORWARD_X = 704
    OPERATION_CONVOLUTION_FORWARD_Y = 705
    OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
    OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
    OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
    OPERATION_CONVOLUTION_BWD_DATA_W = 709
    OPERATION_CONVOLUTION_BWD_DATA_DX = 710
    OPERATION_CONVOLUTION_BWD_DATA_DY = 711
    OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
    OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
    OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
    OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
    OPERATION_CONVOLUTION_BWD_FILTER_X = 716
    OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
    OPERATIONGRAPH_HANDLE = 800
    OPERATIONGRAPH_OPS = 801
    TENSOR_BYTE_ALIGNMENT = 900
    TENSOR_DATA_TYPE = 901
    TENSOR_DIMENSIONS = 902
    TENSOR_STRIDES = 903
    TENSOR_UNIQUE_ID = 906
    VARIANT_PACK_UNIQUE_IDS = 1000
    VARIANT_PACK_DATA_POINTERS = 1001
    VARIANT_PACK_INTERMEDIATES = 1002
    VARIANT_PACK_WORKSPACE = 1003
    ENGINE_NUMERICAL_NOTE = 1303


class NumericalNote(enum.IntEnum):
    """cudnnBackendNumericalNote_t: how an engine computes (read to honour allow_tf32/deterministic)."""
    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8
    STRICT_NAN_PROP = 9
    TYPE_COUNT = 10


class HeurMode(enum.IntEnum):
    """cudnnBackendHeurMode_t: which heuristic ranks the engine configurations."""
    INSTANT = 0
    B = 1
    FALLBACK = 2
    A = 3
