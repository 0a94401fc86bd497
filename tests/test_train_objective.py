"""The training objective and the optimiser.

References: numpy log-softmax cross-entropy and squared error; numpy pairwise cosines on the real rows;
the ``isoscore`` package (Rudman et al.) for IsoScore; ``ripser`` 0-dim barcodes for persistent entropy;
numpy SVD for c1="auto"; closed forms of the balancer's first steps, of Adam's first update
(``-lr * sign(g)``) and of the warm-up/decay schedule; numpy closed forms of the weight schedules and optax's own
schedules, with ``isojax.losses`` on the step's outputs for the scheduled loss.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import read_json, read_jsonl, require, save_tiny_encoder

from isojax import losses
from isojax.models import TransformerConfig, build_encoder
from isojax.train import fit
from isojax.train.cli import config_from_argv
from isojax.train.config import MethodConfig, TrainConfig
from isojax.train.hyperparams import StepSchedule
from isojax.train.methods import RegularizerSpec
from isojax.train.model import TaskModel, TaskOutput, init_variables
from isojax.train.objective import (
    Objective,
    Regularizer,
    class_ids,
    parse_regularizer,
    resolve_auto_options,
    task_losses,
)
from isojax.train.optim import make_optimizer, param_labels, schedule
from isojax.train.state import create_state
from isojax.train.step import make_train_step

RNG = np.random.default_rng(0)
N, H, V = 14, 6, 40


def _output(num_labels=3, seq=5):
    mask = np.arange(seq) < RNG.integers(2, seq + 1, N)[:, None]
    f = lambda *s: jnp.asarray(RNG.normal(size=s), jnp.float32)  # noqa: E731
    return TaskOutput(
        logits=f(N, num_labels),
        cls=f(N, H),
        pooler=None,
        sentence=f(N, H),
        head_input=f(N, H),
        tokens=f(N, seq, H),
        mask=jnp.asarray(mask),
    )


PARAMS = {
    "encoder": {
        "embeddings": {"word_embeddings": {"embedding": jnp.asarray(RNG.normal(size=(V, H)) + 0.5, jnp.float32)}}
    }
}


def _mean_offdiag_cosine(x):
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = u @ u.T
    n = len(x)
    return (c.sum() - np.trace(c)) / n**2  # Gao et al.: 1/|V|^2 sum_{i != j}


def _entropy_of_bars(points):
    bars = require("ripser").ripser(points, maxdim=0)["dgms"][0][:, 1]
    bars = bars[np.isfinite(bars)]
    p = bars / bars.sum()
    return -np.sum(p * np.log(p))


def test_task_losses_match_numpy():
    out = _output()
    labels = RNG.integers(0, 3, N)
    logits = np.asarray(out.logits, np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(
        task_losses(out.logits, jnp.asarray(labels), 3), -log_softmax[np.arange(N), labels], rtol=1e-5
    )
    scores = RNG.uniform(0, 5, N).astype(np.float32)
    np.testing.assert_allclose(
        task_losses(out.logits[:, :1], jnp.asarray(scores), 1), (logits[:, 0] - scores) ** 2, rtol=1e-5
    )


def test_sum_objective_terms_and_weights():
    out = _output()
    labels = jnp.asarray(RNG.integers(0, 3, N))
    obj = Objective(
        3,
        (Regularizer("cosine", 2.0), Regularizer("isoscore", 0.5, "head_input"), Regularizer("cosine", 1.5, "tokens")),
    )
    loss, terms, _ = obj(out, PARAMS, labels, losses.balancer_init(2))
    w = np.asarray(PARAMS["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    np.testing.assert_allclose(terms["cosine@embedding"], _mean_offdiag_cosine(w), rtol=1e-5)
    iso = float(require("IsoScore.IsoScore").IsoScore(np.asarray(out.head_input, np.float64)))
    np.testing.assert_allclose(terms["isoscore@head_input"], -np.log(iso + 1e-6), rtol=1e-4)
    real_tokens = np.asarray(out.tokens)[np.asarray(out.mask)]  # padding tokens are left out of the cloud
    np.testing.assert_allclose(
        terms["cosine@tokens"], _mean_offdiag_cosine(real_tokens.astype(np.float64)), rtol=1e-4, atol=1e-6
    )
    ce = np.mean(np.asarray(task_losses(out.logits, labels, 3)))
    np.testing.assert_allclose(terms["task"], ce, rtol=1e-6)
    want = ce + 2.0 * terms["cosine@embedding"] + 0.5 * terms["isoscore@head_input"] + 1.5 * terms["cosine@tokens"]
    np.testing.assert_allclose(loss, want, rtol=1e-6)


def test_classwise_persistent_entropy_all_bars_matches_ripser():
    out = _output(num_labels=2)
    labels = np.array([0, 1] * (N // 2))
    obj = Objective(2, (Regularizer("persistent_entropy", 1.0, "cls", (("bars", "all"),)),))
    _, terms, _ = obj(out, PARAMS, jnp.asarray(labels), losses.balancer_init(2))
    cls = np.asarray(out.cls, np.float64)
    want = -sum(_entropy_of_bars(cls[labels == c]) for c in (0, 1))
    np.testing.assert_allclose(terms["persistent_entropy@cls"], want, rtol=1e-4)


def test_regression_classes_are_score_bins():
    scores = jnp.asarray([0.0, 0.99, 1.0, 2.5, 4.99, 5.0])
    ids, n = class_ids(scores, 1, 5)
    assert n == 5
    np.testing.assert_array_equal(ids, np.clip(np.digitize(np.asarray(scores), [1, 2, 3, 4]), 0, 4))


def test_balanced_and_weighted_joint_losses():
    out = _output()
    labels = jnp.asarray(RNG.integers(0, 3, N))
    reg = (Regularizer("isoscore", 1.0, "head_input"),)
    state = losses.balancer_init(2)
    loss1, terms, state = Objective(3, reg, "balanced")(out, PARAMS, labels, state)
    l1, l2 = float(terms["task"]), float(terms["isoscore@head_input"])
    np.testing.assert_allclose(loss1, (l1 + l2) / 2, rtol=1e-6)  # first step: means := losses, so L^_i = mean
    out2 = _output()
    loss2, terms2, state = Objective(3, reg, "balanced")(out2, PARAMS, labels, state)
    m1, m2 = l1, l2  # after step k = 0 the means equal the first losses (rate s / (1 + 0) on equal values)
    a, b = float(terms2["task"]), float(terms2["isoscore@head_input"])
    lbar = (m1 + m2) / 2
    np.testing.assert_allclose(loss2, (a * lbar / m1 + b * lbar / m2) / 2, rtol=1e-5)
    assert int(state.step) == 2
    weighted, terms3, _ = Objective(3, reg, "weighted", alpha=0.3)(out, PARAMS, labels, state)
    np.testing.assert_allclose(weighted, 0.3 * terms3["task"] + 0.7 * terms3["isoscore@head_input"], rtol=1e-6)


def test_spectrum_c1_auto_is_the_top_singular_value_of_the_embeddings():
    (reg,) = resolve_auto_options((Regularizer("spectrum_pol", 1.0),), PARAMS)
    w = np.asarray(PARAMS["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    np.testing.assert_allclose(dict(reg.options)["c1"], np.linalg.svd(w, compute_uv=False)[0], rtol=1e-5)
    with pytest.raises(ValueError, match="c1='auto' needs representation 'embedding'"):
        resolve_auto_options((Regularizer("spectrum_pol", 1.0, "cls"),), PARAMS)


@pytest.mark.parametrize("name", ["spectrum_pol", "spectrum_exp"])
def test_spectrum_control_of_the_tokens_reads_only_their_real_rows(name):
    """On the token cloud a padding row takes no part, whatever it holds (NaN here, as an out-of-vocabulary id's
    embedding): the penalty is numpy's for the real rows with zero rows in the padding's place."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4))
    mask = np.array([True, True, False, True, True, False])
    poisoned = jnp.asarray(np.where(mask[:, None], x, np.nan), jnp.float32)
    got = Regularizer(name, 1.0, "tokens", (("c1", 2.0),)).fn()(poisoned, jnp.asarray(mask), None, 2)
    sigma = np.linalg.svd(np.where(mask[:, None], np.float32(x), 0.0), compute_uv=False)
    k = np.arange(1, 5)
    prior = 2.0 * k**-0.5 if name == "spectrum_pol" else 2.0 * np.exp(-0.005 * k)
    np.testing.assert_allclose(got, np.sum((sigma - prior) ** 2), rtol=1e-5)


