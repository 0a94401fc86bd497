"""What pairs two runs of the campaign (experiments/reproductions/glue_pairing.py): the dropout masks' fingerprint,
the stream the current code draws, and the pair key of a run's record."""

from __future__ import annotations

import jax
import pytest

from experiments.reproductions import glue_pairing


def test_mask_fingerprint_follows_the_masks_not_the_arithmetic(monkeypatch):
    """Other weights change every activation (as another device's arithmetic changes them a little): the older
    stream changes, the mask fingerprint does not; another mask generator at the same rate changes both."""
    stream, masks = glue_pairing.dropout_stream(), glue_pairing.dropout_masks()
    assert (stream, masks) == (glue_pairing.dropout_stream(), glue_pairing.dropout_masks())  # deterministic
    assert glue_pairing.dropout_masks(weights_seed=1) == masks and glue_pairing.dropout_stream(weights_seed=1) != stream
    from isojax.models import dropout

    original = dropout.bernoulli_mask
    monkeypatch.setattr(
        dropout, "bernoulli_mask", lambda key, keep, shape: original(jax.random.fold_in(key, 1), keep, shape)
    )  # other masks, same rate
    assert glue_pairing.dropout_stream() != stream and glue_pairing.dropout_masks() != masks


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the older stream of this code was recorded on CPU")
def test_the_current_code_draws_the_masks_its_cpu_stream_is_mapped_to():
    assert glue_pairing.STREAM_OF_MASKS.get(glue_pairing.dropout_masks()) == glue_pairing.dropout_stream(), (
        "the encoder now draws other masks than the code STREAM_OF_MASKS maps: runs of this code no longer pair "
        "with the records of that stream"
    )


def test_pair_key_prefers_the_masks_and_maps_them_to_the_older_stream():
    (masks, stream), key = next(iter(glue_pairing.STREAM_OF_MASKS.items())), glue_pairing.pair_key
    assert key({"pairing": {"dropout_stream": "d7ee28911d1c", "dropout_masks": masks}}) == stream  # a GPU run
    assert key({"pairing": {"dropout_stream": stream}}) == stream  # a CPU record made before mask fingerprints
    assert key({"pairing": {"dropout_stream": stream, "dropout_masks": "0123456789ab"}}) == "masks 0123456789ab"
    assert key({"commit": "4f6c0e6"}) == "commit 4f6c0e6"
