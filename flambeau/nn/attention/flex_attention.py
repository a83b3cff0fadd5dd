"""torch.nn.attention.flex_attention: attention with a user score function and a block-sparse mask.

`create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)` evaluates `mask_mod(b, h, q_idx, kv_idx)` over
broadcast index tensors and records, per BLOCK_SIZE tile, which tiles are partly kept
(`kv_num_blocks`/`kv_indices`) and which wholly (`full_kv_num_blocks`/`full_kv_indices`), as
PyTorch's BlockMask does. `flex_attention(q, k, v, score_mod, block_mask)` is the eager reference
computation: scores, `score_mod` applied elementwise, masked positions at -inf, softmax, times v
(rows with nothing kept give 0). There is no fused kernel: the scores are materialised.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from ... import _dtype as D
from ..._ops.creation import arange, full
from ..._tensor import Tensor
from ...autograd.grad_mode import no_grad
from .. import functional as F

_DEFAULT_SPARSE_BLOCK_SIZE = 128

_mask_mod_signature = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
_score_mod_signature = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class AuxRequest(NamedTuple):
    """Which auxiliary outputs flex_attention should return."""
    lse: bool = False
    max_scores: bool = False


class AuxOutput(NamedTuple):
    """The auxiliary outputs asked for (None where not)."""
    lse: Tensor | None = None
    max_scores: Tensor | None = None


def noop_mask(batch: Tensor, head: Tensor, token_q: Tensor, token_kv: Tensor) -> Tensor:
    """Keeps every position."""
    return full((), True, dtype=D.bool, device=batch.device)


def and_masks(*mask_mods: _mask_mod_signature) -> _mask_mod_signature:
    def and_mask(b, h, q_idx, kv_idx):
        result = full((), True, dtype=D.bool, device=b.device)
        for mod in mask_mods:
            result = result & mod(b, h, q_idx, kv_idx)
        return result
    return and_mask


def or_masks(*mask_mods: _mask_mod_signature) -> _mask_mod_signature:
    def or_mask(b, h, q_idx, kv_idx):
        result = full((), False, dtype=D.bool, device=b.device)
        for mod in mask_mods:
            result = result | mod(b, h, q_idx, kv_idx)
        return result
    return or_mask


def create_mask(mod_fn: Callable, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                device="cpu") -> Tensor:
    """The dense (B, H, Q_LEN, KV_LEN) boolean mask of a mask_mod (B or H None: size 1)."""
    b = arange(B or 1, device=device).view(-1, 1, 1, 1)
    h = arange(H or 1, device=device).view(1, -1, 1, 1)
    q = arange(Q_LEN, device=device).view(1, 1, -1, 1)
    kv = arange(KV_LEN, device=device).view(1, 1, 1, -1)
    with no_grad():
        out = mod_fn(b, h, q, kv)
    return out.to(D.bool).expand(B or 1, H or 1, Q_LEN, KV_LEN)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(mask: Tensor, block: tuple[int, int]) -> Tensor:
    """(B, H, nq, nkv, bq, bkv) tiles of a (B, H, Q, KV) mask, padded with False (so a tile that
    runs past the end is never full)."""
    Bm, Hm, Q, KV = mask.shape
    nq, nkv = _ceil_div(Q, block[0]), _ceil_div(KV, block[1])
    padded = full((Bm, Hm, nq * block[0], nkv * block[1]), False, dtype=D.bool, device=mask.device)
    padded[:, :, :Q, :KV] = mask
    return padded.view(Bm, Hm, nq, block[0], nkv, block[1]).permute(0, 1, 2, 4, 3, 5)


def _counts_and_indices(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of a (B, H, n, m) block matrix: how many are set, and their column indices first
    (ascending), then the others."""
    counts = blocks.sum(-1).to(D.int32)
    order = (~blocks).to(D.int32).argsort(dim=-1, stable=True).to(D.int32)
    return counts, order


