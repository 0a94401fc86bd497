"""Run an encoder over a list of texts in length-sorted, jit-compiled batches.

Texts are sorted by token count, batched, padded to a multiple of ``pad_to_multiple_of`` (so only a few shapes
are compiled), run through ``reduce(output, mask)`` under ``jit``, and returned in the original order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from isojax._validate import check_texts
from isojax.models import require_kind, token_types
from isojax.models.heads import pool


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

    Default ``reduce`` is :func:`isojax.models.heads.pool` with ``pooling`` -> ``[N, H]`` sentence embeddings.
    ``reduce`` must keep the batch as the leading axis of each leaf. ``texts`` is a sequence of strings: a single
    ``str`` is a ``TypeError`` (it would be encoded character by character).
    """
    texts = check_texts(texts)
    require_kind(module.config, ("encoder", "causal_lm"), "encoding texts")
    if not len(texts):
        raise ValueError("texts is empty")
    if reduce is None:
        reduce = lambda out, mask: pool(out, mask, pooling)  # noqa: E731
    fn = jax.jit(lambda p, ids, mask, types: reduce(module.apply({"params": p}, ids, mask, types), mask))
    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    chunks = []
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, disable=not progress):
        idx = order[start : start + batch_size]
        enc = tokenizer(
            [texts[i] for i in idx],
            padding=True,
            truncation=True,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            return_tensors="np",
        )
        types = token_types(module.config, enc.get("token_type_ids"))
        chunks.append(jax.device_get(fn(params, enc["input_ids"], enc["attention_mask"].astype(bool), types)))
    stacked = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
    inverse = np.argsort(order)
    return jax.tree.map(lambda x: x[inverse], stacked)
