"""Summary protocol buffers from flambeau tensors, NumPy arrays and numbers, as PyTorch writes them.

scalar (`simple_value`), histogram (NumPy's histogram trimmed to the populated bins, one empty bin
kept on the left because TensorBoard stores right edges only), image (HWC uint8, PNG through
Pillow; float images are scaled by 255), text (the text plugin's string tensor) and the hparams
plugin's three summaries (experiment, session start, session end).
"""
from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.hparams import api_pb2, metadata as hp_metadata, plugin_data_pb2
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData
from tensorboard.util.tensor_util import make_tensor_proto
from google.protobuf import struct_pb2

from ..._tensor import Tensor

try:
    from PIL import Image as _PILImage
except ImportError:              # images need Pillow, as in PyTorch; everything else works without
    _PILImage = None

TF_BUCKET_START, TF_BUCKET_END, TF_BUCKET_GROWTH = 1e-12, 1e20, 1.1   # TensorFlow's default histogram buckets
UINT8_SCALE = 255               # float images hold [0, 1]; uint8 images [0, 255]
GRID_COLUMNS = 8                # images per row when a batch is tiled into one picture


def make_np(x: Any) -> np.ndarray:
    """A NumPy array of a flambeau tensor, an array, or a Python/NumPy number."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy()
    if np.isscalar(x):
        return np.array([x])
    raise NotImplementedError(f"Got {type(x)}, but numpy array or torch tensor are expected.")


def tensorflow_bins() -> list[float]:
    """The bin edges of `bins="tensorflow"`: ±1e-12 growing by 10% up to 1e20, and 0."""
    pos = []
    v = TF_BUCKET_START
    while v < TF_BUCKET_END:
        pos.append(v)
        v *= TF_BUCKET_GROWTH
    return [-b for b in reversed(pos)] + [0] + pos


def scalar(name: str, value: Any, new_style: bool = False, double_precision: bool = False) -> Summary:
    arr = make_np(value).squeeze()
    if arr.ndim != 0:
        raise AssertionError(f"Tensor should contain one element (0 dimensions). Was given size: {arr.size} "
                             f"and {arr.ndim} dimensions.")
    v = float(arr)
    if not new_style:
        return Summary(value=[Summary.Value(tag=name, simple_value=v)])
    proto = TensorProto(double_val=[v], dtype="DT_DOUBLE") if double_precision else \
        TensorProto(float_val=[v], dtype="DT_FLOAT")
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    return Summary(value=[Summary.Value(tag=name, tensor=proto, metadata=meta)])


def _merge_bins(counts: np.ndarray, edges: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """At most about `max_bins` bins: runs of `len(counts) // max_bins` neighbours summed."""
    k = len(counts) // max_bins
    pad = (-len(counts)) % k
    counts = np.pad(counts, (0, pad)).reshape(-1, k).sum(axis=-1)
    return counts, np.concatenate([edges[:-1:k][:len(counts)], edges[-1:]])


def make_histogram(values: np.ndarray, bins: Any, max_bins: int | None = None) -> HistogramProto:
    if values.size == 0:
        raise ValueError("The input has no element.")
    values = values.reshape(-1)
    counts, edges = np.histogram(values, bins=bins)
    if max_bins is not None and len(counts) > max_bins:
        counts, edges = _merge_bins(counts, edges, max_bins)
    populated = np.flatnonzero(counts)
    if populated.size == 0:
        raise ValueError("The histogram is empty, please file a bug report.")
    first, last = int(populated[0]), int(populated[-1])
    return HistogramProto(min=values.min(), max=values.max(), num=len(values), sum=values.sum(),
                          sum_squares=values.dot(values), bucket_limit=edges[first:last + 2].tolist(),
                          bucket=[0] + counts[first:last + 1].tolist())


def histogram(name: str, values: Any, bins: Any, max_bins: int | None = None) -> Summary:
    hist = make_histogram(make_np(values).astype(float), bins, max_bins)
    return Summary(value=[Summary.Value(tag=name, histo=hist)])


def make_grid(images: np.ndarray, ncols: int = GRID_COLUMNS) -> np.ndarray:
    """NCHW images (1 or 3 channels) tiled row by row into one CHW picture."""
    if images.shape[1] == 1:
        images = np.concatenate([images] * 3, 1)
    if images.ndim != 4 or images.shape[1] != 3:
        raise AssertionError(f"make_grid: expected NCHW images with 1 or 3 channels, got shape {images.shape}")
    n, _, h, w = images.shape
    ncols = min(n, ncols)
    nrows = -(-n // ncols)
    canvas = np.zeros((3, h * nrows, w * ncols), dtype=images.dtype)
    for i in range(n):
        y, x = divmod(i, ncols)
        canvas[:, y * h:(y + 1) * h, x * w:(x + 1) * w] = images[i]
    return canvas


def convert_to_HWC(arr: np.ndarray, dataformats: str) -> np.ndarray:
    """An image array in layout `dataformats` (NCHW, CHW, HWC, HW, ... in any order) as HWC, 3 channels
    for gray ones; a batch becomes a grid."""
    if len(set(dataformats)) != len(dataformats):
        raise AssertionError(f"You can not use the same dimension shorthand twice. input_format: {dataformats}")
    if arr.ndim != len(dataformats):
        raise AssertionError(f"size of input tensor and input format are different. tensor shape: {arr.shape}, "
                             f"input_format: {dataformats}")
    fmt = dataformats.upper()
    if len(fmt) == 4:
        return make_grid(arr.transpose([fmt.find(c) for c in "NCHW"])).transpose(1, 2, 0)
    if len(fmt) == 3:
        hwc = arr.transpose([fmt.find(c) for c in "HWC"])
        return np.concatenate([hwc] * 3, 2) if hwc.shape[2] == 1 else hwc
    hw = arr.transpose([fmt.find(c) for c in "HW"])
    return np.stack([hw] * 3, 2)


def make_image(hwc: np.ndarray, rescale: float = 1) -> Summary.Image:
    if _PILImage is None:
        raise ModuleNotFoundError("No module named 'PIL'", name="PIL")
    height, width, channel = hwc.shape
    img = _PILImage.fromarray(hwc).resize((int(width * rescale), int(height * rescale)),
                                          _PILImage.Resampling.LANCZOS)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return Summary.Image(height=height, width=width, colorspace=channel, encoded_image_string=out.getvalue())


def image(tag: str, img: Any, rescale: float = 1, dataformats: str = "NCHW") -> Summary:
    arr = convert_to_HWC(make_np(img), dataformats)
    scale = 1 if arr.dtype == np.uint8 else UINT8_SCALE
    arr = (arr.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)
    return Summary(value=[Summary.Value(tag=tag, image=make_image(arr, rescale))])


def tensor(tag: str, value: Any) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, tensor=make_tensor_proto(make_np(value)))])


def figure_to_image(figure: Any, close: bool = True) -> np.ndarray:
    """A matplotlib figure rendered to an HWC uint8 RGB array (closed through pyplot if it is loaded)."""
    figure.canvas.draw()
    width, height = figure.canvas.get_width_height(physical=True)
    rgba = np.asarray(figure.canvas.buffer_rgba(), dtype=np.uint8).reshape(height, width, 4)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if close and pyplot is not None:
        pyplot.close(figure)
    return rgba[:, :, :3].copy()


def text(tag: str, text: str) -> Summary:
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
    proto = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf_8")],
                        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag + "/text_summary", metadata=meta, tensor=proto)])


def _hparams_summary(tag: str, **content) -> Summary:
    data = plugin_data_pb2.HParamsPluginData(version=hp_metadata.PLUGIN_DATA_VERSION, **content)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=hp_metadata.PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


# value type -> (the struct_pb2.Value field holding it, the hparams DataType); bools are ints here,
# as in PyTorch, so they are logged as numbers
_HPARAM_KINDS = ((int, "number_value", "DATA_TYPE_FLOAT64"), (float, "number_value", "DATA_TYPE_FLOAT64"),
                 (str, "string_value", "DATA_TYPE_STRING"))


def hparams(hparam_dict: dict, metric_dict: dict, hparam_domain_discrete: dict | None = None) -> tuple:
    """The hparams plugin's experiment, session-start and session-end summaries."""
    if not isinstance(hparam_dict, dict):
        raise TypeError("parameter: hparam_dict should be a dictionary, nothing logged.")
    if not isinstance(metric_dict, dict):
        raise TypeError("parameter: metric_dict should be a dictionary, nothing logged.")
    domains = hparam_domain_discrete or {}
    if not isinstance(domains, dict):
        raise TypeError("parameter: hparam_domain_discrete should be a dictionary, nothing logged.")
    for k, v in domains.items():
        if k not in hparam_dict or not isinstance(v, list) or not all(isinstance(d, type(hparam_dict[k])) for d in v):
            raise TypeError(f"parameter: hparam_domain_discrete[{k}] should be a list of same type as hparam_dict[{k}].")
    infos = []
    start = plugin_data_pb2.SessionStartInfo()
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if isinstance(v, Tensor):
            v = float(make_np(v).reshape(-1)[0])
        kind = next((kind for kind in _HPARAM_KINDS if isinstance(v, kind[0])), None)
        if kind is None:
            raise ValueError("value should be one of int, float, str, bool, or torch.Tensor")
        _, field, dtype = kind
        setattr(start.hparams[k], field, v)
        domain = struct_pb2.ListValue(values=[struct_pb2.Value(**{field: d}) for d in domains[k]]) \
            if k in domains else None
        infos.append(api_pb2.HParamInfo(name=k, type=api_pb2.DataType.Value(dtype), domain_discrete=domain))
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict]
    exp = _hparams_summary(hp_metadata.EXPERIMENT_TAG,
                           experiment=api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics))
    ssi = _hparams_summary(hp_metadata.SESSION_START_INFO_TAG, session_start_info=start)
    sei = _hparams_summary(hp_metadata.SESSION_END_INFO_TAG, session_end_info=plugin_data_pb2.SessionEndInfo(
        status=api_pb2.Status.Value("STATUS_SUCCESS")))
    return exp, ssi, sei