def test_parse_regularizer():
    reg = parse_regularizer("persistent_entropy=0.25@tokens,bars=all,classwise=false,bins=3")
    assert (reg.name, reg.weight, reg.representation) == ("persistent_entropy", 0.25, "tokens")
    assert dict(reg.options) == {"bars": "all", "classwise": False, "bins": 3, "in_cluster_weight": 0.0}
    assert parse_regularizer("isoscore") == Regularizer("isoscore", 1.0, "cls")
    with pytest.raises(ValueError, match="weight 'x' is not a number"):
        parse_regularizer("isoscore=x")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Regularizer("whitening"), "unknown regulariser 'whitening'"),
        (lambda: Regularizer("isoscore", representation="embedding"), "unsupported representation 'embedding'"),
        (lambda: Regularizer("cosine", representation="logits"), "unknown or unsupported representation 'logits'"),
        (lambda: Regularizer("istar", options=(("gamma", 1.0),)), r"unknown option\(s\) \['gamma'\]"),
        (
            lambda: TrainConfig(
                method=MethodConfig(regularizers=(Regularizer("persistent_entropy", options=(("bars", "some"),)),))
            ),
            "persistent_entropy@cls: bars must be 'selected' or 'all'",
        ),
        (
            lambda: TrainConfig(method=MethodConfig(regularizers=(Regularizer("istar", options=(("zeta", 2.0),)),))),
            "zeta must be",
        ),
    ],
)
def test_bad_regularizers_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _tree(kernel, bias, theta):
    return {
        "encoder": {"layer": {"kernel": kernel, "bias": bias}, "last_layer_transform": {"theta": theta}},
        "isotropy_layer": {"dense": {"kernel": kernel}},
    }


