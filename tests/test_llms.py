"""Llama, Qwen2, Qwen3, Mistral and Gemma 3 (text) against transformers' PyTorch classes: tiny random models made here
(grouped- and multi-query attention, llama3 and linear RoPE scaling, tied and untied heads, sliding windows shorter
than the sequence, Gemma 3's layer pattern), saved, loaded by isojax, compared on padded batches; decoding against
``generate``; isojax's own save read back by transformers."""

import json

import jax
import numpy as np
import pytest

import isojax
from isojax.models.generate import generate
from isojax.models.rope import Rope, rope_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from decoder_helpers import LLM_CASES, padded, tiny_llm  # noqa: E402  (needs torch)

LOGIT_TOL = 1e-4  # of the largest |logit| (the anchors accept 1e-3 to 0.125)
STATE_TOL = 1e-5


@pytest.fixture(scope="module", params=sorted(LLM_CASES))
def saved(request, tmp_path_factory):
    model = tiny_llm(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    module, params, tokenizer = isojax.from_pretrained(str(path))
    assert tokenizer is None
    return request.param, model, path, module, params


def torch_forward(model, ids, mask, position_ids=None):
    kwargs = {} if position_ids is None else {"position_ids": torch.tensor(position_ids)}
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
            output_attentions=True,
            **kwargs,
        )


def assert_same_forward(model, module, params, ids, mask, position_ids=None):
    """Logits within LOGIT_TOL of the largest logit, every hidden state and attention probability, on real tokens."""
    ref = torch_forward(model, ids, mask, position_ids)
    out = jax.jit(module.apply, static_argnames="output_attentions")(
        {"params": params}, ids, mask, output_attentions=True
    )
    real = mask.astype(bool)
    theirs = ref.logits.numpy()[real]
    np.testing.assert_allclose(np.asarray(out.logits)[real], theirs, atol=LOGIT_TOL * np.abs(theirs).max(), rtol=0)
    assert len(out.hidden_states) == len(ref.hidden_states) == module.config.num_hidden_layers + 1
    for mine, hf in zip(out.hidden_states, ref.hidden_states):
        np.testing.assert_allclose(np.asarray(mine)[real], hf.numpy()[real], atol=STATE_TOL, rtol=0)
    for mine, hf in zip(out.attentions, ref.attentions):  # [B, heads, q, k] on the real query rows
        mine, hf = np.asarray(mine).transpose(0, 2, 1, 3)[real], hf.numpy().transpose(0, 2, 1, 3)[real]
        np.testing.assert_allclose(mine, hf, atol=1e-6, rtol=0)


def test_logits_hidden_states_and_attention_match_pytorch_on_a_right_padded_batch(saved):
    case, model, _, module, params = saved
    ids, mask = padded((9, 4, 7, 1), 9, 99, 0, seed=1)  # 9 tokens: past every sliding window (3) of the cases
    assert_same_forward(model, module, params, ids, mask)


def test_left_padded_prompts_match_pytorch_given_the_positions_of_generate(saved):
    """transformers' forward counts positions over padding; generate passes ``cumsum(mask) - 1``, as isojax does."""
    _, model, _, module, params = saved
    ids, mask = padded((8, 3, 6), 8, 99, 0, left=True, seed=2)
    assert_same_forward(model, module, params, ids, mask, np.where(mask, mask.cumsum(1) - 1, 0))


