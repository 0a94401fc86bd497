"""From a fine-tuning run to a shared model: the method's learnt state in the logs (and against numpy), ``isojax export`` /
``finetune --export`` to a Hugging Face folder, and ``analyze`` / ``sts`` on a run directory.

Two short RTE runs of a tiny random BERT (``--pooling pooler``, the representation transformers'
``BertForSequenceClassification`` reads), baseline and SoftDecay, each exported by ``--export``. References: the
final parameters that ``fit`` returned, applied by isojax's task model, and transformers' PyTorch
``AutoModelForSequenceClassification`` (a test reference only).
"""

import json
import shutil
import struct

import jax
import numpy as np
import pytest
import transformers
from conftest import read_json, read_jsonl, save_tiny_encoder

from isojax.cli import main
from isojax.data.glue import load_glue
from isojax.export import load_task_model
from isojax.losses import BalancerState
from isojax.models import (
    TransformerConfig,
    build_encoder,
    from_pretrained,
    init_params,
    load_classification_head,
    save_pretrained,
)
from isojax.softdecay import SoftDecay, alpha_from_param
from isojax.train import loop
from isojax.train.cli import config_from_argv
from isojax.train.model import TaskModel, init_variables, method_state
from isojax.train.tasks import recipe_for

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return transformers.AutoTokenizer.from_pretrained(str(default_model_path))


def _argv(model, data_dir, out, method):
    return [
        "finetune",
        *("--task", "rte", "--data-dir", str(data_dir), "--model", model, "--method", method, "--pooling", "pooler"),
        *("--max-length", "32", "--batch-size", "8", "--eval-batch-size", "8", "--train-limit", "32"),
        *("--eval-limit", "16", "--steps", "6", "--log-every", "1", "--lr", "1e-3", "--transform-lr", "5e-2"),
        *("--devices", "1", "--no-progress", "--out", str(out / "run"), "--export", str(out / "hf")),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, shared_data_dir):
    """method -> (run directory, exported folder, FitResult, argv) of ``isojax finetune ... --export``."""
    root = tmp_path_factory.mktemp("export")
    tiny = save_tiny_encoder(root / "tiny", tokenizer)
    fitted, out = [], {}
    fit = loop.fit
    with pytest.MonkeyPatch.context() as patch:  # keep what fit returns (cmd_finetune prints it only)
        patch.setattr(loop, "fit", lambda config: fitted.append(fit(config)) or fitted[-1])
        for method in ("baseline", "softdecay"):
            argv = _argv(tiny, shared_data_dir, root / method, method)
            assert main(argv) == 0
            out[method] = (root / method / "run", root / method / "hf", fitted[-1], argv)
    return out


@pytest.fixture(scope="module")
def dev(tokenizer, shared_data_dir):
    """The 16 dev pairs the runs evaluate on, tokenised as they are (max_length 32)."""
    data = load_glue("rte", "validation", data_dir=shared_data_dir)
    return dict(tokenizer(data.texts_a[:16], data.texts_b[:16], padding=True, truncation=True, max_length=32))