def test_param_groups_learning_rates_and_freezing():
    params = _tree(jnp.ones((3, 2)), jnp.ones(2), jnp.zeros(()))
    labels = param_labels(params, frozen=("isotropy_layer",))
    assert (
        labels["encoder"]["layer"]["kernel"] == "model"
        and labels["encoder"]["last_layer_transform"]["theta"] == "transform"
        and labels["isotropy_layer"]["dense"]["kernel"] == "frozen"
    )
    tx = make_optimizer(
        params,
        learning_rate=0.01,
        transform_learning_rate=0.5,
        weight_decay=0.0,
        total_updates=10,
        warmup_steps=0,
        schedule_kind="constant",
        max_grad_norm=None,
        frozen=("isotropy_layer",),
    )
    grads = _tree(jnp.full((3, 2), -2.0), jnp.full(2, 3.0), jnp.asarray(0.7))
    updates, _ = tx.update(grads, tx.init(params), params)
    # Adam's first update is -lr * g / |g| (bias-corrected moments), up to eps
    np.testing.assert_allclose(updates["encoder"]["layer"]["kernel"], 0.01, rtol=1e-5)
    np.testing.assert_allclose(updates["encoder"]["layer"]["bias"], -0.01, rtol=1e-5)
    np.testing.assert_allclose(updates["encoder"]["last_layer_transform"]["theta"], -0.5, rtol=1e-5)
    np.testing.assert_array_equal(updates["isotropy_layer"]["dense"]["kernel"], 0.0)


