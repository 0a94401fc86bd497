"""The paired design of the GLUE campaign: what makes two runs of one (protocol, task, seed) a pair, and the paired
t-test over such pairs.

Within one protocol and seed, every ``isojax finetune`` run

- sees the same batches: epoch ``e`` is the permutation ``numpy.random.default_rng([seed, e])`` of the training
  rows, cut into batches of the protocol's size, the last partial batch dropped
  (:func:`isojax.train.feed.batch_indices`); no method changes it;
- draws the dropout masks of step ``t`` from ``fold_in(key(seed), t)`` (:func:`isojax.train.step.make_train_step`);
  Flax derives each dropout site's key from that key and the site's module path, so two models with the same
  dropout sites draw the same masks (``tests/campaign/test_campaign_runs.py`` checks it on a baseline and a regulariser
  run). The regularisers change only the loss, so a regulariser run and its baseline are paired in data order
  and masks. SoftDecay, IsoBN, the flow and the Isotropy Layer change the model: their runs share the data
  order and the per-site keys with the baseline, but the masks act on other activations, so the pairing is
  weaker (the report marks them).

Pairing also needs the same dropout masks. Each run records :func:`dropout_masks`, a fingerprint of the masks a
small encoder draws for a fixed key, which the device's arithmetic does not change, so that runs on a CPU and on a
GPU can pair; runs pair only when their pair keys agree (:func:`pair_key`): the fingerprint, or for a record without
one, its commit.
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np
import scipy.stats

from isojax.train.config import TrainConfig

MODEL_CHANGES = {
    "softdecay": "SoftDecay transform",
    "isobn": "IsoBN layer",
    "flow": "flow before the head",
    "isotropy_layer": "Isotropy Layer (stage 2)",
}


def _small_encoder_in_training(weights_seed: int, interceptor=None):
    """A 2-layer, 16-wide BERT (weights from ``key(weights_seed)``) run in training mode with the dropout key
    ``fold_in(key(0), 1)``, under a Flax method ``interceptor``; its last hidden state as float64."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from isojax.models import TransformerConfig, build_encoder

    config = TransformerConfig(
        vocab_size=8,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    module = build_encoder(config, add_pooling_layer=False)
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 8
    params = module.init(jax.random.key(weights_seed), ids)["params"]
    with nn.intercept_methods(interceptor) if interceptor else contextlib.nullcontext():
        out = module.apply(
            {"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.fold_in(jax.random.key(0), 1)}
        )
    return np.asarray(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0], np.float64)


def dropout_masks(weights_seed: int = 0) -> str:
    """Fingerprint of the dropout masks themselves: the same small encoder in training mode, every dropout site's
    pattern of dropped entries (output 0 where the input was not), in call order, packed into bits and hashed.
    The device's arithmetic and the weights (``weights_seed``) do not change it; which entries are dropped
    (the mask generator, the per-site keys, the sites) does; a site that applies its mask itself (attention) gives
    the entries its keep mask drops."""
    from isojax.models.dropout import Dropout

    patterns, applying = [], []

    def record(next_fun, args, kwargs, context):
        dropout = isinstance(context.module, Dropout)
        if dropout and context.method_name == "__call__":
            applying.append(True)
            try:
                out = next_fun(*args, **kwargs)
            finally:
                applying.pop()
            patterns.append(np.asarray((out == 0) & (args[0] != 0)).ravel())
            return out
        out = next_fun(*args, **kwargs)
        if dropout and context.method_name == "keep_mask" and not applying and out is not None:
            # a site that applies the mask itself (attention, over softmax weights, which are nonzero here)
            patterns.append(np.asarray(~out).ravel())
        return out

    _small_encoder_in_training(weights_seed, record)
    return hashlib.sha256(np.packbits(np.concatenate(patterns)).tobytes()).hexdigest()[:12]


def pairing_record(config: TrainConfig, commit: str, masks: str | None) -> dict:
    """What pairs a run (its configuration) with the other runs of its protocol, task and seed (module docstring),
    for its record."""
    change = MODEL_CHANGES.get(config.method.name)
    seed = config.seed
    return {
        "data_order": f"numpy.random.default_rng([{seed}, epoch]) permutation, batches of {config.optim.batch_size}, "
        "last partial batch dropped",
        "dropout_key": f"fold_in(key({seed}), step), per site by Flax module path",
        "dropout_masks": masks,
        "commit": commit,
        "model_change": change,  # None: the baseline's model and dropout sites
    }


def pair_key(record: dict) -> str:
    """What a run's dropout masks are known by: its mask fingerprint (:func:`dropout_masks`), else its commit."""
    masks = (record.get("pairing") or {}).get("dropout_masks")
    return f"masks {masks}" if masks else f"commit {record.get('commit')}"


def without_spread(values) -> bool:
    """Whether ``values`` are all equal up to float64 round-off (a spread of at most 1e-9 of their magnitude).
    Equal dev scores can differ in the last bits when they come by different sums (100 * 17/71 - 100 * 16/71 and
    100 * 21/71 - 100 * 20/71 differ by 3.6e-15), and a t-test reads such a spread as certainty: one more right
    answer in every seed would get p ~ 1e-30."""
    values = np.asarray(values, np.float64)
    return bool(np.ptp(values) <= 1e-9 * max(1.0, float(np.abs(values).max())))


def paired_ttest(a: dict, b: dict) -> tuple[float | None, list]:
    """Paired t-test (``scipy.stats.ttest_rel``) of ``a`` against ``b``, each ``{seed: (value, pair key)}``, over
    the seeds both have with the same pair key; returns (p-value or None when fewer than 2 pairs or the
    differences are all equal (:func:`without_spread`), the seeds used)."""
    seeds = sorted(s for s in a if s in b and a[s][1] == b[s][1])
    x = np.asarray([a[s][0] for s in seeds], np.float64)
    y = np.asarray([b[s][0] for s in seeds], np.float64)
    if len(seeds) < 2 or without_spread(x - y):
        return None, seeds
    return float(scipy.stats.ttest_rel(x, y).pvalue), seeds
