"""Gradient logging during fine-tuning (``--log-gradients``): per-group gradient norms and the word-embedding
gradient's alignment with the mean embedding direction.

References: numpy norms and cosines of the gradient that ``jax.grad`` of the same objective gives outside the
train step; the run's log records and figure.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import read_jsonl, require, save_tiny_encoder
from flax import traverse_util

from isojax.models import TransformerConfig, build_encoder
from isojax.train.gradient_stats import parameter_group
from isojax.train.model import TaskModel, init_variables
from isojax.train.objective import Objective
from isojax.train.state import create_state
from isojax.train.step import make_train_step


def test_parameter_groups():
    assert parameter_group(("encoder", "encoder", "layer_3", "attention", "query", "kernel")) == "layer_3"
    assert parameter_group(("encoder", "encoder", "group_0_layer_1", "output", "bias")) == "group_0_layer_1"
    assert parameter_group(("encoder", "embeddings", "word_embeddings", "embedding")) == "embeddings"
    assert parameter_group(("encoder", "last_layer_transform", "theta")) == "last_layer_transform"
    assert parameter_group(("head", "classifier", "kernel")) == "head"
    assert parameter_group(("encoder", "decoder", "layer_0", "cross_attention", "key", "kernel")) == "decoder_layer_0"
    assert parameter_group(("encoder", "encoder", "layer_0", "attention", "key", "kernel")) == "layer_0"
    assert parameter_group(("encoder", "final_logits_bias")) == "final_logits_bias"
    assert parameter_group(("flow", "glow", "level_0", "kernel")) == "flow"


def test_the_step_logs_the_statistics_of_the_objectives_gradient():
    cfg = TransformerConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = TaskModel(build_encoder(cfg), num_labels=2, dropout_rate=0.0)
    params = model.encoder.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    variables = init_variables(model, params, jax.random.key(1))
    objective = Objective(2)
    optimizer = optax.sgd(0.1)
    state = create_state(variables, optimizer, seed=0)
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1, 50, (6, 8)).astype(np.int32),
        "attention_mask": np.ones((6, 8), np.int32),
        "token_type_ids": np.zeros((6, 8), np.int32),
        "labels": rng.integers(0, 2, 6).astype(np.int32),
    }

    def loss(p):
        out = model.apply({"params": p}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return objective(out, p, batch["labels"], state.balancer)[0]

    grads = traverse_util.flatten_dict(jax.grad(loss)(state.params))
    step = jax.jit(make_train_step(model, objective, optimizer, gradient_every=2))
    _, first = step(state, batch)  # step 1 of the stage: not a logged step
    _, second = step(state.replace(step=jnp.asarray(1)), batch)  # step 2: logged
    assert np.isnan(float(first["embedding_grad/mean_cosine"]))
    groups = {}
    for path, g in grads.items():
        key = (
            "layer_0"
            if "layer_0" in path
            else "layer_1"
            if "layer_1" in path
            else (path[1] if path[0] == "encoder" else path[0])
        )
        groups[key] = groups.get(key, 0.0) + float(np.sum(np.square(np.asarray(g, np.float64))))
    assert {k.split("/", 1)[1] for k in second if k.startswith("grad_norm/")} == set(groups)
    for key, value in groups.items():
        assert float(second[f"grad_norm/{key}"]) == pytest.approx(np.sqrt(value), rel=1e-4)
    w = np.asarray(state.params["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    g = np.asarray(grads["encoder", "embeddings", "word_embeddings", "embedding"], np.float64)
    total, mu = g.sum(0), w.mean(0)
    want = -total @ mu / np.linalg.norm(total) / np.linalg.norm(mu)
    assert float(second["embedding_grad/mean_cosine"]) == pytest.approx(want, abs=1e-4)
    v1 = np.linalg.eigh(np.cov(w, rowvar=False))[1][:, -1]
    assert float(second["embedding_grad/principal_cosine"]) == pytest.approx(
        abs(total @ v1) / np.linalg.norm(total), abs=1e-4
    )


def test_finetune_with_log_gradients_writes_the_records_and_the_panels(tmp_path, default_model_path):
    import transformers

    from isojax.train import LoggingConfig, ModelConfig, OptimConfig, PlacementConfig, TaskConfig, TrainConfig, fit

    require("datasets")  # STS-B is read through it
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    model = save_tiny_encoder(tmp_path / "model", tokenizer)
    with pytest.raises(
        ValueError, match=r"logging.log_gradients \(--log-gradients\) needs logging.log_every \(--log-every\) > 0"
    ):
        TrainConfig(logging=LoggingConfig(log_gradients=True, log_every=0))
    fit(
        TrainConfig(
            task=TaskConfig(name="stsb", train_limit=32, eval_limit=8, max_length=24),
            model=ModelConfig(name=model),
            logging=LoggingConfig(output_dir=str(tmp_path / "run"), log_every=2, log_gradients=True, progress=False),
            optim=OptimConfig(steps=5, batch_size=8, eval_batch_size=8),
            placement=PlacementConfig(devices=1),
        )
    )
    records = read_jsonl(tmp_path / "run" / "log.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 5]  # every 2nd step and the stage's last, statistics included
    for r in train:
        assert np.isfinite(r["grad_norm/layer_0"]) and r["grad_norm/embeddings"] > 0
        assert -1 <= r["embedding_grad/mean_cosine"] <= 1
    assert (tmp_path / "run" / "curves.png").stat().st_size > 20000