def test_gradient_accumulation_averages_batches():
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    g1, g2 = {"w": jnp.asarray([1.0, 2.0, -3.0])}, {"w": jnp.asarray([3.0, -1.0, 1.0])}
    kwargs = dict(
        learning_rate=0.1,
        transform_learning_rate=0.1,
        weight_decay=0.0,
        total_updates=5,
        schedule_kind="constant",
        max_grad_norm=1.0,
    )
    acc = make_optimizer(params, accumulation=2, **kwargs)
    state = acc.init(params)
    u1, state = acc.update(g1, state, params)
    np.testing.assert_array_equal(u1["w"], 0.0)  # no update until the second batch
    u2, _ = acc.update(g2, state, params)
    plain = make_optimizer(params, **kwargs)
    want, _ = plain.update(jax.tree.map(lambda a, b: (a + b) / 2, g1, g2), plain.init(params), params)
    np.testing.assert_allclose(u2["w"], want["w"], rtol=1e-6)


def test_schedule_warmup_then_linear_decay():
    lr = schedule(1.0, total_updates=10, warmup_steps=4)
    got = [float(lr(k)) for k in range(11)]
    want = [k / 4 for k in range(4)] + [1 - (k - 4) / 6 for k in range(4, 11)]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert float(optax.cosine_decay_schedule(1.0, 6)(3)) == pytest.approx(float(schedule(1.0, 10, 4, "cosine")(7)))


def test_istar_with_a_data_reference_equals_the_isoscore_package():
    """I-STAR with c0='data': 1 - IsoScore*(batch; C0, zeta) with C0 the covariance of training-set embeddings,
    against the isoscore package's IsoScore_star on the same covariance."""
    train = RNG.normal(size=(200, H)) * np.linspace(0.3, 2.0, H) + 1.0
    c0 = np.cov(train, rowvar=False)
    reg = parse_regularizer("istar=1.0@cls,c0=data")
    assert reg.needs_reference
    with pytest.raises(ValueError, match=r"need a reference statistic"):
        Objective(3, (reg,))
    objective = Objective(3, (reg,), references={reg.label: jnp.asarray(c0, jnp.float32)})
    out = _output()
    value = objective.regularizer_value(reg, out, PARAMS, jnp.zeros(N, jnp.int32))
    want = require("IsoScore.IsoScore").IsoScore_star(np.asarray(out.cls, np.float64), c0, 0.2)
    np.testing.assert_allclose(float(value), 1 - float(want), rtol=1e-4)
    identity = Objective(3, (parse_regularizer("istar=1.0@cls"),))
    assert (
        abs(
            float(identity.regularizer_value(parse_regularizer("istar=1.0@cls"), out, PARAMS, jnp.zeros(N, jnp.int32)))
            - float(value)
        )
        > 1e-3
    )
    with pytest.raises(ValueError, match="c0 must be 'identity' or 'data'"):
        parse_regularizer("istar@cls,c0=batch").check()


def _tiny_task_model():
    """A 1-layer, 16-wide random encoder with a 3-class head, dropout off (the step's forward is then the
    deterministic forward): ``(model, variables)``."""
    cfg = TransformerConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = build_encoder(cfg)
    model = TaskModel(encoder, num_labels=3, dropout_rate=0.0)
    params = encoder.init(jax.random.key(3), jnp.zeros((1, 4), jnp.int32))["params"]
    return model, init_variables(model, params, jax.random.key(4))


def _token_batch(i, b=8, length=6):
    r = np.random.default_rng(100 + i)
    mask = (np.arange(length) < r.integers(2, length + 1, b)[:, None]).astype(np.int32)
    return {
        "input_ids": (r.integers(1, 50, (b, length)) * mask).astype(np.int32),
        "attention_mask": mask,
        "token_type_ids": np.zeros((b, length), np.int32),
        "labels": r.integers(0, 3, b).astype(np.int32),
    }


