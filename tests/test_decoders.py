"""GPT-2, BART and mBART against Hugging Face PyTorch: tiny random models made here, saved, loaded back, compared.

Reference: transformers' PyTorch LM-head classes (float32, eager attention) with informative random LayerNorm,
bias and final_logits_bias values; hidden states compared on real tokens of padded batches.
"""

import json
import re

import jax
import numpy as np
import pytest

import isojax
from isojax.models import build_encoder, config_from_hf, model_kind

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from decoder_helpers import BART_SIZES, padded, tiny_hf_model  # noqa: E402  (needs torch)

ATOL = 1e-5
ARCHS = ["gpt2", "bart", "mbart"]


def close_on(mine, theirs, rows):
    """``mine`` and ``theirs`` ``[B, L, ...]`` agree within ATOL at the positions ``rows [B, L]``."""
    np.testing.assert_allclose(np.asarray(mine)[rows], np.asarray(theirs)[rows], atol=ATOL, rtol=0)


def close_probs(mine, theirs, rows):
    """Attention probabilities ``[B, heads, q, k]`` agree on the query rows ``rows [B, q]``."""
    close_on(np.asarray(mine).transpose(0, 2, 1, 3), np.asarray(theirs).transpose(0, 2, 1, 3), rows)


@pytest.fixture(scope="module", params=ARCHS)
def saved(request, tmp_path_factory):
    model = tiny_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    module, params, tokenizer = isojax.from_pretrained(str(path))
    assert tokenizer is None and module.config.model_type == request.param
    return request.param, model, path, module, params


def compare_with_torch(model, module, params, *, seed=0, left=False):
    """Every hidden state, attention (and cross-attention) probability and the logits, on padded batches."""
    if model_kind(module.config) == "causal_lm":
        ids, mask = padded((9, 4, 7, 1), 9, 99, 0, left=left, seed=seed)
        kwargs = {}
        if left:  # transformers' forward counts positions over padding; generate passes them from the mask
            kwargs["position_ids"] = torch.tensor(np.where(mask, mask.cumsum(1) - 1, 0))
        with torch.no_grad():
            ref = model(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask),
                output_hidden_states=True,
                output_attentions=True,
                **kwargs,
            )
        out = module.apply({"params": params}, ids, mask, output_attentions=True)
        rows = mask.astype(bool)
        pairs = [(out.hidden_states, ref.hidden_states), (out.attentions, ref.attentions)]
        assert len(out.hidden_states) == module.config.num_hidden_layers + 1
    else:
        ids, mask = padded((9, 4, 7, 1), 9, 99, 1, seed=seed)
        dec_ids, dec_mask = padded((6, 6, 2, 4), 6, 99, 1, seed=seed + 1)
        with torch.no_grad():
            ref = model(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask),
                decoder_input_ids=torch.tensor(dec_ids),
                decoder_attention_mask=torch.tensor(dec_mask),
                output_hidden_states=True,
                output_attentions=True,
            )
        out = module.apply({"params": params}, ids, mask, dec_ids, dec_mask, output_attentions=True)
        rows, src_rows = dec_mask.astype(bool), mask.astype(bool)
        for mine, theirs in zip(out.encoder.hidden_states, ref.encoder_hidden_states, strict=True):
            close_on(mine, theirs.numpy(), src_rows)
        for mine, theirs in zip(out.encoder.attentions, ref.encoder_attentions, strict=True):
            close_probs(mine, theirs.numpy(), src_rows)
        pairs = [
            (out.decoder.hidden_states, ref.decoder_hidden_states),
            (out.decoder.attentions, ref.decoder_attentions),
            (out.decoder.cross_attentions, ref.cross_attentions),
        ]
    for mine_all, theirs_all in pairs:
        assert len(mine_all) == len(theirs_all)
    for mine, theirs in zip(pairs[0][0], pairs[0][1]):
        close_on(mine, theirs.numpy(), rows)
    for mine_all, theirs_all in pairs[1:]:
        for mine, theirs in zip(mine_all, theirs_all):
            close_probs(mine, theirs.numpy(), rows)
    close_on(out.logits, ref.logits.numpy(), rows)
    return out


def test_every_hidden_state_attention_and_logit_matches_pytorch(saved):
    arch, model, _, module, params = saved
    compare_with_torch(model, module, params)
    if arch == "gpt2":  # a left-padded batch: positions from the mask
        compare_with_torch(model, module, params, left=True, seed=3)


