"""One stage of a pipeline (PyTorch's `torch.distributed.pipelining.PipelineStage`): runs its submodule on
microbatches, receiving activations from the previous stage and sending its outputs to the next, and in
backward receiving the gradient of its outputs and sending the gradient of its inputs.

Stage `i` of `num_stages` lives on group rank `i % group size` (PyTorch's loop placement, which gives
interleaved schedules several stages per rank). Messages travel by `isend`/`recv` of the process group;
activations are preceded by a fixed-size int64 header (count, then dtype, rank and sizes of each tensor),
since shapes can change from one microbatch to the next. Tags keep the streams apart (activations into
stage s, gradients into stage s); within a stream MPI keeps the order, and every schedule sends a stream's
microbatches in order.
"""
from __future__ import annotations

from ... import _dtype as D
from ..._ops.creation import empty, tensor as make_tensor
from ..._tensor import Tensor
from ...autograd import backward as autograd_backward
from ...nn.modules.module import Module
from .. import collectives as C
from .. import distributed_c10d as c10d

MAX_DIMS = 8                         # activations of up to 8 dimensions
MAX_TENSORS = 6                      # a stage passes on up to 6 tensors
SLOTS_PER_TENSOR = 2 + MAX_DIMS      # dtype id, ndim, sizes
HEADER_LEN = 1 + MAX_TENSORS * SLOTS_PER_TENSOR
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")
ACTIVATION_TAG, GRADIENT_TAG = 0, 1
TAG_STRIDE = 4096                    # tag = kind * TAG_STRIDE + receiving stage


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _header(tensors: tuple) -> Tensor:
    if len(tensors) > MAX_TENSORS or any(t.dim() > MAX_DIMS for t in tensors):
        raise ValueError(f"PipelineStage: a stage passes on at most {MAX_TENSORS} tensors of at most {MAX_DIMS} "
                         f"dimensions, got shapes {[list(t.shape) for t in tensors]}")
    slots = [len(tensors)]
    for t in tensors:
        if t.dtype.name not in DTYPES:
            raise TypeError(f"PipelineStage: cannot send a tensor of dtype {t.dtype}")
        slots += [DTYPES.index(t.dtype.name), t.dim()] + list(t.shape) + [0] * (MAX_DIMS - t.dim())
    return make_tensor(slots + [0] * (HEADER_LEN - len(slots)), dtype=D.BY_NAME["int64"])


def _read_header(h: Tensor) -> list:
    slots = h.tolist()
    out = []
    for i in range(slots[0]):
        base = 1 + i * SLOTS_PER_TENSOR
        ndim = slots[base + 1]
        out.append((DTYPES[slots[base]], tuple(slots[base + 2:base + 2 + ndim])))
    return out


class PipelineStage:
    """`submodule` as stage `stage_index` of `num_stages`, on `device`, communicating through `group`."""

    def __init__(self, submodule: Module, stage_index: int, num_stages: int, device=None, input_args=None,
                 output_args=None, group=None, dw_builder=None) -> None:
        if not c10d.is_initialized():
            raise RuntimeError("PipelineStage needs an initialized process group (init_process_group)")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index {stage_index} is not in [0, {num_stages})")
        self.submod, self.stage_index, self.num_stages = submodule, stage_index, num_stages
        self.device, self.group = device, group
        self.group_size = c10d.get_world_size(group)
        self.group_rank = c10d.get_rank(group)
        if stage_index % self.group_size != self.group_rank:
            raise ValueError(f"PipelineStage: stage {stage_index} belongs to group rank "
                             f"{stage_index % self.group_size}, not to rank {self.group_rank}")
        self._saved: dict = {}          # microbatch -> (inputs, outputs) kept for backward
        self._pending: list = []        # send handles, waited at the end of a step
        self.outputs: dict = {}         # microbatch -> output (last stage)

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def _peer(self, stage: int) -> int:
        rank_in_group = stage % self.group_size
        return rank_in_group if self.group is None else c10d.get_global_rank(self.group, rank_in_group)

    def _send(self, tensors: tuple, stage: int, kind: int) -> None:
        tag = kind * TAG_STRIDE + stage
        for t in tensors:
            self._pending.append(C.isend(t.detach().contiguous(), self._peer(stage), self.group, tag))

    def _recv_into(self, shapes: list, stage: int, kind: int) -> tuple:
        tag = kind * TAG_STRIDE + self.stage_index
        out = []
        for dtype, shape in shapes:
            buf = empty(shape, dtype=D.BY_NAME[dtype])
            C.recv(buf, self._peer(stage), self.group, tag)
            out.append(buf)
        return tuple(out)

    def forward_one_chunk(self, mb: int, args: tuple = ()) -> object:
        """Forward of microbatch `mb`: the first stage takes `args`, the others receive theirs."""
        if not self.is_first:
            header = self._recv_into([("int64", (HEADER_LEN,))], self.stage_index - 1, ACTIVATION_TAG)[0]
            args = self._recv_into(_read_header(header), self.stage_index - 1, ACTIVATION_TAG)
            args = tuple(a.requires_grad_(True) if a.is_floating_point() else a for a in args)
        output = self.submod(*args)
        outputs = _as_tuple(output)
        self._saved[mb] = (args, outputs)
        if self.is_last:
            self.outputs[mb] = output
        else:
            self._send((_header(outputs),) + tuple(outputs), self.stage_index + 1, ACTIVATION_TAG)
        return output

    def backward_one_chunk(self, mb: int, loss: Tensor | None = None) -> None:
        """Backward of microbatch `mb` from `loss` (last stage) or from the received output gradients."""
        args, outputs = self._saved.pop(mb)
        if self.is_last:
            roots, grads = (loss,), None
        else:
            floating = [o for o in outputs if o.is_floating_point()]      # the next stage sends one each
            got = self._recv_into([(o.dtype.name, tuple(o.shape)) for o in floating], self.stage_index + 1,
                                  GRADIENT_TAG)
            pairs = [(o, g) for o, g in zip(floating, got) if o.requires_grad]
            roots, grads = tuple(o for o, _ in pairs), tuple(g for _, g in pairs)
        if roots:
            autograd_backward(roots, grads)
        if not self.is_first:
            grads_in = tuple(a.grad if a.grad is not None else a.detach() * 0 for a in args if a.requires_grad)
            self._send(grads_in, self.stage_index - 1, GRADIENT_TAG)

    def finish_step(self) -> None:
        """Wait for this step's sends and drop what the step kept."""
        for work in self._pending:
            if work is not None:
                work.wait()
        self._pending, self._saved = [], {}