@pytest.mark.slow
def test_scheduled_weight_compiles_once_is_logged_and_weights_the_loss():
    """A linear weight schedule (0.1 at steps <= 1, to 1.0 at step 5): the jitted step is traced once over 7 steps,
    ``isoscore@cls/weight`` follows the closed form 0.1 + 0.9 clip((t - 1) / 4, 0, 1) and optax's own linear
    schedule, and each step's loss is numpy's cross-entropy + weight(t) * losses.isoscore_loss of the [CLS] vectors
    that the step's parameters give."""
    traces = []

    def weight(step):
        traces.append(step)
        return optax.linear_schedule(0.1, 1.0, 4, 1)(step)

    model, variables = _tiny_task_model()
    objective = Objective(3, (Regularizer("isoscore", weight, "cls"),))
    optimizer = optax.adam(1e-2)
    step = jax.jit(make_train_step(model, objective, optimizer))
    state = create_state(variables, optimizer, seed=0)
    want_weights = 0.1 + 0.9 * np.clip((np.arange(7) - 1) / 4, 0, 1)
    independent = optax.linear_schedule(0.1, 1.0, 4, 1)
    for t in range(7):
        batch = _token_batch(t)
        out = model.apply(
            {"params": state.params},
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            deterministic=True,
        )
        logits = np.asarray(out.logits, np.float64)
        log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        ce = -np.mean(log_softmax[np.arange(len(logits)), batch["labels"]])
        isoscore = float(losses.isoscore_loss(out.cls))
        state, metrics = step(state, batch)
        assert float(metrics["isoscore@cls/weight"]) == pytest.approx(want_weights[t], abs=1e-6)
        assert float(metrics["isoscore@cls/weight"]) == pytest.approx(float(independent(t)), abs=1e-7)
        np.testing.assert_allclose(float(metrics["isoscore@cls"]), isoscore, rtol=1e-5)
        np.testing.assert_allclose(float(metrics["loss"]), ce + want_weights[t] * isoscore, rtol=1e-5)
    assert len(traces) == 1  # one trace for 7 steps: one compilation (a new weight would have retraced the step)
    assert int(state.step) == 7


@pytest.mark.parametrize(
    "make",
    [lambda: jnp.float32(0.3), lambda: np.float32(0.3), lambda: 0.3, lambda: jnp.asarray(0.3, jnp.bfloat16)],
    ids=["jax", "numpy", "float", "bfloat16"],
)
def test_scalar_weights_equal_the_float_weight(make):
    """A 0-d NumPy / JAX float weight gives the loss task + w * R of its value, R = losses.istar_loss, and is held as
    a Python float (the regulariser stays hashable and the step static)."""
    out = _output()
    labels = jnp.asarray(RNG.integers(0, 3, N))
    reg = Regularizer("istar", make(), "cls")
    assert type(reg.weight) is float and hash(reg)
    loss, terms, _ = Objective(3, (reg,))(out, PARAMS, labels, losses.balancer_init(2))
    w = np.float32(make())
    want = np.float32(terms["task"]) + w * np.float32(losses.istar_loss(out.cls))
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert set(terms) == {"task", "istar@cls"}  # a constant weight is not logged as a schedule


@pytest.mark.parametrize(
    "weight, error, message",
    [
        (jnp.ones(2), ValueError, r"regulariser istar: weight must be a scalar, got an array of shape \(2,\)"),
        (np.array([0.3]), ValueError, r"weight must be a scalar, got an array of shape \(1,\)"),
        (jnp.int32(1), TypeError, "regulariser istar: weight must be a float, got a scalar of dtype int32"),
        (np.complex64(1), TypeError, "weight must be a float, got a scalar of dtype complex64"),
        (True, TypeError, "weight must be a float or a schedule of the step, got True"),
        ("heavy", ValueError, "weight 'heavy' is not a number or a schedule"),
        (float("nan"), ValueError, "weight must be finite, got nan"),
        ("linear:0:1", ValueError, r"schedule linear takes linear:A:B:N:S \(3 to 4 numbers\)"),
        ("linear:0:1:0", ValueError, "N .steps. must be a positive integer, got 0"),
        ("warmup:1:2.5", ValueError, "N .steps. must be a positive integer, got 2.5"),
        ("cosine:x:4", ValueError, "the fields after 'cosine' must be numbers"),
    ],
)
def test_bad_weights_raise_naming_the_weight(weight, error, message):
    with pytest.raises(error, match=message):
        Regularizer("istar", weight)


