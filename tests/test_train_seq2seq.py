"""Sequence-to-sequence fine-tuning end to end (``isojax finetune`` on a tiny random BART and a synthetic
digit-reversal task in local files), the flow method on a GLUE task, and the errors of bad setups.

References: the untrained model (BLEU of its greedy decoding of the same dev sources, from sacrebleu), the
fitted flow of :mod:`isojax.calibrate.flow` (the GLUE flow's log-likelihood term)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seq2seq_helpers
import torch
import transformers
from conftest import read_json, read_jsonl, require

from isojax.calibrate import FlowState, apply_flow
from isojax.cli import main
from isojax.models import TransformerConfig, build_encoder, save_pretrained
from isojax.train import (
    FlowConfig,
    LoggingConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    PlacementConfig,
    TaskConfig,
    TrainConfig,
    fit,
)
from isojax.train.model import TaskModel, init_variables, make_flow


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    return seq2seq_helpers.tiny_bart(tmp_path_factory.mktemp("bart") / "model")


@pytest.fixture(scope="module")
def reversal(tmp_path_factory):
    require("datasets")  # the local JSONL files are read through it
    return seq2seq_helpers.reversal_task(tmp_path_factory.mktemp("reversal"))


def _argv(model, data, out, method, *extra):
    """300 steps of 16 pairs (16 batches an epoch), greedy decoding of 32 dev pairs at steps 0, 150, 300."""
    return [
        "finetune",
        "--task",
        "seq2seq",
        "--data-source",
        data,
        "--model",
        model,
        "--method",
        method,
        "--out",
        str(out),
        "--max-length",
        "16",
        "--max-target-length",
        "16",
        "--batch-size",
        "16",
        "--eval-batch-size",
        "32",
        "--steps",
        "300",
        "--lr",
        "1e-2",
        "--warmup-ratio",
        "0.1",
        "--eval-every",
        "150",
        "--log-every",
        "10",
        "--devices",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, term",
    [
        ("cosine", "cosine@embedding"),
        ("spectrum_pol", "spectrum_pol@embedding"),
        ("spectrum_exp", "spectrum_exp@embedding"),
        ("flow", "flow"),
    ],
)
@pytest.mark.slow
def test_finetune_reverses_digit_strings_with_each_calibration_method(bart, reversal, tmp_path, method, term):
    extra = ("--log-gradients",) if method == "cosine" else ()  # main's gradient statistics work here too
    assert main(_argv(bart, reversal, tmp_path, method, *extra)) == 0
    records = read_jsonl(tmp_path / "log.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 150, 300]
    assert evals[0]["bleu"] < 5 and evals[-1]["bleu"] > 60, [r["bleu"] for r in evals]
    assert evals[-1]["rougeL"] > evals[0]["rougeL"] + 40
    for r in evals:
        assert 0 < r["I2"] <= r["I1"] <= 1, r  # I1, I2 of the output embedding matrix, logged at every evaluation
    train = [r for r in records if r["kind"] == "train"]
    assert all(term in r and np.isfinite(r[term]) for r in train)
    if extra:
        groups = {k for k in train[0] if k.startswith("grad_norm/")}  # encoder and decoder blocks kept apart
        assert {"grad_norm/layer_0", "grad_norm/decoder_layer_0", "grad_norm/embeddings"} <= groups, groups
        assert all(r["grad_norm/final_logits_bias"] == 0 for r in train)  # a frozen buffer
    results = read_json(tmp_path / "results.json")
    assert results["stages"]["finetune"]["bleu"] == evals[-1]["bleu"]
    assert results["timing"]["finetune"]["seconds_per_epoch"] > 0


def test_glue_flow_log_likelihood_is_the_fitted_flows_log_density():
    """TaskModel with a flow: the head reads f(sentence), and flow_log_likelihood = (log N(f(x)) + log|det|) / d
    of the fitted flow with the same parameters."""
    cfg = TransformerConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    encoder = build_encoder(cfg)
    params = encoder.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    config = TrainConfig(
        task=TaskConfig(name="rte"), method=MethodConfig(name="flow"), flow=FlowConfig(levels=2, depth=2, hidden=8)
    )
    model = TaskModel(encoder, num_labels=2, flow=make_flow(config))
    rng = np.random.default_rng(0)
    ids, mask = rng.integers(1, 50, (6, 8)).astype(np.int32), np.ones((6, 8), np.int32)
    sentence, _ = model.apply({"params": {"encoder": params}}, ids, mask, method="flow_features")
    variables = init_variables(model, params, jax.random.key(1), np.asarray(sentence))
    out = model.apply(variables, ids, mask)
    np.testing.assert_allclose(out.sentence, sentence, rtol=1e-6, atol=1e-6)
    state = FlowState(
        params=variables["params"]["flow"]["glow"],
        constants=variables["constants"]["flow"]["glow"],
        log_likelihood=jnp.zeros(0),
        levels=2,
        depth=2,
        hidden=8,
    )
    z, logdet = apply_flow(state, sentence)
    np.testing.assert_allclose(out.head_input, z, rtol=1e-5, atol=1e-5)
    z64 = np.asarray(z).astype(np.float64)
    want = (-0.5 * np.sum(z64**2, -1) - 8 * np.log(2 * np.pi) + np.asarray(logdet).astype(np.float64)) / 16
    np.testing.assert_allclose(out.flow_log_likelihood, want, rtol=1e-5, atol=1e-5)


def _encoder_dir(path, tokenizer):
    cfg = TransformerConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    module = build_encoder(cfg)
    return save_pretrained(
        module, module.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"], str(path), tokenizer=tokenizer
    )


@pytest.mark.slow
def test_glue_flow_finetune_runs_end_to_end(tmp_path, default_model_path):
    require("datasets")  # STS-B is read through it
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    model = _encoder_dir(tmp_path / "model", tokenizer)
    config = TrainConfig(
        task=TaskConfig(name="stsb", max_length=32, train_limit=40, eval_limit=16),
        model=ModelConfig(name=model, pooling="mean", dropout=False),
        method=MethodConfig(name="flow"),
        logging=LoggingConfig(output_dir=str(tmp_path / "run"), log_every=1, progress=False),
        optim=OptimConfig(batch_size=8, eval_batch_size=16, steps=10, transform_learning_rate=1e-2),
        placement=PlacementConfig(devices=1),
        flow=FlowConfig(levels=2, depth=2),
    )
    result = fit(config)
    flow = [r["flow"] for r in read_jsonl(tmp_path / "run" / "log.jsonl") if r["kind"] == "train"]
    assert len(flow) == 10 and np.all(np.isfinite(flow))
    assert np.mean(flow[5:]) < np.mean(flow[:5]) - 0.1, flow  # maximum likelihood: the same 5 batches fit better
    assert np.isfinite(result.metrics["spearman"])
    assert "flow" in result.params and "constants" not in result.params


def _gpt2_dir(path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=14, n_embd=16, n_layer=1, n_head=2, n_positions=24, bos_token_id=0, eos_token_id=2
    )
    transformers.GPT2LMHeadModel(cfg).save_pretrained(str(path))
    seq2seq_helpers.digit_tokenizer().save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["encoder", "gpt2"])
def test_a_model_without_a_decoder_and_encoder_is_refused(kind, reversal, tmp_path):
    model = (
        _encoder_dir(tmp_path / "m", seq2seq_helpers.digit_tokenizer())
        if kind == "encoder"
        else _gpt2_dir(tmp_path / "m")
    )
    config = TrainConfig(
        task=TaskConfig(name="seq2seq", data_source=reversal),
        model=ModelConfig(name=model),
        logging=LoggingConfig(output_dir=str(tmp_path / "run")),
    )
    with pytest.raises(ValueError, match=r"fine-tuning \(seq2seq\) needs an encoder-decoder; this (bert|gpt2) model"):
        fit(config)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"seq2seq.max_target_length": 30},
            "max_target_length=30 is longer than the 24 positions of this bart model's decoder",
        ),
        ({"task.max_length": 25}, "max_length=25 is longer than the 24 positions"),
        (
            {"seq2seq.num_beams": 2, "seq2seq.generation_max_length": 40},
            r"max_length=40 must lie in \[2, 24\], the positions of this bart",
        ),
        ({"task.max_length": 1}, r"task.max_length \(--max-length\) must be at least 2: the tokenizer adds 2 special"),
        (
            {"seq2seq.max_target_length": 1},
            r"seq2seq.max_target_length \(--max-target-length\) must be at least 2: the tokenizer adds 2 special",
        ),
    ],
)
def test_lengths_beyond_the_positions_are_refused(bart, reversal, tmp_path, kwargs, message):
    config = TrainConfig().override(
        {
            "task.name": "seq2seq",
            "task.data_source": reversal,
            "model.name": bart,
            "logging.output_dir": str(tmp_path),
            "task.max_length": 16,
            "seq2seq.max_target_length": 16,
            **kwargs,
        }
    )
    with pytest.raises(ValueError, match=message):
        fit(config)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"method.name": "softdecay"},
            r"method.name \(--method\) 'softdecay' does not apply to the sequence-to-sequence task seq2seq",
        ),
        ({"method.name": "isoscore"}, "does not apply"),
        ({"method.regularizers": ["istar=1@cls"]}, "has the representations"),
        ({"seq2seq.label_smoothing": 1.0}, r"seq2seq.label_smoothing \(--label-smoothing\) must be in \[0, 1\)"),
        ({"task.name": "wmt17"}, "or a sequence-to-sequence task"),
        ({"model.scan_layers": True}, r"model.scan_layers and model.remat \(--scan-layers, --remat\) are for encoders"),
        ({"model.remat": "dots"}, "are for encoders"),
    ],
)
def test_bad_seq2seq_configuration_raises_on_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig().override({"task.name": "seq2seq", **kwargs})


def test_the_configured_buckets_cut_sources_and_targets(bart, reversal):
    """``task.buckets`` reaches both token groups of a sequence-to-sequence batch: the source and the target are
    each cut to the smallest configured width (capped at its ``max_length``) that holds their longest row, as
    counted by the tokenizer itself."""
    from isojax.train.feed import batch_indices, process_batches
    from isojax.train.tasks import recipe_for

    config = TrainConfig().override(
        {
            "task.name": "seq2seq",
            "task.data_source": reversal,
            "model.name": bart,
            "task.buckets": [6, 8, 10],
            "task.max_length": 16,
            "seq2seq.max_target_length": 12,
        }
    )
    recipe = recipe_for(config)
    _, _, tokenizer = recipe.build()
    split = recipe.load("train", tokenizer, 64)
    order = batch_indices(len(split), 2)
    widths = set()
    for index, batch in zip(order, process_batches(split, order, rows=np.arange(2)), strict=True):
        for key, texts, cap in (
            ("attention_mask", {"text": [split.data.sources[i] for i in index]}, 16),
            ("decoder_attention_mask", {"text_target": [split.data.targets[i] for i in index]}, 12),
        ):
            longest = max(len(ids) for ids in tokenizer(**texts, truncation=True, max_length=cap)["input_ids"])
            expected = min([b for b in (6, 8, 10) if b >= longest] or [cap])
            assert batch[key].shape == (2, expected)
            widths.add(expected)
    assert len(widths) > 1  # the batches differ in width, so the check above tells buckets apart