def test_round_trip_reloads_in_pytorch_with_the_head_and_without(saved, tmp_path):
    arch, model, _, module, params = saved
    params = jax.tree.map(lambda p: p * 1.01 + 0.001, params)  # changed weights must survive the trip
    isojax.save_pretrained(module, params, str(tmp_path))
    lm_class = transformers.AutoModelForCausalLM if arch == "gpt2" else transformers.AutoModelForSeq2SeqLM
    reloaded = lm_class.from_pretrained(tmp_path).eval()
    reloaded.config._attn_implementation = "eager"
    assert type(reloaded) is type(model)
    compare_with_torch(reloaded, module, params, seed=5)
    base = transformers.AutoModel.from_pretrained(tmp_path)  # the bare model loads the same file
    assert type(base).__name__ == {"gpt2": "GPT2Model", "bart": "BartModel", "mbart": "MBartModel"}[arch]


def test_bare_base_model_checkpoints_load(tmp_path):
    """GPT2Model / BartModel files: no LM head, no final_logits_bias (zeros, as transformers initialises it)."""
    for arch, bare_class in (("gpt2", transformers.GPT2Model), ("bart", transformers.BartModel)):
        lm = tiny_hf_model(arch, seed=2)
        bare = bare_class(lm.config)
        bare.load_state_dict(lm.base_model.state_dict())
        bare.save_pretrained(tmp_path / arch)
        module, params, _ = isojax.from_pretrained(str(tmp_path / arch))
        if arch == "bart":
            assert not np.asarray(params["final_logits_bias"]).any()
            with torch.no_grad():
                lm.final_logits_bias.zero_()
        compare_with_torch(lm, module, params, seed=7)