def test_a_traced_weight_is_refused_with_the_way_to_schedule_it():
    with pytest.raises(TypeError, match="weight must be a concrete value .* pass a schedule of the step"):
        jax.jit(lambda w: Regularizer("istar", w).weight)(0.3)


def test_option_and_joint_hyperparameters_take_scalars_and_schedules():
    """A scheduled option (I-STAR's zeta) and a scheduled alpha of the weighted joint loss are evaluated at the step
    and logged; a NumPy scalar option is held as a float; a bad one names the option."""
    out = _output()
    labels = jnp.asarray(RNG.integers(0, 3, N))
    reg = parse_regularizer("istar=0.5@cls,zeta=linear:0.5:0.1:4")
    objective = Objective(3, (reg,), "weighted", alpha=optax.linear_schedule(1.0, 0.0, 10))
    with pytest.raises(ValueError, match="pass step"):
        objective(out, PARAMS, labels, losses.balancer_init(2))
    loss, terms, _ = objective(out, PARAMS, labels, losses.balancer_init(2), step=jnp.asarray(2))
    zeta, alpha = 0.5 + (0.1 - 0.5) * 2 / 4, 1.0 - 2 / 10
    istar = float(losses.istar_loss(out.cls, zeta=zeta))
    np.testing.assert_allclose(
        [terms["istar@cls/zeta"], terms["joint/alpha"], terms["istar@cls"]], [zeta, alpha, istar], rtol=1e-5
    )
    np.testing.assert_allclose(loss, alpha * terms["task"] + (1 - alpha) * 0.5 * istar, rtol=1e-5)
    assert dict(Regularizer("istar", options=(("zeta", np.float64(0.3)),)).options)["zeta"] == 0.3
    with pytest.raises(ValueError, match="regulariser istar: option zeta must be a scalar"):
        Regularizer("istar", options=(("zeta", np.ones(3)),))


@pytest.mark.parametrize(
    "text, closed_form",
    [
        ("constant:0.7", lambda t: np.full_like(t, 0.7)),
        ("linear:0:1.5:4", lambda t: 1.5 * np.clip(t / 4, 0, 1)),
        ("linear:1:0.5:4:2", lambda t: 1 - 0.5 * np.clip((t - 2) / 4, 0, 1)),
        ("warmup:2:5", lambda t: 2 * np.clip(t / 5, 0, 1)),
        ("warmup:2:5:3", lambda t: 2 * np.clip((t - 3) / 5, 0, 1)),
        ("cosine:2:8", lambda t: 2 * (1 + np.cos(np.pi * np.minimum(t, 8) / 8)) / 2),
        ("cosine:2:8:0.25", lambda t: 2 * (0.25 + 0.75 * (1 + np.cos(np.pi * np.minimum(t, 8) / 8)) / 2)),
    ],
)
def test_weight_schedule_text_follows_its_closed_form_and_round_trips(text, closed_form):
    """``--reg istar=TEXT@cls``: the weight at steps 0..11 equals the grammar's closed form (numpy), and the
    configuration's JSON holds the text, which reads back to the same regulariser."""
    reg = parse_regularizer(f"istar={text}@cls")
    t = np.arange(12.0)
    np.testing.assert_allclose(
        [float(reg.weight(jnp.asarray(k, jnp.int32))) for k in range(12)], closed_form(t), rtol=1e-6, atol=1e-7
    )
    spec = RegularizerSpec.parse(f"istar={text}@cls")
    saved = json.loads(json.dumps(TrainConfig(method=MethodConfig(regularizers=(spec,))).to_json()))["method"]
    saved = saved["regularizers"][0]
    assert saved["weight"] == str(reg.weight) and Regularizer.of(RegularizerSpec.from_json(saved)) == reg


