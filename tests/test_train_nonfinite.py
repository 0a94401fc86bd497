"""A training step whose loss or gradient is not finite leaves no trace in the state but its counters; checkpoints
never hold a non-finite state; a checkpoint written before the counters existed is refused by name, not restored
or set aside.

References: the state before the poisoned step (parameters, optimiser state, IsoBN statistics and balancer must be
bitwise the same after it), and a run that never saw the poisoned batch (the next clean step must give bitwise the
state it gives there). The run-level behaviour (stop after N in a row, the checkpoint on disk, the resume) is in
tests/test_train_loop.py.
"""

import dataclasses
import functools
import re
import warnings
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax.models import TransformerConfig, build_encoder
from isojax.train.checkpoint import Checkpoints, nonfinite_arrays
from isojax.train.model import TaskModel, init_variables
from isojax.train.objective import Objective, Regularizer
from isojax.train.optim import make_optimizer
from isojax.train.parallel import make_runner
from isojax.train.state import create_state
from isojax.train.step import make_predict_step, make_train_step

B, L, VOCAB = 16, 12, 90
GUARDED = ("params", "opt_state", "batch_stats", "balancer")


def _batch(i, *, poison: bool = False):
    r = np.random.default_rng(i)
    lengths = r.integers(3, L + 1, B)
    mask = (np.arange(L) < lengths[:, None]).astype(np.int32)
    ids = (r.integers(1, VOCAB, (B, L)) * mask).astype(np.int32)
    if poison:  # an id past the vocabulary: its embedding is NaN (isojax.models.embeddings.Embed), so is the loss
        ids[0, 1] = VOCAB
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": np.zeros((B, L), np.int32),
        "labels": r.integers(0, 3, B).astype(np.int32),
    }


@pytest.fixture(scope="module")
def setup():
    """A 1-layer classifier with IsoBN (batch statistics), dropout, and a balanced joint loss (balancer state)."""
    cfg = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    encoder = build_encoder(cfg)
    model = TaskModel(encoder, num_labels=3, dropout_rate=0.1, use_isobn=True)
    params = encoder.init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = init_variables(model, params, jax.random.key(2))
    objective = Objective(3, (Regularizer("isoscore", 0.5, "cls"),), combine="balanced")
    optimizer = make_optimizer(
        variables["params"],
        learning_rate=3e-3,
        transform_learning_rate=1e-2,
        weight_decay=0.01,
        total_updates=3,
        warmup_steps=1,
    )
    return model, objective, optimizer, create_state(variables, optimizer, seed=0)


def _runner(setup, mode, devices):
    model, objective, optimizer, state = setup
    return make_runner(
        mode,
        num_devices=devices,
        model_parallel=1,
        make_step=functools.partial(make_train_step, model, objective, optimizer),
        predict=make_predict_step(model),
        abstract_state=jax.eval_shape(lambda: state),
        partition_rules=model.partition_rules(),
    )