def test_original_gpt2_layout_with_attention_buffers_loads(tmp_path):
    """The Hub's gpt2 checkpoint has no "transformer." prefix and keeps each block's causal-mask buffer
    ``h.N.attn.bias``; both are handled. A head that is not tied to the embeddings is refused."""
    from safetensors.numpy import save_file

    model = tiny_hf_model("gpt2", seed=4)
    model.save_pretrained(tmp_path / "lm")
    _, params, _ = isojax.from_pretrained(str(tmp_path / "lm"))
    state = {k: v.numpy() for k, v in model.transformer.state_dict().items()}
    state.update({f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 40, 40), np.float32)) for i in range(3)})
    (tmp_path / "config.json").write_text((tmp_path / "lm" / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    _, loaded, _ = isojax.from_pretrained(str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    state["lm_head.weight"] = state["wte.weight"] + 1.0
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="'lm_head.weight' differs from 'wte.weight'"):
        isojax.from_pretrained(str(tmp_path))


def test_fused_and_missing_keys_give_clear_errors(saved, tmp_path):
    from safetensors.numpy import load_file, save_file

    arch, _, path, _, _ = saved
    state = load_file(path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    if arch == "gpt2":
        bad = dict(state, **{"transformer.h.1.attn.c_attn.weight": np.zeros((32, 90), np.float32)})
        save_file(bad, tmp_path / "model.safetensors")
        with pytest.raises(
            ValueError,
            match=r"'h\.1\.attn\.c_attn\.weight' has shape \(32, 90\).*expects \(32, 32\).*"
            r"part \d of 3 along its last axis",
        ):
            isojax.from_pretrained(str(tmp_path))
        missing, stray = "transformer.h.2.mlp.c_fc.weight", "h.9.ln_1.weight"
    else:
        missing, stray = "model.decoder.layers.1.encoder_attn.k_proj.weight", "decoder.layers.9.fc1.weight"
    save_file({k: v for k, v in state.items() if k != missing}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"missing 1 key.*'{missing.split('.', 1)[1]}'"):
        isojax.from_pretrained(str(tmp_path))
    save_file(dict(state, **{stray: np.zeros(3, np.float32)}), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"unexpected base-model key.*'{stray}'"):
        isojax.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("model_type", ["gpt2", "bart"])
def test_a_config_with_token_types_for_a_model_without_them_is_refused(model_type):
    """GPT-2 and BART read no token types; a hand-made config left at the default type_vocab_size=2 is refused
    by name (it used to stop on a bare assertion)."""
    from isojax.models import TransformerConfig, build_model, init_params

    decoder = dict(decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=16) if model_type == "bart" else {}
    config = TransformerConfig(
        model_type=model_type,
        vocab_size=16,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=8,
        **decoder,
    )
    with pytest.raises(ValueError, match=f"this {model_type} model reads no token types.*type_vocab_size=2; set "):
        init_params(build_model(config), jax.random.key(0))


def test_bad_inputs_raise_clear_errors(saved):
    arch, _, _, module, params = saved
    apply = lambda *a, **k: module.apply({"params": params}, *a, **k)  # noqa: E731
    ids = np.full((2, 5), 4)
    if arch == "gpt2":
        with pytest.raises(ValueError, match="input_ids has length 41, longer than the 40 positions of this gpt2"):
            apply(np.ones((1, 41), np.int32))
        with pytest.raises(ValueError, match="gpt2 has no token types"):
            apply(ids, None, ids)
        return
    with pytest.raises(ValueError, match=f"decoder_input_ids is required: {arch} is an encoder-decoder"):
        apply(ids, None)
    with pytest.raises(ValueError, match=f"input_ids has length 41, longer than the 40 positions of this {arch}"):
        apply(np.ones((1, 41), np.int32), None, ids[:1])
    with pytest.raises(ValueError, match="decoder_input_ids has length 41, longer than the 40 positions"):
        apply(ids, None, np.ones((2, 41), np.int32))
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape \(2, 4\), decoder_input_ids \(2, 5\)"):
        apply(ids, None, ids, np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"decoder_input_ids holds \[99\] outside \[0, 99\)"):
        apply(ids, None, np.array([[1, 99]]))


def test_decoders_are_refused_where_an_encoder_is_required(saved, tmp_path, capsys):
    arch, _, path, module, _ = saved
    kind = "a causal language model" if arch == "gpt2" else "an encoder-decoder"
    with pytest.raises(ValueError, match=f"build_encoder needs an encoder .BERT family.; this {arch} model is {kind}"):
        build_encoder(module.config)
    if arch == "gpt2":  # a causal LM takes a last-layer transform and scans (tests/test_llms.py), not remat
        with pytest.raises(ValueError, match="remat='full' with transform_placement='output': only encoders recompute"):
            isojax.from_pretrained(str(path), remat="full")
    else:
        with pytest.raises(ValueError, match="last_layer_transform and scan_layers are supported on encoders and"):
            isojax.from_pretrained(str(path), last_layer_transform=isojax.SoftDecay())
        with pytest.raises(ValueError, match="last_layer_transform and scan_layers are supported on encoders and"):
            isojax.from_pretrained(str(path), scan_layers=True)
    from isojax.cli import main

    assert main(["sts", "--model", str(path), "--methods", "raw", "--alpha", "-0.5", "--no-isotropy", "--quiet"]) == 2
    assert re.search(
        f"isojax sts.*needs an encoder .BERT family.; this {arch} model is {kind}", capsys.readouterr().err
    )
    from isojax.train.config import ModelConfig, TaskConfig, TrainConfig
    from isojax.train.tasks.classification import build_task_model

    refusal = "has no tokenizer files" if arch == "gpt2" else f"fine-tuning a classifier.*this {arch} model is {kind}"
    with pytest.raises(ValueError, match=refusal):  # a causal LM classifies (tests/test_llms.py) given a tokenizer
        build_task_model(TrainConfig(model=ModelConfig(name=str(path)), task=TaskConfig(name="sst2")))


def test_config_json_options_isojax_does_not_implement_are_refused():
    gpt2 = transformers.GPT2Config(vocab_size=10, n_embd=8, n_layer=1, n_head=2).to_dict()
    for key, value in (
        ("scale_attn_by_inverse_layer_idx", True),
        ("add_cross_attention", True),
        ("tie_word_embeddings", False),
        ("embd_pdrop", 0.3),
    ):
        with pytest.raises(ValueError, match=key):
            config_from_hf(dict(gpt2, **{key: value}))
    bart = transformers.BartConfig(**BART_SIZES).to_dict()
    with pytest.raises(ValueError, match="encoder_layerdrop=0.1 is not supported"):
        config_from_hf(dict(bart, encoder_layerdrop=0.1))
    with pytest.raises(ValueError, match=r"no 'd_model' \(required for model_type 'bart'\)"):
        config_from_hf({k: v for k, v in bart.items() if k != "d_model"})


def test_dropout_is_active_when_not_deterministic(saved):
    arch, _, _, module, params = saved
    ids = np.full((2, 6), 4)
    args = (ids,) if arch == "gpt2" else (ids, None, ids)

    def run(seed):
        return np.asarray(
            module.apply({"params": params}, *args, deterministic=False, rngs={"dropout": jax.random.key(seed)}).logits
        )

    assert not np.allclose(run(0), run(1))
    np.testing.assert_array_equal(run(2), run(2))


# ---------------------------------------------------------------- analyses on GPT-2 (too-much-in-common's rows)

WORDS = ["cat", "dog", "car", "bus", "apple", "pear", "king", "queen"]


@pytest.fixture(scope="module")
def gpt2_with_tokenizer(tmp_path_factory):
    """A tiny GPT-2 and a byte-level BPE tokenizer (GPT-2's kind, no padding token) trained here on STS-B test
    sentences and a few words, saved together as a model directory."""
    from tokenizers import ByteLevelBPETokenizer

    from isojax.data.sts import load_sts

    data = load_sts("stsb", "test")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        data.sentences1[:300] + WORDS * 20, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    assert tokenizer.pad_token is None
    torch.manual_seed(3)
    cfg = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    path = tmp_path_factory.mktemp("gpt2-tok")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


def test_analyze_on_gpt2_equals_the_pytorch_hidden_states(gpt2_with_tokenizer, tmp_path):
    """``isojax analyze`` runs on GPT-2 (causal attention, padding token = end-of-text); its per-layer TokenUni
    equals the mean pairwise cosine of transformers' hidden states, sentence by sentence."""
    from isojax.cli import main
    from isojax.data.sts import load_sts

    path, model, tokenizer = gpt2_with_tokenizer
    assert (
        main(
            [
                "analyze",
                "--model",
                str(path),
                "--limit",
                "10",
                "--max-length",
                "32",
                "--out",
                str(tmp_path),
                "--json",
                str(tmp_path / "a.json"),
                "--quiet",
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "a.json").read_text())
    assert result["layers"] == [0, 1, 2] and result["num_texts"] == 10
    data = load_sts("stsb", "test")
    texts = list(dict.fromkeys(data.sentences1 + data.sentences2))[:10]
    per_layer = []
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        unit = [torch.nn.functional.normalize(h[0], dim=-1) for h in hidden]
        n = ids.shape[1]
        per_layer.append([((u @ u.T).sum() - n).item() / (n * (n - 1)) for u in unit])
    np.testing.assert_allclose(result["token_uni"], np.mean(per_layer, axis=0), atol=1e-4)
    assert "input_embeddings" in result and result["input_embeddings"]["I1"] > 0


def test_analyze_leaves_one_token_texts_out_of_the_sentence_columns(gpt2_with_tokenizer):
    """A one-token text (GPT-2's tokenizer gives them) has no pair of tokens, so no TokenUni: the sentence columns
    average the other texts, whose TokenUni equals the mean pairwise cosine of transformers' hidden states."""
    from isojax.eval import analyze_layers
    from isojax.models import from_pretrained

    path, model, tokenizer = gpt2_with_tokenizer
    texts = ["cat", "A man is playing a flute.", "dog", "A woman is slicing an onion."]
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert lengths[0] == lengths[2] == 1 and min(lengths[1::2]) >= 2, lengths
    module, params, padded = from_pretrained(str(path))  # its tokenizer pads with the end-of-text token
    result = analyze_layers(module, params, padded, texts)
    assert result["num_texts"] == 4 and result["num_sentence_texts"] == 2
    per_layer = []
    for text in texts[1::2]:
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states
        unit = [torch.nn.functional.normalize(h[0], dim=-1) for h in hidden]
        n = len(unit[0])
        per_layer.append([((u @ u.T).sum() - n).item() / (n * (n - 1)) for u in unit])
    np.testing.assert_allclose(result["token_uni"], np.mean(per_layer, axis=0), atol=1e-4)
    assert np.isfinite(result["rbf_dis"]).all() and np.isfinite(result["ev1"]).all()
    with pytest.raises(ValueError, match="every text has fewer than 2 tokens"):
        analyze_layers(module, params, padded, ["cat", "dog"])


def test_wordsim_on_gpt2_equals_a_numpy_computation(gpt2_with_tokenizer, tmp_path):
    """``isojax wordsim`` reads GPT-2's token embedding matrix: its cosine correlations equal scipy's on the rows
    of transformers' ``wte`` for the same pairs."""
    import scipy.stats

    from isojax.cli import main

    path, model, tokenizer = gpt2_with_tokenizer
    pairs = [
        ("cat", "dog", 8.0),
        ("car", "bus", 6.5),
        ("apple", "pear", 7.0),
        ("cat", "car", 1.5),
        ("king", "queen", 8.5),
        ("dog", "pear", 0.5),
    ]
    (tmp_path / "pairs.txt").write_text("".join(f"{a} {b} {s}\n" for a, b, s in pairs))
    assert (
        main(
            [
                "wordsim",
                "--model",
                str(path),
                "--data",
                "",
                "--file",
                str(tmp_path / "pairs.txt"),
                "--methods",
                "raw",
                "--similarity",
                "cosine",
                "--json",
                str(tmp_path / "w.json"),
            ]
        )
        == 0
    )
    (row,) = json.loads((tmp_path / "w.json").read_text())["rows"]
    assert row["pairs_used"] == len(pairs)
    wte = model.transformer.wte.weight.detach().numpy().astype(np.float64)
    ids = {w: tokenizer(w, add_special_tokens=False)["input_ids"] for w in WORDS}
    assert all(len(i) == 1 for i in ids.values())
    cos = [
        wte[ids[a][0]] @ wte[ids[b][0]] / np.linalg.norm(wte[ids[a][0]]) / np.linalg.norm(wte[ids[b][0]])
        for a, b, _ in pairs
    ]
    gold = [s for _, _, s in pairs]
    assert row["pearson"] == pytest.approx(100 * scipy.stats.pearsonr(cos, gold).statistic, abs=1e-6)
    assert row["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(cos, gold).statistic, abs=1e-6)
