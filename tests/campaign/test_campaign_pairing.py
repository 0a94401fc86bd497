"""What pairs two runs of the campaign (experiments/reproductions/glue_pairing.py): the dropout masks' fingerprint
and the pair key of a run's record."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from experiments.reproductions import glue_pairing

RECORDS = Path(__file__).resolve().parents[2] / "experiments" / "results" / "glue_methods_runs"


def test_mask_fingerprint_follows_the_masks_not_the_arithmetic(monkeypatch):
    """Other weights change every activation (as another device's arithmetic changes them a little) but not the
    fingerprint; another mask generator at the same rate changes it."""
    masks = glue_pairing.dropout_masks()
    assert glue_pairing.dropout_masks() == masks  # deterministic
    assert glue_pairing.dropout_masks(weights_seed=1) == masks
    from isojax.models import dropout

    original = dropout.bernoulli_mask
    monkeypatch.setattr(
        dropout, "bernoulli_mask", lambda key, keep, shape: original(jax.random.fold_in(key, 1), keep, shape)
    )  # other masks, same rate
    assert glue_pairing.dropout_masks() != masks


def test_the_current_code_draws_the_masks_of_the_committed_runs():
    """A new run pairs with the committed CPU campaign's: the code draws the masks their records name."""
    recorded = {
        json.loads(p.read_text())["pairing"].get("dropout_masks")
        for p in RECORDS.glob("appB/cola/*/seed*/campaign.json")
    }
    assert recorded == {glue_pairing.dropout_masks()}, (
        f"the encoder now draws other masks ({glue_pairing.dropout_masks()}) than the committed runs ({recorded}): "
        "runs of this code no longer pair with them"
    )


def test_pair_key_is_the_mask_fingerprint_else_the_commit():
    key = glue_pairing.pair_key
    assert key({"pairing": {"dropout_masks": "0123456789ab"}, "commit": "4f6c0e6"}) == "masks 0123456789ab"
    assert key({"pairing": {"dropout_masks": None}, "commit": "4f6c0e6"}) == "commit 4f6c0e6"
    assert key({"commit": "4f6c0e6"}) == "commit 4f6c0e6"
