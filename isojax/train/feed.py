"""What each process feeds: its own rows of every global batch, tokenised by that process alone.

A split is kept as read (:class:`Split`: its texts and labels; every process reads the split's file). The order
of the batches is computed from row indices alone (:func:`batch_indices`: :func:`isojax.data.batching.batches`
over ``arange(N)``, so batch ``k`` of epoch ``e`` holds the rows it would hold over the data, under the
``(seed, e)`` permutation), so every process knows every global batch without touching a text. Each process
then tokenises only its rows of each batch (``runner.process_rows(B)``: the rows its devices hold), for all the
batches of an epoch (or of an evaluation) in one tokenizer call.

A global batch has one width: the bucket of its longest row (:func:`~isojax.data.batching.bucket_length`,
capped at the split's ``max_length``, so widths are the buckets below ``max_length`` and ``max_length``
itself). A process sees only its own rows' lengths, so the processes exchange the longest length of each of
their batches, once per call (one ``process_allgather`` of a vector with one entry per batch). In one process
the same code feeds whole batches and exchanges nothing.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from isojax.data.batching import batches, bucket_length, tokenize
from isojax.data.glue import GlueData

__all__ = ["Split", "batch_indices", "process_batches"]


@dataclasses.dataclass(frozen=True)
class Split:
    """The rows of a split as read (``data``: texts and labels) and how they are tokenised (``tokenizer``,
    ``max_length`` tokens per row)."""

    data: GlueData
    tokenizer: Any
    max_length: int

    def __len__(self) -> int:
        return len(self.data)

    @property
    def labels(self) -> np.ndarray:
        return self.data.labels

    def tokens(self, rows=None) -> dict[str, np.ndarray]:
        """Rows ``rows`` (all when None) tokenised (:func:`~isojax.data.batching.tokenize`: ``input_ids``,
        ``attention_mask``, ``token_type_ids`` ``[len(rows), W]``, right-padded to their longest row)."""
        a, b = self.data.texts_a, self.data.texts_b
        rows = range(len(a)) if rows is None else rows
        return tokenize(self.tokenizer, [a[i] for i in rows], None if b is None else [b[i] for i in rows],
                        max_length=self.max_length)


def batch_indices(n: int, batch_size: int, **order) -> list[np.ndarray]:
    """Row indices ``[batch_size]`` (the last one may be shorter) of the batches of one epoch of ``n`` rows;
    ``order``: :func:`~isojax.data.batching.batches`' ``shuffle, seed, epoch, start, drop_last``."""
    return [b["row"] for b in batches({"row": np.arange(n)}, batch_size, **order)]


def _to_width(x: np.ndarray, width: int, fill: int) -> np.ndarray:
    """``[n, W]`` right-padded rows as ``[n, width]``: padding cut off, or more padding (``fill``) added."""
    if x.shape[1] >= width:
        return x[:, :width]
    return np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=fill)


def process_batches(split: Split, index_batches: Sequence[np.ndarray], rows: np.ndarray) -> Iterator[dict]:
    """This process's rows of global batches, tokenised here (module docstring).

    Args:
      split: the rows as read.
      index_batches: each global batch as ``[B]`` row indices of ``split`` (the same on every process).
      rows: the positions in a batch that this process feeds (``runner.process_rows(B)``).

    Returns an iterator over the batches of dicts ``input_ids``, ``attention_mask``, ``token_type_ids``
    ``[len(rows), W]`` int32 (``W``: the global batch's bucket width) and ``labels [len(rows)]``. Tokenisation and
    the exchange of lengths happen in this call, so every process must make it at the same point.
    """
    if not len(index_batches):
        return iter(())
    if any(len(b) != len(index_batches[0]) for b in index_batches):
        raise ValueError(f"index_batches must all have the same length, got {sorted({len(b) for b in index_batches})}")
    local = np.stack([b[rows] for b in index_batches])  # [K, len(rows)] split row indices fed here
    tokens = split.tokens(local.ravel().tolist())
    longest = tokens["attention_mask"].sum(1).reshape(local.shape).max(1)
    if jax.process_count() > 1:
        longest = multihost_utils.process_allgather(longest).max(0)
    fill = {"input_ids": split.tokenizer.pad_token_id}
    b = local.shape[1]

    def batch(k: int) -> dict:
        width = bucket_length(longest[k], max_length=split.max_length)
        out = {key: _to_width(value[k * b:(k + 1) * b], width, fill.get(key, 0)) for key, value in tokens.items()}
        out["labels"] = split.labels[local[k]]
        return out

    return (batch(k) for k in range(len(local)))
