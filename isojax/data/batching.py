"""Tokenisation, padding to length buckets, and deterministic, resumable batching.

Data are plain nested dicts of numpy arrays sharing a leading example axis ``N``. A dict holding an
``"attention_mask"`` ``[N, W]`` is a *token group*: :func:`tokenize` returns one (``input_ids``,
``attention_mask``, ``token_type_ids``, right-padded to the longest row ``W``), and pair data for STS
can hold two (``{"a": tokenize(...), "b": tokenize(...), "scores": ...}``).

:func:`batches` cuts each batch's token groups to a *bucket length*: the smallest bucket that holds the
longest row of the batch (rows are right-padded, so cutting columns never drops a real token). Batch
shapes thus take at most ``len(buckets) + 1`` values, which bounds ``jit`` recompilations.

Order is deterministic: without shuffling, the data order; with shuffling, the permutation drawn by
``numpy.random.default_rng([seed, epoch])``, so each epoch has its own order and the same
``(seed, epoch)`` gives the same order on every machine. A run resumes mid-epoch from its data
position ``(epoch, start)`` by passing them back to :func:`batches`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from isojax._validate import check_texts

__all__ = ["DEFAULT_BUCKETS", "batches", "bucket_length", "least_length", "num_batches", "tokenize"]

DEFAULT_BUCKETS = (32, 64, 128, 256, 512)
log = logging.getLogger(__name__)


def least_length(tokenizer, *, pair: bool = False) -> int:
    """The smallest ``max_length`` :func:`tokenize` accepts: ``max(2, s)`` for the ``s`` special tokens the
    tokenizer adds to a text (``pair``: to a pair). A Hugging Face tokenizer does not truncate below them: asked
    for fewer tokens it returns rows longer than ``max_length``.

    Args:
      tokenizer: a Hugging Face tokenizer.
      pair: whether the rows are text pairs.

    Returns:
      an ``int``.

    Examples:
      BERT: ``[CLS] a [SEP]`` and ``[CLS] a [SEP] b [SEP]``:

      >>> from isojax.models.hub import bundled_model_path, load_tokenizer
      >>> tokenizer = load_tokenizer(bundled_model_path())
      >>> least_length(tokenizer), least_length(tokenizer, pair=True)
      (2, 3)
    """
    return max(2, tokenizer.num_special_tokens_to_add(pair=pair))


def tokenize(tokenizer, texts_a, texts_b=None, *, max_length: int) -> dict[str, np.ndarray]:
    """Tokenise single texts or text pairs with a Hugging Face tokenizer.

    Texts (pairs: together) longer than ``max_length`` tokens, special tokens included, are truncated to it (pairs
    longest-first), and how many were is logged (``INFO``); an empty text is encoded as the special tokens alone.
    Rows are right-padded with the tokenizer's pad id to the longest row ``W <= max_length``.

    Args:
      tokenizer: a Hugging Face tokenizer (e.g. the third value of :func:`isojax.from_pretrained`).
      texts_a: ``N`` texts (a sequence of ``str``; a single ``str`` is a ``TypeError``).
      texts_b: ``N`` second texts of pairs, or None.
      max_length: the most tokens per row, at least :func:`least_length` (2; BERT pairs 3, RoBERTa pairs 4).

    Returns:
      A dict of int32 arrays ``input_ids``, ``attention_mask`` (1 = real token) and ``token_type_ids`` (all zero when
      the tokenizer has no segment ids, e.g. RoBERTa), each ``[N, W]``.

    Examples:
      BERT's uncased WordPiece: ``[CLS] hello world [SEP]``, ``[CLS] a [SEP]`` padded, and the pair
      ``[CLS] a [SEP] b [SEP]`` with its second text in segment 1:

      >>> from isojax.models.hub import bundled_model_path, load_tokenizer
      >>> tokenizer = load_tokenizer(bundled_model_path())
      >>> batch = tokenize(tokenizer, ["Hello world", "a"], max_length=16)
      >>> tokenizer.convert_ids_to_tokens(batch["input_ids"][0]), batch["attention_mask"][1].tolist()
      (['[CLS]', 'hello', 'world', '[SEP]'], [1, 1, 1, 0])
      >>> tokenize(tokenizer, ["a"], ["b"], max_length=16)["token_type_ids"]
      array([[0, 0, 0, 1, 1]], dtype=int32)
      >>> tokenize(tokenizer, ["a b c d e f"], max_length=4)["input_ids"].shape  # truncated: [CLS] a b [SEP]
      (1, 4)
    """
    texts_a = check_texts(texts_a, "texts_a")
    if texts_b is not None:
        texts_b = check_texts(texts_b, "texts_b")
        if len(texts_b) != len(texts_a):
            raise ValueError(f"texts_b must have the same length as texts_a ({len(texts_a)}), got {len(texts_b)}")
    if not texts_a:
        raise ValueError("texts_a must hold at least one text")
    least = least_length(tokenizer, pair=texts_b is not None)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < least:
        raise ValueError(
            f"max_length must be an integer >= {least}, got {max_length!r} (this tokenizer adds "
            f"{tokenizer.num_special_tokens_to_add(pair=texts_b is not None)} special tokens to a "
            f"{'pair' if texts_b is not None else 'text'})"
        )
    enc = tokenizer(
        texts_a,
        texts_b,
        truncation=True,
        max_length=max_length,
        padding="longest",
        padding_side="right",
        return_tensors="np",
    )
    mask = np.asarray(enc["attention_mask"], np.int32)
    out = {
        "input_ids": np.asarray(enc["input_ids"], np.int32),
        "attention_mask": mask,
        "token_type_ids": np.asarray(enc["token_type_ids"], np.int32)
        if "token_type_ids" in enc
        else np.zeros_like(mask),
    }
    _check_right_padded(mask, "tokenizer output attention_mask")
    _log_truncated(tokenizer, texts_a, texts_b, mask, max_length)
    return out


def _log_truncated(tokenizer, texts_a, texts_b, mask, max_length: int) -> None:
    """Log how many rows truncation shortened. Only a row that fills ``max_length`` can have been cut, so only
    those rows are encoded again, without truncation, to find their full length."""
    full = np.flatnonzero(mask.sum(1) == max_length)
    if not full.size:
        return
    ids = tokenizer([texts_a[i] for i in full], None if texts_b is None else [texts_b[i] for i in full])["input_ids"]
    cut = sum(len(row) > max_length for row in ids)
    if cut:
        log.info(
            "tokenize: %d of %d %s truncated to max_length=%d tokens",
            cut,
            len(texts_a),
            "text pairs" if texts_b is not None else "texts",
            max_length,
        )


def _check_right_padded(mask: np.ndarray, name: str) -> None:
    """Rows must be ones then zeros, so that cutting columns off the right removes only padding."""
    if mask.ndim != 2 or not np.array_equal(mask != 0, np.arange(mask.shape[1]) < (mask != 0).sum(1)[:, None]):
        raise ValueError(f"{name} must be a right-padded [N, W] mask (each row ones, then zeros)")


def bucket_length(lengths, buckets: Sequence[int] = DEFAULT_BUCKETS, *, max_length: int | None = None) -> int:
    """Smallest bucket ``>= max(lengths)``.

    With ``max_length`` (the padded width of the data), buckets above it are replaced by
    ``max_length`` itself, so the result never exceeds the data's width and always exists.
    ``ValueError`` if the longest length exceeds every bucket (and ``max_length``).

    Args:
      lengths: the rows' token counts (an int or an array of ints).
      buckets: positive integers, the allowed widths.
      max_length: the padded width of the data, or None.

    Returns:
      The bucket length, an ``int``.

    Examples:
      >>> bucket_length([5, 33, 12]), bucket_length([5, 33], max_length=40), bucket_length([3], (4, 8))
      (64, 40, 4)
    """
    longest = int(np.max(lengths, initial=0))
    if not buckets or any(not isinstance(b, (int, np.integer)) or b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive integers, got {buckets!r}")
    candidates = sorted(set(buckets))
    if max_length is not None:
        candidates = [b for b in candidates if b < max_length] + [max_length]
    for b in candidates:
        if b >= longest:
            return int(b)
    raise ValueError(f"lengths: the longest sequence ({longest}) exceeds the largest bucket ({candidates[-1]})")


def num_batches(n: int, batch_size: int, *, drop_last: bool = False) -> int:
    """Number of batches in one epoch of ``n`` examples.

    Args:
      n: the number of examples.
      batch_size: rows per batch.
      drop_last: whether a final batch smaller than ``batch_size`` is dropped.

    Returns:
      ``floor(n / batch_size)`` with ``drop_last``, else ``ceil(n / batch_size)``.

    Examples:
      >>> num_batches(10, 4), num_batches(10, 4, drop_last=True), num_batches(8, 4)
      (3, 2, 2)
    """
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def _leaves(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def _take(data: Mapping, idx: np.ndarray, buckets) -> dict:
    """Rows ``idx`` of every array; token groups cut to their bucket length."""
    width = None
    if "attention_mask" in data and not isinstance(data["attention_mask"], Mapping):
        mask = data["attention_mask"][idx]
        full = data["attention_mask"].shape
        width = bucket_length(mask.sum(axis=1), buckets, max_length=full[1])
    out = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out[key] = _take(value, idx, buckets)
        elif width is not None and value.ndim >= 2 and value.shape[:2] == full:
            out[key] = value[idx, :width]
        else:
            out[key] = value[idx]
    return out


def batches(
    data: Mapping,
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int | None = None,
    epoch: int = 0,
    start: int = 0,
    drop_last: bool = False,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> Iterator[dict]:
    """Iterate over one epoch of ``data`` in batches of ``batch_size`` rows.

    Args:
      data: nested dict of numpy arrays, all with the same leading size ``N``; in each dict that holds
        an ``attention_mask`` ``[N, W]``, the arrays of shape ``[N, W, ...]`` are cut to the batch's
        bucket length (see :func:`bucket_length`).
      batch_size: rows per batch, a positive integer.
      shuffle: draw the order from ``numpy.random.default_rng([seed, epoch])``; needs an integer ``seed``.
      seed: the shuffling seed.
      epoch: the epoch, a non-negative integer (with ``shuffle``, it picks the order, see ``shuffle``).
      start: the index of the first batch in the epoch: yields batches ``start, start + 1, ...`` of epoch ``epoch``,
        so a resumed run passes the position it stopped at and sees exactly the remaining batches.
      drop_last: drop a final batch smaller than ``batch_size``.
      buckets: the allowed widths of the token groups (see :func:`bucket_length`).

    Returns:
      An iterator of dicts with the structure of ``data`` and leading size ``batch_size`` (the last may be smaller).
      Arguments are checked when ``batches`` is called.

    Examples:
      Five rows, the longest of the first two 3 tokens and of the last three 6 tokens, with buckets of 4 and 8:

      >>> import numpy as np
      >>> mask = np.array([[1, 1, 0, 0, 0, 0, 0, 0, 0, 0]] + [[1, 1, 1] + [0] * 7] + [[1] * 6 + [0] * 4] * 3)
      >>> data = {"attention_mask": mask, "labels": np.arange(5)}
      >>> [(b["attention_mask"].shape, b["labels"].tolist()) for b in batches(data, 2, buckets=(4, 8))]
      [((2, 4), [0, 1]), ((2, 8), [2, 3]), ((1, 8), [4])]
      >>> [b["labels"].tolist() for b in batches(data, 2, start=2, buckets=(4, 8))]  # resume at batch 2
      [[4]]
      >>> order = np.random.default_rng([7, 1]).permutation(5)
      >>> shuffled = np.concatenate([b["labels"] for b in batches(data, 2, shuffle=True, seed=7, epoch=1)])
      >>> np.array_equal(shuffled, order)
      True
    """
    if not isinstance(data, Mapping) or not data:
        raise TypeError(f"data must be a non-empty dict of numpy arrays, got {type(data).__name__}")
    leaves = dict(_leaves(data))
    for key, value in leaves.items():
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            raise TypeError(
                f"data[{key!r}] must be a numpy array with a leading example axis, got {type(value).__name__}"
            )
    for key, value in leaves.items():
        if key.rsplit("/", 1)[-1] == "attention_mask":
            _check_right_padded(value, f"data[{key!r}]")
    sizes = {key: value.shape[0] for key, value in leaves.items()}
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
        raise ValueError(f"data: all arrays must share the leading size, got {sizes}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if shuffle and (not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer when shuffle=True, got {seed!r}")
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    total = num_batches(n, batch_size, drop_last=drop_last)
    if not isinstance(start, int) or not 0 <= start <= total:
        raise ValueError(f"start must be an integer batch index in [0, {total}], got {start!r}")
    bucket_length(0, buckets)  # validates buckets now rather than at the first batch
    order = np.random.default_rng([int(seed), epoch]).permutation(n) if shuffle and seed is not None else np.arange(n)
    # Arguments are checked above, when batches() is called; the generator only slices.
    return (_take(data, order[k * batch_size : (k + 1) * batch_size], buckets) for k in range(start, total))
