"""The same training steps on 1 device, on 8 virtual devices under the mesh (data, data x model, FSDP), and
under the pmap placement give the same losses and parameters.

References: the single-device run (no collectives, no sharding) is the reference of the parallel runs;
the pmap placement's per-device view of the objective is checked against ``jax.value_and_grad`` of the same
objective evaluated on the whole batch on one device.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from isojax import losses
from isojax.models import TransformerConfig, build_encoder, partition_rules
from isojax.train.model import HEAD_PARTITION_RULES, TaskModel, init_variables
from isojax.train.objective import Objective, Regularizer
from isojax.train.optim import make_optimizer
from isojax.train.parallel import make_runner, partition_spec
from isojax.train.state import create_state
from isojax.train.step import make_predict_step, make_train_step, per_device_view

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")

B, L, STEPS = 16, 12, 3


def _batch(i):
    r = np.random.default_rng(i)
    lengths = r.integers(3, L + 1, B)
    mask = (np.arange(L) < lengths[:, None]).astype(np.int32)
    return {
        "input_ids": (r.integers(1, 90, (B, L)) * mask).astype(np.int32),
        "attention_mask": mask,
        "token_type_ids": np.zeros((B, L), np.int32),
        "labels": r.integers(0, 3, B).astype(np.int32),
    }


def _setup(dropout: float, *, isotropy: bool = True):
    cfg = TransformerConfig(
        vocab_size=90,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    encoder = build_encoder(cfg)
    model = TaskModel(encoder, num_labels=3, dropout_rate=dropout, use_isobn=isotropy)
    params = encoder.init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = init_variables(model, params, jax.random.key(2))
    # a batch-level regulariser ([CLS]), one on masked token states, one on the parameters (embedding matrix)
    objective = Objective(
        3,
        (
            Regularizer("isoscore", 0.5, "cls"),
            Regularizer("istar", 0.3, "tokens"),
            Regularizer("cosine", 2.0, "embedding"),
        )
        if isotropy
        else (),
    )
    optimizer = make_optimizer(
        variables["params"],
        learning_rate=3e-3,
        transform_learning_rate=1e-2,
        weight_decay=0.01,
        total_updates=STEPS,
        warmup_steps=1,
    )
    state = create_state(variables, optimizer, seed=0)
    return model, objective, optimizer, state


def _run(setup, mode, devices, model_parallel=1, fsdp=False, *, predict=make_predict_step, batch=None):
    """``STEPS`` steps of ``setup`` (model, objective, optimiser, state) on ``batch(i)`` (default :func:`_batch`)
    with ``predict(model)`` as the runner's prediction: ``(history of the metrics, host state, runner, placed
    state)``."""
    batch = batch or _batch
    model, objective, optimizer, state = setup
    runner = make_runner(
        mode,
        num_devices=devices,
        model_parallel=model_parallel,
        fsdp=fsdp,
        make_step=functools.partial(make_train_step, model, objective, optimizer),
        predict=predict(model),
        abstract_state=jax.eval_shape(lambda: state),
        partition_rules=model.partition_rules(),
    )
    placed = runner.place(state)
    history = []
    for i in range(STEPS):
        placed, metrics = runner.train(placed, batch(i))
        history.append({k: float(v) for k, v in runner.host(metrics).items()})
    return history, runner.host(placed), runner, placed


def assert_same_training(history, ref_history, state, ref_state):
    """Every logged metric of every step within 1e-5 (relative above 1) of the reference run's, the final parameters
    within 1e-5, and the reference run did train."""
    for got, want in zip(history, ref_history, strict=True):
        for key in want:
            assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), (key, got[key], want[key])
    assert ref_history[-1]["loss"] != ref_history[0]["loss"]
    chex.assert_trees_all_close(state.params, ref_state.params, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def no_dropout():
    setup = _setup(0.0)
    placements = (("mesh", 1), ("mesh", 8), ("mesh", 8, 2), ("mesh", 8, 1, True), ("pmap", 8))
    return setup, {args: _run(setup, *args) for args in placements}


@pytest.mark.parametrize(
    "args",
    [("mesh", 8), ("mesh", 8, 2), ("mesh", 8, 1, True), ("pmap", 8)],
    ids=["mesh8", "mesh4x2", "fsdp8", "pmap8"],
)
@pytest.mark.slow
def test_losses_and_params_match_single_device(no_dropout, args):
    _, runs = no_dropout
    ref_history, ref_state, _, _ = runs[("mesh", 1)]
    history, state, _, _ = runs[args]
    terms = {"loss", "task", "isoscore@cls", "istar@tokens", "cosine@embedding", "grad_norm"}
    assert set(history[0]) == terms | {"isobn/std_min", "isobn/std_max"}  # IsoBN's learnt state too
    assert_same_training(history, ref_history, state, ref_state)
    chex.assert_trees_all_close(state.batch_stats, ref_state.batch_stats, atol=1e-5, rtol=1e-5)
    assert int(state.step) == STEPS


def test_model_axis_shards_params_and_optimizer_moments_megatron_style(no_dropout):
    _, runs = no_dropout
    _, _, runner, placed = runs[("mesh", 8, 2)]
    layer = placed.params["encoder"]["encoder"]["layer_0"]
    spec = lambda a: a.sharding.spec  # noqa: E731
    assert spec(layer["attention"]["query"]["kernel"]) == P(None, "model")
    assert spec(layer["attention"]["output"]["kernel"]) == P("model", None)
    assert spec(layer["intermediate"]["kernel"]) == P(None, "model")
    assert spec(layer["output"]["kernel"]) == P("model", None)
    assert spec(layer["output"]["bias"]) == P()
    assert spec(placed.params["encoder"]["embeddings"]["word_embeddings"]["embedding"]) == P()
    # Adam's first moment of the query kernel follows the kernel
    mu = [
        x
        for path, x in jax.tree_util.tree_leaves_with_path(placed.opt_state)
        if "query" in jax.tree_util.keystr(path) and "kernel" in jax.tree_util.keystr(path)
    ]
    assert mu and all(spec(x) == P(None, "model") for x in mu)
    assert runner.mesh.shape == {"data": 4, "model": 2}


def test_partition_spec_replicates_when_the_model_axis_does_not_divide(caplog):
    rules = partition_rules(TransformerConfig()) + HEAD_PARTITION_RULES
    assert partition_spec("encoder/layer_0/attention/key/kernel", (16, 16), 2, rules) == P(None, "model")
    assert partition_spec("encoder/layer_0/attention/key/kernel", (16, 16), 1, rules) == P()
    assert partition_spec("head/classifier/kernel", (16, 3), 2, rules) == P()
    assert not caplog.records
    assert partition_spec("encoder/layer_0/attention/key/kernel", (16, 15), 2, rules) == P()
    assert "does not divide" in caplog.text and "attention/key/kernel" in caplog.text


def test_a_parameter_without_a_partition_rule_is_an_error():
    rules = partition_rules(TransformerConfig())
    with pytest.raises(ValueError, match="no partition rule names parameter 'encoder/layer_0/adapter/kernel'"):
        partition_spec("encoder/layer_0/adapter/kernel", (16, 16), 2, rules)
    assert partition_spec("opt_state/0/count", (), 2, rules, strict=False) == P()


@pytest.mark.slow
def test_dropout_mesh_matches_single_device_and_pmap_runs():
    """With dropout, the mesh draws the global batch's masks from the step key (the same on any number of
    devices); pmap draws each device's masks from fold_in(key, device), so it trains but on other masks.
    (Task loss only: the regularisers' paths are covered above.)"""
    setup = _setup(0.2, isotropy=False)
    one, _, _, _ = _run(setup, "mesh", 1)
    eight, _, _, _ = _run(setup, "mesh", 8)
    pmapped, state, _, _ = _run(setup, "pmap", 8)
    for got, want in zip(eight, one):
        assert abs(got["loss"] - want["loss"]) <= 1e-5 * max(1.0, abs(want["loss"]))
    assert all(np.isfinite(h["loss"]) for h in pmapped)
    assert pmapped[0]["loss"] != pytest.approx(one[0]["loss"], abs=1e-6)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))