def test_block_options_of_each_case_are_read_from_the_config(saved):
    case, model, _, module, params = saved
    cfg, hf = module.config, model.config
    assert cfg.key_value_heads == hf.num_key_value_heads and cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert ("lm_head" in params) == (not hf.tie_word_embeddings)
    assert cfg.attention_bias == case.startswith("qwen2") and cfg.qk_norm == case.startswith(("qwen3", "gemma3"))
    windows = [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]
    expected = {"qwen2": [0, 3, 3], "mistral": [3, 3, 3], "gemma3": [3, 0, 3]}.get(case.split("-")[0], [0, 0, 0])
    assert windows == expected


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 3])
def test_greedy_and_beam_search_equal_transformers_generate(tmp_path, num_beams):
    """Every case decodes the same tokens as ``generate`` from left-padded prompts, through the sliding windows."""
    for case in sorted(LLM_CASES):
        model = tiny_llm(case, scale=0.5)
        model.save_pretrained(tmp_path / case)
        module, params, _ = isojax.from_pretrained(str(tmp_path / case))
        ids, mask = padded((5, 3, 1), 5, 99, 0, left=True, seed=3, low=6)
        settings = dict(max_length=12, pad_token_id=0, eos_token_id=5, num_beams=num_beams)
        with torch.no_grad():
            ref = model.generate(
                input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False, **settings
            ).numpy()
        mine = np.asarray(generate(module, params, ids, mask, **settings).sequences)
        np.testing.assert_array_equal(mine[:, : ref.shape[1]], ref, err_msg=case)
        assert (mine[:, ref.shape[1] :] == 0).all()


def test_a_save_by_isojax_loads_in_transformers_with_the_same_logits(saved, tmp_path):
    _, model, _, module, params = saved
    isojax.save_pretrained(module, params, str(tmp_path))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(reloaded) is type(model)
    mine, theirs = reloaded.state_dict(), model.state_dict()
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    ids, mask = padded((6, 2), 6, 99, 0, seed=4)
    with torch.no_grad():
        a = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        b = reloaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_array_equal(a[mask.astype(bool)], b[mask.astype(bool)])


@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_rope_inverse_frequencies_equal_transformers(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": kind, "factor": 8.0, "rope_theta": 500000.0}
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    config = transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=2, max_position_embeddings=512, rope_parameters=params
    )
    theirs, _ = ROPE_INIT_FUNCTIONS[kind](config)
    mine = rope_from_hf(config.to_dict()).inverse_frequencies(128)
    np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-6)


def test_unsupported_options_are_refused_by_name(tmp_path):
    base = tiny_llm("llama-gqa-llama3-rope").config.to_dict()
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported; isojax implements default, linear"):
        isojax.models.config_from_hf(dict(base, rope_parameters={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not supported"):
        isojax.models.config_from_hf(dict(base, partial_rotary_factor=0.5))
    gemma = tiny_llm("gemma3-layer-pattern").config.to_dict()
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0 is not supported"):
        isojax.models.config_from_hf(dict(gemma, final_logit_softcapping=30.0))
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be divisible by num_key_value_heads \(3\)"):
        isojax.models.config_from_hf(dict(base, num_key_value_heads=3))
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        Rope(kind="dynamic")
    (tmp_path / "config.json").write_text(json.dumps(dict(base, rope_parameters={"rope_type": "longrope"})))
    with pytest.raises(ValueError, match=r"config.json: rope_type 'longrope' is not supported"):
        isojax.models.hub.read_config(str(tmp_path))


def test_a_scanned_causal_lm_gives_the_unrolled_outputs_and_refuses_a_cache(saved):
    case, _, _, module, params = saved
    scanned = module.clone(scan_layers=True)
    ids, mask = padded((7, 3), 7, 99, 0, seed=5)
    if module.config.layer_types:  # Qwen2's, Mistral's and Gemma's sliding layers are not all alike
        with pytest.raises(ValueError, match="layers of different attention types"):
            scanned.init(jax.random.key(0), ids, mask)
        return
    stacked = isojax.models.to_scanned(scanned, params)
    assert stacked["decoder"]["layers"]["block"]["attention"]["query"]["kernel"].shape[0] == 3
    a, b = module.apply({"params": params}, ids, mask), scanned.apply({"params": stacked}, ids, mask)
    for mine, theirs in zip((a.logits, *a.hidden_states), (b.logits, *b.hidden_states)):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), atol=2e-6, rtol=0)
    back = isojax.models.to_unscanned(scanned, stacked)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, back, params)))
    cache = isojax.models.init_cache(module.config, 2, 12)
    with pytest.raises(ValueError, match="without a key/value cache"):
        scanned.apply({"params": stacked}, ids, mask, cache=cache)