class BlockMask:
    """Which BLOCK_SIZE tiles of the score matrix attention visits; see the module docstring."""

    def __init__(self, seq_lengths: tuple[int, int], kv_num_blocks: Tensor, kv_indices: Tensor,
                 full_kv_num_blocks: Tensor | None, full_kv_indices: Tensor | None,
                 q_num_blocks: Tensor | None, q_indices: Tensor | None,
                 full_q_num_blocks: Tensor | None, full_q_indices: Tensor | None,
                 BLOCK_SIZE: tuple[int, int] = (_DEFAULT_SPARSE_BLOCK_SIZE, _DEFAULT_SPARSE_BLOCK_SIZE),
                 mask_mod: _mask_mod_signature = noop_mask) -> None:
        self.seq_lengths = tuple(seq_lengths)
        self.kv_num_blocks, self.kv_indices = kv_num_blocks, kv_indices
        self.full_kv_num_blocks, self.full_kv_indices = full_kv_num_blocks, full_kv_indices
        self.q_num_blocks, self.q_indices = q_num_blocks, q_indices
        self.full_q_num_blocks, self.full_q_indices = full_q_num_blocks, full_q_indices
        self.BLOCK_SIZE = tuple(BLOCK_SIZE)
        self.mask_mod = mask_mod

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (*self.kv_num_blocks.shape[:2], *self.seq_lengths)

    def to_dense(self) -> Tensor:
        """The (B, H, q blocks, kv blocks) int32 matrix of visited tiles (partial or full)."""
        n = self.kv_indices.shape[-1]
        cols = arange(n, device=self.kv_indices.device)
        dense = self._scatter(self.kv_num_blocks, self.kv_indices, cols)
        if self.full_kv_num_blocks is not None:
            dense = dense | self._scatter(self.full_kv_num_blocks, self.full_kv_indices, cols)
        return dense.to(D.int32)

    @staticmethod
    def _scatter(counts: Tensor, indices: Tensor, cols: Tensor) -> Tensor:
        keep = cols < counts.unsqueeze(-1)
        out = full(indices.shape, False, dtype=D.bool, device=indices.device)
        return out.scatter(-1, indices.long(), keep)

    def __repr__(self) -> str:
        return f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE})"


def create_block_mask(mask_mod: _mask_mod_signature, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                      device="cuda", BLOCK_SIZE: int | tuple[int, int] = _DEFAULT_SPARSE_BLOCK_SIZE,
                      _compile: bool = False, separate_full_blocks: bool = True) -> BlockMask:
    """The BlockMask of `mask_mod` over a (B, H, Q_LEN, KV_LEN) score matrix."""
    block = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    mask = create_mask(mask_mod, B, H, Q_LEN, KV_LEN, device)
    tiles = _tiles(mask, block).flatten(-2)
    any_kept, all_kept = tiles.any(-1), tiles.all(-1)
    if not separate_full_blocks:
        kv = _counts_and_indices(any_kept)
        q = _counts_and_indices(any_kept.transpose(-1, -2))
        return BlockMask((Q_LEN, KV_LEN), *kv, None, None, *q, None, None, block, mask_mod)
    partial = any_kept & ~all_kept
    kv, full_kv = _counts_and_indices(partial), _counts_and_indices(all_kept)
    q, full_q = _counts_and_indices(partial.transpose(-1, -2)), _counts_and_indices(all_kept.transpose(-1, -2))
    return BlockMask((Q_LEN, KV_LEN), *kv, *full_kv, *q, *full_q, block, mask_mod)


def flex_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: _score_mod_signature | None = None,
                   block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options: dict | None = None, *,
                   return_aux: AuxRequest | None = None):
    """softmax(score_mod(q k^T * scale) masked by block_mask) v for (B, H, L, E) inputs."""
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"flex_attention: expected 4-D query, key and value (B, H, L, E), got shapes "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    B, Hq, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    if Hq != Hkv:
        if not enable_gqa or Hq % Hkv:
            raise ValueError(f"flex_attention: query has {Hq} heads and key/value {Hkv}; pass enable_gqa=True "
                             "with a number of query heads divisible by the key/value heads")
        key = key.repeat_interleave(Hq // Hkv, dim=1)
        value = value.repeat_interleave(Hq // Hkv, dim=1)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    scores = (query @ key.transpose(-2, -1)) * scale
    b = arange(B, device=query.device).view(-1, 1, 1, 1)
    h = arange(Hq, device=query.device).view(1, -1, 1, 1)
    q_idx = arange(L, device=query.device).view(1, 1, -1, 1)
    kv_idx = arange(S, device=query.device).view(1, 1, 1, -1)
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if block_mask is not None:
        keep = block_mask.mask_mod(b, h, q_idx, kv_idx).to(D.bool)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = scores.logsumexp(-1)
    probs = F.softmax(scores, dim=-1).nan_to_num(0.0)
    out = probs @ value
    if return_aux is not None:
        return out, AuxOutput(lse if return_aux.lse else None,
                              scores.amax(-1) if return_aux.max_scores else None)
    return (out, lse) if return_lse else out
