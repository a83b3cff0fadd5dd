"""Variable-length sequences: PackedSequence, pack_padded_sequence, pad_packed_sequence, pad_sequence,
pack_sequence, unpad_sequence, unpack_sequence (layouts identical to PyTorch's)."""
from __future__ import annotations

from collections import namedtuple

from ... import _dtype as D
from ..._ops import functions as torch   # the operator functions flambeau exports

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence", "pack_sequence",
           "unpad_sequence", "unpack_sequence"]


class PackedSequence(namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """Time-major packed batch: `data` holds, for each step t, the rows of the batch_sizes[t] sequences
    still running (sequences sorted by decreasing length)."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _invert(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        idx = lambda t: None if t is None else t.to(data.device)  # noqa: E731
        return type(self)(data, self.batch_sizes, idx(self.sorted_indices), idx(self.unsorted_indices))

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda


def _invert(perm):
    out = torch.empty_like(perm)
    out[perm] = torch.arange(perm.numel(), device=perm.device)
    return out


def pack_padded_sequence(input, lengths, batch_first: bool = False, enforce_sorted: bool = True) -> PackedSequence:
    lengths_list = [int(x) for x in (lengths.tolist() if hasattr(lengths, "tolist") else lengths)]
    if enforce_sorted:
        if any(a < b for a, b in zip(lengths_list, lengths_list[1:])):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                               "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
                               "to sidestep this requirement if you do not need ONNX exportability.")
        sorted_indices = None
    else:
        order = sorted(range(len(lengths_list)), key=lambda i: -lengths_list[i])
        sorted_indices = torch.tensor(order, dtype=D.int64)
        lengths_list = [lengths_list[i] for i in order]
        input = input.index_select(0 if batch_first else 1, sorted_indices.to(input.device))
    if any(n <= 0 for n in lengths_list):
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    if batch_first:
        input = input.transpose(0, 1)
    steps = lengths_list[0]
    if steps > input.shape[0]:
        raise RuntimeError(f"Expected sequence length to be larger than or equal to {steps}, got {input.shape[0]}")
    batch_sizes = [sum(1 for n in lengths_list if n > t) for t in range(steps)]
    data = torch.cat([input[t, :bs] for t, bs in enumerate(batch_sizes)], 0)
    return PackedSequence(data, torch.tensor(batch_sizes, dtype=D.int64), sorted_indices, None)


def _packed_to_padded(seq: PackedSequence, padding_value: float = 0.0):
    """(padded (T, B, *) in sorted order, batch_sizes, sorted_indices, unsorted_indices)."""
    bs = [int(b) for b in seq.batch_sizes.tolist()]
    nb = bs[0]
    rows, off = [], 0
    for b in bs:
        step = seq.data[off:off + b]
        if b < nb:
            pad = torch.full((nb - b,) + tuple(step.shape[1:]), padding_value, dtype=step.dtype, device=step.device)
            step = torch.cat([step, pad], 0)
        rows.append(step)
        off += b
    return torch.stack(rows, 0), seq.batch_sizes, seq.sorted_indices, seq.unsorted_indices


def _padded_to_packed(padded, like: PackedSequence) -> PackedSequence:
    bs = [int(b) for b in like.batch_sizes.tolist()]
    data = torch.cat([padded[t, :b] for t, b in enumerate(bs)], 0)
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length=None):
    padded, batch_sizes, _, unsorted = _packed_to_padded(sequence, padding_value)
    bs = [int(b) for b in batch_sizes.tolist()]
    if total_length is not None:
        if total_length < len(bs):
            raise ValueError("Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {len(bs)}")
        extra = total_length - len(bs)
        if extra:
            pad = torch.full((extra,) + tuple(padded.shape[1:]), padding_value, dtype=padded.dtype,
                             device=padded.device)
            padded = torch.cat([padded, pad], 0)
    lengths = [sum(1 for b in bs if b > i) for i in range(bs[0])]
    lengths_t = torch.tensor(lengths, dtype=D.int64)
    if unsorted is not None:
        padded = padded.index_select(1, unsorted)
        lengths_t = lengths_t.index_select(0, unsorted.to(lengths_t.device))
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, lengths_t


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"):
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    sequences = list(sequences)
    n = max(s.shape[0] for s in sequences)
    out = []
    for s in sequences:
        extra = n - s.shape[0]
        if extra:
            pad = torch.full((extra,) + tuple(s.shape[1:]), padding_value, dtype=s.dtype, device=s.device)
            s = torch.cat([s, pad] if padding_side == "right" else [pad, s], 0)
        out.append(s)
    return torch.stack(out, 0 if batch_first else 1)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False):
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [seq[:int(n)] for seq, n in zip(padded_sequences, lengths.tolist() if hasattr(lengths, "tolist")
                                            else lengths)]


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    lengths = torch.tensor([s.shape[0] for s in sequences], dtype=D.int64)
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence):
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