def test_softdecay_on_the_last_hidden_state_of_a_causal_lm_feeds_the_lm_head(saved):
    """``CausalLM(last_layer_transform=SoftDecay())``: the last hidden state is soft_decay of the plain model's, with
    the mask, and the logits are read from it; decoding with a cache is refused."""
    _, _, _, module, params = saved
    decayed = module.clone(last_layer_transform=isojax.SoftDecay(alpha_init=-0.6))
    ids, mask = padded((8, 5), 8, 99, 0, seed=6)
    theta = decayed.init(jax.random.key(0), ids, mask)["params"]["last_layer_transform"]
    out = decayed.apply({"params": {**params, "last_layer_transform": theta}}, ids, mask)
    plain = module.apply({"params": params}, ids, mask)
    expected = isojax.soft_decay(plain.last_hidden_state, -0.6, mask=mask.astype(bool))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], np.asarray(expected)[real], atol=2e-5)
    head = (
        params["embeddings"]["word_embeddings"]["embedding"].T
        if "lm_head" not in params
        else params["lm_head"]["kernel"]
    )
    np.testing.assert_allclose(np.asarray(out.logits), np.asarray(out.last_hidden_state) @ np.asarray(head), atol=2e-5)
    with pytest.raises(ValueError, match="decoding with a cache is refused"):
        decayed.apply(
            {"params": {**params, "last_layer_transform": theta}},
            ids,
            mask,
            cache=isojax.models.init_cache(module.config, 2, 12),
        )


def test_from_pretrained_scans_and_holds_bfloat16_parameters_on_request(saved):
    case, model, path, module, params = saved
    ids, mask = padded((6, 4), 6, 99, 0, seed=7)
    plain = module.apply({"params": params}, ids, mask).logits
    half, half_params, _ = isojax.from_pretrained(str(path), param_dtype=jax.numpy.bfloat16, dtype=jax.numpy.bfloat16)
    assert {leaf.dtype for leaf in jax.tree.leaves(half_params)} == {np.dtype(jax.numpy.bfloat16)}
    real = mask.astype(bool)
    logits = np.asarray(half.apply({"params": half_params}, ids, mask).logits, np.float32)
    np.testing.assert_allclose(logits[real], np.asarray(plain)[real], atol=0.05 * np.abs(np.asarray(plain)).max())
    scanned, scanned_params, _ = isojax.from_pretrained(str(path), scan_layers=True)
    if module.config.layer_types:
        with pytest.raises(ValueError, match="layers of different attention types"):
            scanned.apply({"params": scanned_params}, ids, mask)
        return
    assert "layers" in scanned_params["decoder"]
    np.testing.assert_allclose(scanned.apply({"params": scanned_params}, ids, mask).logits, plain, atol=2e-6)
    isojax.save_pretrained(scanned, scanned_params, str(path.parent / f"{case}-scanned"))
    again = transformers.AutoModelForCausalLM.from_pretrained(path.parent / f"{case}-scanned").state_dict()
    assert all(torch.equal(again[k], v) for k, v in model.state_dict().items())


def test_capture_gives_each_blocks_attention_and_mlp_outputs_as_pytorch_hooks_see_them(saved):
    """``isojax.models.capture`` under jit against forward hooks on transformers' ``self_attn`` and ``mlp``."""
    _, model, _, module, params = saved
    ids, mask = padded((7, 4), 7, 99, 0, seed=8)
    seen = {"attention": [], "mlp": []}
    hooks = []
    for layer in model.model.layers:
        hooks.append(layer.self_attn.register_forward_hook(lambda m, i, o: seen["attention"].append(o[0].numpy())))
        hooks.append(layer.mlp.register_forward_hook(lambda m, i, o: seen["mlp"].append(o.numpy())))
    ref = torch_forward(model, ids, mask)
    for hook in hooks:
        hook.remove()
    out = jax.jit(isojax.models.capture, static_argnums=0)(module, params, ids, mask)
    real = mask.astype(bool)
    n = module.config.num_hidden_layers
    assert out["residual"].shape == (n, 2, 7, 32) and out["attention_probs"].shape[:3] == (n, 2, 4)
    np.testing.assert_allclose(np.asarray(out["embeddings"])[real], ref.hidden_states[0].numpy()[real], atol=1e-6)
    for point in ("attention", "mlp"):
        for i in range(n):
            np.testing.assert_allclose(np.asarray(out[point][i])[real], seen[point][i][real], atol=STATE_TOL)
    for i in range(n):
        np.testing.assert_allclose(
            np.asarray(out["residual"][i])[real], ref.hidden_states[i + 1].numpy()[real], atol=STATE_TOL
        )
    with pytest.raises(ValueError, match="unknown capture points"):
        isojax.models.capture(module, params, ids, mask, points=("keys",))