@pytest.mark.slow
def test_mesh_fsdp_and_pmap_placements_give_the_same_losses(no_dropout):
    """The 8-device placements of one step agree with each other step by step (no dropout), within 1e-5."""
    _, runs = no_dropout
    mesh, _, _, _ = runs[("mesh", 8)]
    for args in (("mesh", 8, 1, True), ("pmap", 8)):
        history, _, _, _ = runs[args]
        for got, want in zip(history, mesh, strict=True):
            assert abs(got["loss"] - want["loss"]) <= 1e-5, (args, got["loss"], want["loss"])


def test_the_pmap_placements_view_gives_the_global_value_and_gradient():
    """Inside shard_map over 8 devices, the objective of per_device_view (a task loss, a whole-batch regulariser
    and a term of the parameters alone) and the psum of the devices' gradients equal the value and gradient of the
    same objective of the whole batch on one device."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(16, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=16), jnp.float32)
    w0 = jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)

    def objective(out, w, labels):
        task = jnp.mean((out["h"][:, 0] - labels) ** 2)
        return task + losses.isoscore_loss(out["cls"]) + 0.1 * jnp.sum(w**2)

    def model(w, x):
        h = x @ w
        return {"h": h, "cls": jnp.tanh(h)}

    want_value, want_grad = jax.value_and_grad(lambda w: objective(model(w, x), w, y))(w0)

    def per_device(w, x, y):
        value, grad = jax.value_and_grad(lambda w: objective(*per_device_view(model(w, x), w, y, "d")))(w)
        return value, jax.lax.psum(grad, "d")

    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    spmd = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P(), check_vma=False)
    value, grad = jax.jit(spmd)(w0, x, y)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), atol=1e-5)
