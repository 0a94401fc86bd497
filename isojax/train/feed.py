"""What each process feeds: its own rows of every global batch, tokenised by that process alone.

A split is kept as read (:class:`Split`: its texts and labels; every process reads the split's file). The order
of the batches is computed from row indices alone (:func:`batch_indices`: :func:`isojax.data.batching.batches`
over ``arange(N)``, so batch ``k`` of epoch ``e`` holds the rows it would hold over the data, under the
``(seed, e)`` permutation), so every process knows every global batch without touching a text. Each process
then tokenises only its rows of each batch (``runner.process_rows(B)``: the rows its devices hold), for all the
batches of an epoch (or of an evaluation) in one tokenizer call.

A global batch has one width per :class:`TokenGroup` (a classification batch: one, the input tokens; a
sequence-to-sequence batch: the source and the target tokens): the bucket of the group's longest row
(:func:`~isojax.data.batching.bucket_length`, capped at the group's ``max_length``, so widths are the buckets below
``max_length`` and ``max_length`` itself). A process sees only its own rows' lengths, so the processes exchange the
longest length of each group of each of their batches, once per call (one ``process_allgather`` of a
``[groups, batches]`` array). In one process the same code feeds whole batches and exchanges nothing.

A split is any object with ``__len__``, ``arrays(rows) -> dict`` (every array of a batch for those rows, the
token arrays right-padded to their longest row) and ``groups`` (its :class:`TokenGroup` s): :class:`Split`
here, :class:`isojax.train.tasks.seq2seq.Seq2SeqSplit` for sequence-to-sequence tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils

from isojax.data.batching import DEFAULT_BUCKETS, batches, bucket_length, tokenize
from isojax.data.glue import GlueData

__all__ = ["Split", "TokenGroup", "batch_indices", "fingerprint", "process_batches"]


@dataclasses.dataclass(frozen=True)
class TokenGroup:
    """Token arrays of a batch that share one width: the bucket of the longest row of the ``mask`` array.

    Attributes:
      mask: the key of the ``[n, W]`` mask array (1 at real tokens) whose longest row sets the group's width.
      keys: the keys of the group's ``[n, W]`` arrays (the mask included), all cut or padded to that width.
      max_length: the group's largest width (the tokenizer's ``max_length``); the width is
        :func:`~isojax.data.batching.bucket_length` of the longest row, capped at it.
      fill: each key's padding value where a row is padded wider (default 0), e.g. the tokenizer's pad id for
        ``input_ids``.
      buckets: the allowed widths (default :data:`~isojax.data.batching.DEFAULT_BUCKETS`, 32, 64, ..., 512); finer
        buckets pad less and compile more batch shapes.
    """

    mask: str
    keys: tuple[str, ...]
    max_length: int
    fill: Mapping[str, int] = dataclasses.field(default_factory=dict)
    buckets: tuple[int, ...] = DEFAULT_BUCKETS


class Rows(Protocol):
    """What :func:`process_batches` reads of a split (:class:`Split`,
    :class:`~isojax.train.tasks.seq2seq.Seq2SeqSplit`): its number of rows, ``arrays(rows)`` (the named arrays of those
    rows, token arrays right-padded) and the token ``groups`` that are cut to a bucket width together."""

    def __len__(self) -> int: ...

    def arrays(self, rows) -> dict[str, np.ndarray]: ...

    @property
    def groups(self) -> tuple[TokenGroup, ...]: ...


@dataclasses.dataclass(frozen=True)
class Split:
    """The rows of a classification split as read, and how they are tokenised.

    Attributes:
      data: the split's texts and labels (a :class:`~isojax.data.glue.GlueData`).
      tokenizer: a Hugging Face tokenizer (its ``pad_token_id`` fills ``input_ids``).
      max_length: tokens per row, special tokens included (longer rows are truncated).
      buckets: the batch widths (:class:`TokenGroup`).
    """

    data: GlueData
    tokenizer: Any
    max_length: int
    buckets: tuple[int, ...] = DEFAULT_BUCKETS

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
        return tokenize(
            self.tokenizer,
            [a[i] for i in rows],
            None if b is None else [b[i] for i in rows],
            max_length=self.max_length,
        )

    def arrays(self, rows) -> dict[str, np.ndarray]:
        """:meth:`tokens` of ``rows`` and their ``labels``."""
        return {**self.tokens(rows), "labels": self.labels[np.asarray(rows, dtype=np.int64)]}

    @property
    def groups(self) -> tuple[TokenGroup, ...]:
        return (
            TokenGroup(
                "attention_mask",
                ("input_ids", "attention_mask", "token_type_ids"),
                self.max_length,
                {"input_ids": self.tokenizer.pad_token_id},
                self.buckets,
            ),
        )


def fingerprint(split) -> dict:
    """What identifies a split's rows as read: ``{"sha256", "rows", "source"}``, the sha256 of the texts and labels
    of ``split.data`` (a dataclass of lists and arrays: :class:`~isojax.data.glue.GlueData`,
    :class:`~isojax.data.seq2seq.Seq2SeqData`) in order, their number, and where they were read from ("" when the
    data does not say).

    Args:
      split: the rows as read (:class:`Split`, :class:`~isojax.train.tasks.seq2seq.Seq2SeqSplit`).

    Returns:
      the dict above; equal digests mean the same rows in the same order.

    Examples:
      >>> from isojax.data.glue import GlueData, glue_task
      >>> def split(labels):
      ...     return Split(GlueData(["a b", "c"], None, np.array(labels), glue_task("sst2"), "train", "train.tsv"), None, 8)
      >>> a, b = fingerprint(split([0, 1])), fingerprint(split([1, 1]))
      >>> a["rows"], a["source"], a["sha256"] == fingerprint(split([0, 1]))["sha256"], a["sha256"] == b["sha256"]
      (2, 'train.tsv', True, False)
    """
    digest = hashlib.sha256()
    for field in dataclasses.fields(split.data):
        value = getattr(split.data, field.name)
        if isinstance(value, np.ndarray):
            digest.update(f"{field.name} {value.dtype} {value.shape}".encode() + np.ascontiguousarray(value).tobytes())
        elif isinstance(value, list):
            digest.update(f"{field.name} {json.dumps(value)}".encode())
    return {"sha256": digest.hexdigest(), "rows": len(split), "source": getattr(split.data, "source", "")}


def batch_indices(n: int, batch_size: int, **order) -> list[np.ndarray]:
    """Row indices of the batches of one epoch of ``n`` rows, as :func:`~isojax.data.batching.batches` orders them.

    Args:
      n: the number of rows.
      batch_size: rows per batch.
      order: :func:`~isojax.data.batching.batches`' ``shuffle, seed, epoch, start, drop_last``.

    Returns:
      a list of int ``[batch_size]`` arrays (the last one may be shorter unless ``drop_last``).

    Examples:
      >>> batch_indices(5, 2)
      [array([0, 1]), array([2, 3]), array([4])]
      >>> shuffled = batch_indices(5, 2, shuffle=True, seed=0)
      >>> [len(b) for b in shuffled], sorted(np.concatenate(shuffled).tolist())  # a permutation of the rows
      ([2, 2, 1], [0, 1, 2, 3, 4])
    """
    return [b["row"] for b in batches({"row": np.arange(n)}, batch_size, **order)]


def _to_width(x: np.ndarray, width: int, fill: int) -> np.ndarray:
    """``[n, W]`` right-padded rows as ``[n, width]``: padding cut off, or more padding (``fill``) added."""
    if x.shape[1] >= width:
        return x[:, :width]
    return np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=fill)


def process_batches(split: Rows, index_batches: Sequence[np.ndarray], rows: np.ndarray) -> Iterator[dict]:
    """This process's rows of global batches, tokenised here (module docstring).

    Args:
      split: the rows as read (:class:`Rows`: a :class:`Split`, or another split with ``arrays`` and ``groups``).
      index_batches: each global batch as ``[B]`` row indices of ``split`` (the same on every process).
      rows: the positions in a batch that this process feeds (``runner.process_rows(B)``).

    Returns:
      an iterator over the batches: dicts of ``split.arrays`` for this process's rows, every token array
      ``[len(rows), W]`` (``W``: its group's bucket width of the global batch; for :class:`Split`, ``input_ids``,
      ``attention_mask``, ``token_type_ids`` int32 and ``labels [len(rows)]``). Tokenisation and the exchange of
      lengths happen in this call, so every process must make it at the same point. Batches of different lengths
      are a ``ValueError``.

    Examples:
      A split of 4 rows with 3, 1, 2 and 40 tokens; the buckets are 32, 64, ..., so the first batch is 32 wide and
      the second 48 (``max_length``, below the next bucket); ``ids`` are padded with 9:

      >>> class Rows:
      ...     groups = (TokenGroup("mask", ("ids", "mask"), max_length=48, fill={"ids": 9}),)
      ...     lengths = [3, 1, 2, 40]
      ...     def __len__(self):
      ...         return len(self.lengths)
      ...     def arrays(self, rows):
      ...         mask = np.arange(max(self.lengths[r] for r in rows)) < np.array([[self.lengths[r]] for r in rows])
      ...         return {"ids": np.where(mask, 5, 9), "mask": mask.astype(np.int32), "row": np.array(rows)}
      >>> fed = list(process_batches(Rows(), batch_indices(4, 2), rows=np.arange(2)))
      >>> [(b["row"].tolist(), b["ids"].shape, b["mask"].shape) for b in fed]
      [([0, 1], (2, 32), (2, 32)), ([2, 3], (2, 48), (2, 48))]
      >>> fed[0]["ids"][1, :4].tolist(), int(fed[1]["mask"][1].sum())
      ([5, 9, 9, 9], 40)
    """
    if not len(index_batches):
        return iter(())
    if any(len(b) != len(index_batches[0]) for b in index_batches):
        raise ValueError(f"index_batches must all have the same length, got {sorted({len(b) for b in index_batches})}")
    local = np.stack([b[rows] for b in index_batches])  # [K, len(rows)] split row indices fed here
    arrays = split.arrays(local.ravel().tolist())
    longest = np.stack([arrays[g.mask].sum(1).reshape(local.shape).max(1) for g in split.groups])  # [G, K]
    if jax.process_count() > 1:
        longest = multihost_utils.process_allgather(longest).max(0)
    group_of = {key: i for i, g in enumerate(split.groups) for key in g.keys}
    b = local.shape[1]

    def batch(k: int) -> dict:
        widths = [bucket_length(longest[i, k], g.buckets, max_length=g.max_length) for i, g in enumerate(split.groups)]
        out = {}
        for key, value in arrays.items():
            part = value[k * b : (k + 1) * b]
            if key in group_of:
                g = split.groups[group_of[key]]
                part = _to_width(part, widths[group_of[key]], g.fill.get(key, 0))
            out[key] = part
        return out

    return (batch(k) for k in range(len(local)))