def _isojax_logits(model, variables, dev):
    out = model.apply(variables, *(np.asarray(dev[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
    return np.asarray(out.logits)


def _reference_logits(runs, method, dev):
    """The run's own task model with the parameters fit returned."""
    _, _, result, argv = runs[method]
    model, _, _ = recipe_for(config_from_argv(argv)).build()
    return _isojax_logits(model, {"params": result.params}, dev)


def _transformers_logits(folder, dev):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(**{k: torch.tensor(v) for k, v in dev.items()}).logits.numpy()


def test_softdecay_alpha_is_logged_at_every_train_step_and_changes(runs):
    run, _, result, _ = runs["softdecay"]
    train = [r for r in read_jsonl(run / "log.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 7))
    alphas = [r["softdecay@output/alpha"] for r in train]
    for r in train:  # alpha is the logistic map of the logged theta
        assert r["softdecay@output/alpha"] == pytest.approx(
            float(alpha_from_param(np.float32(r["softdecay@output/theta"]), -0.2)), abs=1e-7
        )
    assert max(alphas) - min(alphas) > 1e-3  # it trains
    final = float(alpha_from_param(result.params["encoder"]["last_layer_transform"]["theta"], -0.2))
    assert alphas[-1] == pytest.approx(final, abs=1e-7)
    summary = read_json(run / "results.json")["method_state"]
    assert summary == {"finetune": {k: v for k, v in train[-1].items() if k.startswith("softdecay@")}}
    assert struct.unpack(">II", (run / "curves.png").read_bytes()[16:24]) == (1650, 440)  # a third panel
    baseline = [r for r in read_jsonl(runs["baseline"][0] / "log.jsonl") if r["kind"] == "train"]
    assert not any(k.startswith("softdecay@") for r in baseline for k in r)


def test_exported_baseline_gives_the_runs_dev_logits_in_transformers_and_isojax(runs, dev):
    _, folder, _, _ = runs["baseline"]
    config = read_json(folder / "config.json")
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["isojax"]["transformers"] == [] and config["isojax"]["checkpoint"] == 6
    want = _reference_logits(runs, "baseline", dev)
    assert np.abs(want[:, 0] - want[:, 1]).max() > 1e-4  # the head distinguishes the pairs
    np.testing.assert_allclose(_transformers_logits(folder, dev), want, rtol=0, atol=1e-5)
    model, variables, tokenizer = load_task_model(str(folder))
    np.testing.assert_allclose(_isojax_logits(model, variables, dev), want, rtol=0, atol=1e-6)
    assert (
        tokenizer is not None
        and tokenizer("a b")["input_ids"] == transformers.AutoTokenizer.from_pretrained(str(folder))("a b")["input_ids"]
    )


def test_export_command_writes_what_finetune_export_wrote(runs, tmp_path, capsys):
    run, folder, _, _ = runs["baseline"]
    assert main(["export", str(run), str(tmp_path / "again")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'again'} from {run}, checkpoint step 6")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (folder / name).read_bytes(), name


def test_export_refuses_a_checkpoint_whose_bytes_changed_and_names_the_file(runs, tmp_path, capsys):
    run, _, _, _ = runs["baseline"]
    copy = tmp_path / "run"
    shutil.copytree(run / "checkpoints", copy / "checkpoints")
    files = [p for p in (copy / "checkpoints" / "6" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    flipped = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    assert main(["export", str(copy), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err == (
        f"isojax export: error: {flipped} does not match the sha256 recorded when it was written\n"
    )
    assert not (tmp_path / "hf").exists()


def test_exported_softdecay_run_round_trips_alpha(runs, dev):
    _, folder, result, _ = runs["softdecay"]
    theta = result.params["encoder"]["last_layer_transform"]["theta"]
    described = read_json(folder / "config.json")["isojax"]
    assert described["softdecay"]["alpha"] == pytest.approx(float(alpha_from_param(theta, -0.2)), abs=1e-7)
    assert described["softdecay"]["placement"] == "output" and "SoftDecay" in described["transformers"][0]
    module, params, _ = from_pretrained(str(folder))
    assert isinstance(module.last_layer_transform, SoftDecay) and module.last_layer_transform.alpha_init == -0.2
    np.testing.assert_array_equal(params["last_layer_transform"]["theta"], theta)
    want = _reference_logits(runs, "softdecay", dev)
    model, variables, _ = load_task_model(str(folder))
    np.testing.assert_allclose(_isojax_logits(model, variables, dev), want, rtol=0, atol=1e-6)
    # transformers runs the encoder without SoftDecay, as the folder says
    assert np.abs(_transformers_logits(folder, dev) - want).max() > 1e-4


def test_analyze_and_sts_read_a_run_directory(runs, tmp_path, capsys):
    run = runs["baseline"][0]
    analyze = ["analyze", "--model", str(run), "--limit", "8", "--twonn-tokens", "0", "--quiet"]
    assert main([*analyze, "--out", str(tmp_path / "a"), "--json", str(tmp_path / "a.json")]) == 0
    assert f"{run}: the run's newest checkpoint, step 6" in capsys.readouterr().out
    sts = ["sts", "--model", str(run), "--limit", "8", "--methods", "raw", "--no-isotropy", "--quiet"]
    assert main([*sts, "--json", str(tmp_path / "s.json")]) == 0
    assert f"{run}: the run's newest checkpoint, step 6" in capsys.readouterr().out
    # the same numbers as on the exported folder
    assert (
        main(
            [
                "analyze",
                "--model",
                str(runs["baseline"][1]),
                *analyze[3:],
                "--out",
                str(tmp_path / "b"),
                "--json",
                str(tmp_path / "b.json"),
            ]
        )
        == 0
    )
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert a["cdf"] == b["cdf"] and a["input_embeddings"] == b["input_embeddings"]


def test_export_of_a_directory_without_checkpoints_names_it(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    assert main(["export", str(tmp_path), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err.startswith(
        f"isojax export: error: {tmp_path} is not a fine-tuning run with a checkpoint"
    )


def test_a_folder_without_tokenizer_warns_and_has_no_classification_head(tmp_path, tokenizer):
    path = save_tiny_encoder(tmp_path / "tiny", tokenizer)
    module, params, _ = from_pretrained(path, with_tokenizer=False)
    bare = save_pretrained(module, params, str(tmp_path / "bare"))
    with pytest.warns(UserWarning, match="has no tokenizer files; tokenizer is None"):
        assert from_pretrained(bare)[2] is None
    with pytest.raises(ValueError, match="has no sequence-classification head"):
        load_classification_head(bare)


def test_save_pretrained_writes_the_tokenizer_and_a_classification_head_transformers_reads(tmp_path, tokenizer):
    path = save_tiny_encoder(tmp_path / "tiny", tokenizer)
    module, params, tok = from_pretrained(path)
    head = {
        "classifier": {"kernel": np.arange(48, dtype=np.float32).reshape(16, 3) / 48, "bias": np.ones(3, np.float32)}
    }
    folder = save_pretrained(module, params, str(tmp_path / "cls"), tokenizer=tok, task={"head": head})
    assert (tmp_path / "cls" / "tokenizer.json").exists()
    loaded, loaded_params = load_classification_head(folder)
    assert loaded.num_labels == 3
    jax.tree.map(np.testing.assert_array_equal, loaded_params, head)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    np.testing.assert_array_equal(reference.classifier.weight.detach().numpy(), head["classifier"]["kernel"].T)


def test_method_state_summarises_each_learnt_part_as_numpy_does():
    """SoftDecay's alpha (-sigmoid(theta + logit(-alpha_0)), the paper's logistic map), the Isotropy Layer's
    ||K - I||_F / sqrt(d) and ||b||, IsoBN's running std range and the balancer's factors mean(L)/L_i, on random
    values."""
    config = TransformerConfig(
        vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    encoder = build_encoder(config, last_layer_transform=SoftDecay(alpha_init=-0.3), transform_placement="block")
    model = TaskModel(encoder, num_labels=2, use_isobn=True, use_isotropy_layer=True)
    variables = init_variables(model, init_params(encoder, jax.random.key(0)), jax.random.key(1))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(size=np.shape(x)).astype(np.float32), variables["params"])
    std = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    balancer = BalancerState(means=np.array([0.5, 2.0], np.float32), step=np.int32(3))
    got = {k: float(v) for k, v in method_state(model, params, {"isobn": {"std": std}}, balancer).items()}
    theta = float(params["encoder"]["last_layer_transform"]["theta"])
    kernel, bias = params["isotropy_layer"]["dense"]["kernel"], params["isotropy_layer"]["dense"]["bias"]
    want = {
        "softdecay@block/alpha": -1 / (1 + np.exp(-(theta + np.log(0.3 / 0.7)))),
        "softdecay@block/theta": theta,
        "isotropy_layer/kernel_deviation": np.linalg.norm(kernel - np.eye(8)) / np.sqrt(8),
        "isotropy_layer/bias_norm": np.linalg.norm(bias),
        "isobn/std_min": std.min(),
        "isobn/std_max": std.max(),
        "balancer/weight_task": 1.25 / 0.5,
        "balancer/weight_regularizers": 1.25 / 2.0,
    }
    assert got == pytest.approx(want, rel=1e-5)
    plain = TaskModel(build_encoder(config), num_labels=2)  # a baseline model has no learnt method state
    assert (
        method_state(plain, init_variables(plain, variables["params"]["encoder"], jax.random.key(1))["params"], {})
        == {}
    )
