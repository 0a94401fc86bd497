"""Run an encoder over a list of texts in length-sorted, jit-compiled batches.

Texts are tokenised once (truncated to ``max_length``), sorted by token count, batched, padded to a multiple of
``pad_to_multiple_of`` (so only a few shapes are compiled; never wider than ``max_length`` or the model's
positions), run through ``reduce(output, mask)`` under ``jit``, and returned in the original order.

The forward pass is jitted once per process (``jit_once``) with the model module and ``reduce`` as static
arguments, both hashed by value (a Linen module by its fields, ``Pooled`` by its poolings): a second call with the
same model and options reuses the compiled batches. A ``reduce`` made anew on each call (a ``lambda``, a
``functools.partial``) hashes by identity and compiles again: pass a module-level function or a frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from isojax._validate import check_texts
from isojax.data.batching import tokenize
from isojax.models import require_kind, token_types
from isojax.models.heads import pool


@dataclasses.dataclass(frozen=True)
class Pooled:
    """``reduce`` for :func:`encode`: the pooled sentence embeddings, one array for one pooling (a ``str``) or a dict
    ``{pooling: array}`` for a tuple of them (:func:`isojax.models.heads.pool`); hashable by value, so calls with
    the same poolings share one compiled function."""

    poolings: str | tuple[str, ...]

    def __call__(self, output, mask):
        if isinstance(self.poolings, str):
            return pool(output, mask, self.poolings)
        return {p: pool(output, mask, p) for p in self.poolings}


@functools.cache
def jit_once(fn: Callable, static_argnames: tuple[str, ...] = ()) -> Callable:
    """``jax.jit(fn, static_argnames=...)``, made at the first call and then the same object every time, so its
    compilation cache lasts across calls (nothing is jitted where it is defined: test_bad_input's rule)."""
    return jax.jit(fn, static_argnames=static_argnames)


def _forward(params, ids, mask, types, *, module, reduce, output_attentions: bool = False):
    """``reduce(module.apply(params, ids, mask, types), mask)``, compiled once per (module, reduce, shapes) through
    ``jit_once``."""
    return reduce(module.apply({"params": params}, ids, mask, types, output_attentions=output_attentions), mask)


def encode(
    module,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    reduce: Callable | None = None,
    pooling: str = "mean",
    batch_size: int = 64,
    max_length: int = 128,
    pad_to_multiple_of: int = 16,
    progress: bool = False,
    desc: str = "encoding",
):
    """Apply ``reduce(output, mask) -> pytree of [B, ...] arrays`` to every text; return numpy, original order.

    Args:
      module: an encoder or causal LM (as :func:`isojax.from_pretrained` returns it).
      params: its params.
      tokenizer: its Hugging Face tokenizer.
      texts: ``N`` strings; a single ``str`` is a ``TypeError`` (it would be encoded character by character).
      reduce: ``reduce(output, mask)`` of a batch's model output and ``[B, L]`` bool mask, keeping the batch as the
        leading axis of each leaf; default ``Pooled(pooling)`` (:func:`isojax.models.heads.pool`). It is a static
        argument of the compiled function: one hashable by value (a module-level function, a frozen dataclass)
        is compiled once for all calls; a new ``lambda`` per call compiles each time.
      pooling: the default ``reduce``'s pooling (``"mean"``, ``"cls"``, ``"pooler"``, ``"first_last_avg"``,
        ``"last2avg"``).
      batch_size: texts per batch (batches of texts sorted by token count).
      max_length: texts are truncated to this many tokens (an integer ``>= 2``; truncation is logged).
      pad_to_multiple_of: batches are padded to a multiple of it (capped at ``max_length`` and the model's
        positions), so only a few shapes are compiled.
      progress: show a ``tqdm`` progress bar.
      desc: the progress bar's description.

    Returns:
      ``reduce``'s pytree with numpy leaves ``[N, ...]`` in the order of ``texts``; by default the ``[N, H]``
      float32 sentence embeddings.

    Raises:
      ValueError: ``texts`` is empty, ``max_length`` is not an integer ``>= 2``, ``pad_to_multiple_of`` is not a
        positive integer, or a text still holds more tokens after truncation than the model has positions.

    Examples:
      The default embedding is the mean of the last layer over a text's real tokens, whatever the padding of its batch:

      >>> import numpy as np
      >>> from isojax.models import from_pretrained
      >>> module, params, tokenizer = from_pretrained("default")
      >>> emb = encode(module, params, tokenizer, ["A man is playing a guitar.", "Hi"])
      >>> emb.shape, emb.dtype
      ((2, 384), dtype('float32'))
      >>> alone = tokenizer(["Hi"], return_tensors="np")  # [CLS] hi [SEP], no padding
      >>> h = jax.jit(module.apply)({"params": params}, alone["input_ids"], alone["attention_mask"]).last_hidden_state
      >>> np.allclose(emb[1], np.asarray(h[0]).mean(0), atol=1e-5)
      True
    """
    if reduce is None:
        reduce = Pooled(pooling)
    chunks, order = [], []
    for idx, _, _, out in encoded_batches(
        module,
        params,
        tokenizer,
        texts,
        reduce=reduce,
        batch_size=batch_size,
        max_length=max_length,
        pad_to_multiple_of=pad_to_multiple_of,
        progress=progress,
        desc=desc,
    ):
        chunks.append(jax.device_get(out))
        order.append(idx)
    stacked = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
    inverse = np.argsort(np.concatenate(order))
    return jax.tree.map(lambda x: x[inverse], stacked)


def encoded_batches(
    module,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    reduce: Callable,
    batch_size: int = 64,
    max_length: int = 128,
    pad_to_multiple_of: int = 16,
    progress: bool = False,
    desc: str = "encoding",
    output_attentions: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, Any]]:
    """The batches of :func:`encode` one at a time, as ``(indices into texts [B], input_ids [B, W], mask [B, W] bool,
    reduce's output on the device)``, in length-sorted order (arguments and errors as for :func:`encode`).

    Nothing is kept between batches, so a consumer that folds each into a running statistic (as
    :func:`isojax.eval.analysis.analyze_layers` does) holds one batch at a time, whatever the number of texts.
    With ``output_attentions`` the output ``reduce`` reads carries the attention probabilities.
    """
    texts = check_texts(texts)
    require_kind(module.config, ("encoder", "causal_lm"), "encoding texts")
    if not len(texts):
        raise ValueError("texts is empty")
    if not isinstance(pad_to_multiple_of, int) or isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be a positive integer, got {pad_to_multiple_of!r}")
    enc = tokenize(tokenizer, list(texts), max_length=max_length)
    lengths = enc["attention_mask"].sum(1)
    positions, widest = module.config.max_sequence_length, enc["input_ids"].shape[1]
    if widest > positions:
        raise ValueError(
            f"texts: the longest holds {widest} tokens after truncation to max_length={max_length}, more than the "
            f"{positions} positions of this {module.config.model_type} model; pass max_length <= {positions}"
        )
    fn = functools.partial(
        jit_once(_forward, ("module", "reduce", "output_attentions")),
        module=module,
        reduce=reduce,
        output_attentions=output_attentions,
    )

    def round_up(n: int) -> int:  # to the multiple of pad_to_multiple_of, within max_length and the positions
        return min(-(-n // pad_to_multiple_of) * pad_to_multiple_of, max_length, positions)

    pad_id = 0 if tokenizer.pad_token_id is None else tokenizer.pad_token_id  # masked out either way
    fills = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
    enc = {k: np.pad(v, ((0, 0), (0, round_up(widest) - widest)), constant_values=fills[k]) for k, v in enc.items()}
    order = np.argsort(lengths, kind="stable")
    with tqdm(total=int(lengths.sum()), desc=desc, unit="tok", unit_scale=True, disable=not progress) as bar:
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            width = round_up(int(lengths[idx].max()))
            ids, mask, types = (enc[k][idx, :width] for k in ("input_ids", "attention_mask", "token_type_ids"))
            mask = mask.astype(bool)
            yield idx, ids, mask, fn(params, ids, mask, token_types(module.config, types))
            bar.update(int(lengths[idx].sum()))  # real tokens: the bar's rate is tokens/s