def test_a_configured_regulariser_is_written_as_its_fields():
    """A regulariser with constant weights is written to JSON as its four fields, every option filled."""
    regs = (RegularizerSpec("isoscore", 0.5, "cls"), RegularizerSpec.parse("persistent_entropy=0.1@cls,bars=all"))
    saved = json.loads(json.dumps(TrainConfig(method=MethodConfig(regularizers=regs)).to_json()))["method"]
    saved = saved["regularizers"]
    assert saved == json.loads(json.dumps([dataclasses.asdict(r) for r in regs]))


def test_cli_weight_schedule_runs_compiled_once_and_logs_the_weight(default_model_path, tmp_path, monkeypatch):
    """``isojax finetune --reg istar=linear:0:1:4:1@cls`` on a tiny random encoder (6 STS-B steps): the schedule is
    evaluated in one trace of the step, the log's ``istar@cls/weight`` is clip((t - 1) / 4, 0, 1) at step t (closed
    form), each logged loss is task + weight * istar@cls, and results.json keeps the schedule's text."""
    tokenizer = require("transformers").AutoTokenizer.from_pretrained(str(default_model_path))
    model = save_tiny_encoder(tmp_path / "model", tokenizer)
    traces, evaluate = [], StepSchedule.__call__
    monkeypatch.setattr(StepSchedule, "__call__", lambda self, step: traces.append(str(self)) or evaluate(self, step))
    out = tmp_path / "run"
    fit(
        config_from_argv(
            [
                "finetune",
                "--task",
                "stsb",
                "--model",
                model,
                "--reg",
                "istar=linear:0:1:4:1@cls",
                "--out",
                str(out),
                "--max-length",
                "32",
                "--batch-size",
                "8",
                "--eval-batch-size",
                "8",
                "--train-limit",
                "48",
                "--eval-limit",
                "8",
                "--steps",
                "6",
                "--log-every",
                "1",
                "--devices",
                "1",
                "--no-progress",
            ]
        )
    )
    train = [r for r in read_jsonl(out / "log.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    weights = np.array([r["istar@cls/weight"] for r in train])
    np.testing.assert_allclose(weights, np.clip((np.arange(6) - 1) / 4, 0, 1), atol=1e-7)
    np.testing.assert_allclose(
        [r["loss"] for r in train], [r["task"] + w * r["istar@cls"] for r, w in zip(train, weights)], rtol=1e-6
    )
    assert traces == ["linear:0.0:1.0:4:1"]
    saved = read_json(out / "results.json")["config"]["method"]["regularizers"]
    assert saved == [
        {
            "name": "istar",
            "weight": "linear:0.0:1.0:4:1",
            "representation": "cls",
            "options": [["c0", "identity"], ["zeta", 0.2]],
        }
    ]


def test_cli_joint_alpha_takes_a_number_or_a_schedule():
    """``--joint-alpha`` is read by TrainConfig: a number, or a schedule kept as its canonical text; bad text names
    the field."""
    base = ["finetune", "--combine", "weighted", "--reg", "istar@cls"]
    assert config_from_argv(base + ["--joint-alpha", "0.3"]).method.joint_alpha == 0.3
    config = config_from_argv(base + ["--joint-alpha", "linear:1:0.5:300"])
    assert config.method.joint_alpha == "linear:1.0:0.5:300"
    assert config.to_json()["method"]["joint_alpha"] == "linear:1.0:0.5:300"
    assert TrainConfig().to_json()["method"]["joint_alpha"] == 0.5
    with pytest.raises(ValueError, match=r"method.joint_alpha \(--joint-alpha\) 'half' is not a number or a schedule"):
        config_from_argv(base + ["--joint-alpha", "half"])
    with pytest.raises(ValueError, match=r"method.joint_alpha \(--joint-alpha\) must be in \[0, 1\], got 1.5"):
        config_from_argv(base + ["--joint-alpha", "1.5"])