@pytest.mark.parametrize("left", [False, True])
def test_a_causal_lm_classifier_reads_the_last_real_token_as_transformers_does(saved, left):
    """``TaskModel`` over a causal LM (what ``isojax finetune`` builds) against transformers'
    ``...ForSequenceClassification`` with the same score matrix (no bias), right- and left-padded."""
    from isojax.train.model import TaskModel, init_variables

    _, _, path, module, params = saved
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=3, pad_token_id=0, attn_implementation="eager"
    ).eval()
    task = TaskModel(module, num_labels=3, dropout_rate=0.0)
    variables = init_variables(task, params, jax.random.key(0))
    score = ref.score.weight.detach().numpy()
    variables["params"]["head"] = {"classifier": {"kernel": score.T, "bias": np.zeros(3, np.float32)}}
    ids, mask = padded((7, 3, 5), 7, 99, 0, left=left, seed=9)
    positions = np.where(mask, mask.cumsum(1) - 1, 0) if left else None
    ref_kwargs = {} if positions is None else {"position_ids": torch.tensor(positions)}
    with torch.no_grad():
        theirs = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **ref_kwargs).logits.numpy()
    out = task.apply(variables, ids, mask)
    np.testing.assert_allclose(np.asarray(out.logits), theirs, atol=1e-5, rtol=0)
    last = [np.flatnonzero(row)[-1] for row in mask]
    hidden = module.apply({"params": params}, ids, mask).last_hidden_state
    np.testing.assert_allclose(np.asarray(out.cls), np.asarray(hidden)[np.arange(3), last], atol=1e-6)


@pytest.mark.slow
def test_isojax_finetune_trains_a_llama_classifier_with_softdecay_end_to_end(default_model_path, tmp_path):
    """A 1-layer random Llama with the default model's tokenizer: ``isojax finetune`` with SoftDecay on STS-B rows
    runs its steps and writes finite results (the head reads the last real token)."""
    from conftest import read_json, read_jsonl

    from isojax.models import build_model, config_from_hf, init_params
    from isojax.train import fit
    from isojax.train.cli import config_from_argv

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    config = config_from_hf(
        dict(
            model_type="llama",
            vocab_size=tokenizer.vocab_size,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=32,
            max_position_embeddings=128,
            pad_token_id=0,
        )
    )
    module = build_model(config)
    isojax.save_pretrained(module, init_params(module, jax.random.key(0)), str(tmp_path / "llama"), tokenizer=tokenizer)
    argv = ["finetune", "--task", "stsb", "--model", str(tmp_path / "llama"), "--method", "softdecay"]
    argv += ["--out", str(tmp_path / "run"), "--max-length", "32", "--batch-size", "8", "--eval-batch-size", "8"]
    argv += ["--train-limit", "32", "--eval-limit", "16", "--steps", "4", "--log-every", "1", "--devices", "1"]
    argv += ["--lr", "1e-3", "--transform-lr", "1e-1", "--no-progress"]
    fit(config_from_argv(argv))
    results = read_json(tmp_path / "run" / "results.json")
    steps = [r for r in read_jsonl(tmp_path / "run" / "log.jsonl") if "loss" in r]
    assert len(steps) == 4 and all(np.isfinite(r["loss"]) for r in steps)
    assert "NaN" not in json.dumps(results) and results