def _assert_equal(got, want, fields=GUARDED):
    for name in fields:
        jax.tree.map(np.testing.assert_array_equal, getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("mode, devices", [("mesh", 1), ("pmap", 8)])
def test_a_nonfinite_step_is_skipped_and_counted(setup, mode, devices):
    """Under the pmap placement the poisoned row is on device 0 only: every device skips, and the devices' copies of
    the replicated state stay equal."""
    if jax.device_count() < devices:
        pytest.skip(f"needs {devices} devices")
    runner = _runner(setup, mode, devices)
    first, _ = runner.train(runner.place(setup[3]), _batch(0))
    before = runner.host(first)
    skipped, metrics = runner.train(first, _batch(1, poison=True))
    if mode == "pmap":  # every device's copy of every array is the same
        for x in jax.tree.leaves(skipped):
            copies = [np.asarray(shard.data) for shard in x.addressable_shards]
            assert len(copies) == devices and all(np.array_equal(c, copies[0], equal_nan=True) for c in copies)
    after = runner.host(skipped)
    metrics = runner.host(metrics)
    assert not np.isfinite(metrics["loss"]) and not np.isfinite(metrics["grad_norm"])
    _assert_equal(after, before)
    assert (int(after.step), int(after.nonfinite_steps), int(after.nonfinite_streak)) == (2, 1, 1)
    assert (int(before.nonfinite_steps), int(before.nonfinite_streak)) == (0, 0)

    # the next clean step computes what it computes in a run that never met the poisoned batch (same step count)
    resumed, _ = runner.train(skipped, _batch(2))
    resumed = runner.host(resumed)
    reference, _ = runner.train(runner.place(before.replace(step=before.step + 1)), _batch(2))
    reference = runner.host(reference)
    _assert_equal(resumed, reference, GUARDED + ("step",))
    assert (int(resumed.nonfinite_steps), int(resumed.nonfinite_streak)) == (1, 0)
    assert not nonfinite_arrays(resumed)
    head, head_before = resumed.params["head"]["classifier"], before.params["head"]["classifier"]
    assert np.abs(head["kernel"] - head_before["kernel"]).max() > 0  # it did train


def test_the_guarded_step_updates_the_donated_state_in_place(setup):
    """The skip test costs no copy of the state: in the compiled step (state donated) no instruction of the entry
    computation copies a parameter or optimiser-state array (a select between the new and the old state made XLA
    copy every moment first)."""
    model, objective, optimizer, state = setup
    step = jax.jit(make_train_step(model, objective, optimizer), donate_argnums=0)
    hlo = step.lower(state, _batch(0)).compile().as_text()
    entry = hlo[hlo.index("\nENTRY") :]
    copied = re.findall(r"= \w+\[\d[\d,]*\]\S* copy\(%(state\S*?)[.)]", entry)  # arrays, not the step count
    assert "= f32" in entry and not copied, copied


def test_a_nonfinite_state_is_never_saved(setup, tmp_path):
    state = setup[3]
    head = state.params["head"]["classifier"]
    bad = state.replace(
        params={**state.params, "head": {"classifier": {**head, "bias": head["bias"].at[1].set(jnp.inf)}}}
    )
    with Checkpoints(str(tmp_path)) as checkpoints:
        with pytest.raises(
            ValueError,
            match=r"refusing to checkpoint step 3 .*non-finite values in "
            r"params/head/classifier/bias$",
        ):
            checkpoints.save(3, bad, {"stage": 0})
        assert checkpoints.save(2, state, {"stage": 0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2"]


@flax.struct.dataclass
class _StateBeforeCounters:
    """:class:`TrainState` as checkpoints were written before the skipped-step counters."""

    step: jax.Array
    params: Any
    opt_state: Any
    batch_stats: Any
    balancer: Any
    rng: jax.Array
    constants: Any = flax.struct.field(default_factory=dict)


def test_a_checkpoint_without_the_counters_is_refused_by_name(setup, tmp_path):
    """A checkpoint of an older isojax (no skipped-step counters) raises a ValueError naming the missing fields; it
    is not taken for an unreadable one (no warning, not moved aside, no fall-back to a fresh start)."""
    state = setup[3].replace(step=jnp.asarray(5, jnp.int32))
    old = _StateBeforeCounters(**{f.name: getattr(state, f.name) for f in dataclasses.fields(_StateBeforeCounters)})
    with Checkpoints(str(tmp_path)) as checkpoints:
        checkpoints.save(5, old, {"stage": 0})
    runner = _runner(setup, "mesh", 1)
    with Checkpoints(str(tmp_path)) as checkpoints, warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"step 5 .* has no nonfinite_steps, nonfinite_streak: .* older isojax"):
            checkpoints.restore_latest(lambda meta: runner.restore_target(jax.eval_shape(lambda: state)))
        assert checkpoints.steps() == [5]
