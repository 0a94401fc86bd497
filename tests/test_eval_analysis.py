"""The layer analysis of hidden states from any source (isojax.eval.analysis) against numpy / the isoscore package /
transformers' PyTorch hidden states, the ``isojax analyze --texts`` command, and no recompilation on a second call."""

import json

import jax
import jax.monitoring
import numpy as np
import pytest
from conftest import require

from isojax.eval import analysis, encode

LAYERS, D = 3, 6


def unit(x):
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def isoscore_numpy(x):
    """IsoScore by REFERENCE.md's steps: PCA variances (ddof 1), scaled to norm √d, the defect δ, the score."""
    d = x.shape[1]
    v = np.linalg.eigvalsh(np.cov(x.T))
    v = v * np.sqrt(d) / np.linalg.norm(v)
    delta = np.linalg.norm(v - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    return ((d - delta**2 * (d - np.sqrt(d))) ** 2 - d) / (d * (d - 1))


def synthetic_batches(seed=0):
    """Three batches of texts of different widths, right-padded with garbage; every second batch as a tuple of
    per-layer ``[B, L, d]`` arrays. Returns the batches and, per text, its ``[layers, n, d]`` real states and content
    mask (the first token of each text is not content, like [CLS])."""
    rng = np.random.default_rng(seed)
    batches, texts = [], []
    for b, (size, width) in enumerate([(4, 7), (3, 5), (5, 9)]):
        lengths = rng.integers(1, width + 1, size=size)
        lengths[0] = width
        mask = np.arange(width) < lengths[:, None]
        h = rng.normal(size=(size, LAYERS, width, D)) * rng.uniform(0.2, 3, size=D) + rng.normal(size=D)
        h[:, :, 0, 2] += 30.0  # a massive first token
        h = np.where(mask[:, None, :, None], h, 1e6).astype(np.float32)
        content = mask & (np.arange(width) > 0)
        batches.append(((tuple(h[:, layer] for layer in range(LAYERS)) if b % 2 else h), mask, content))
        texts += [(h[i][:, mask[i]].astype(np.float64), content[i][mask[i]]) for i in range(size)]
    return batches, texts


def test_analysis_of_any_hidden_states_equals_numpy_on_all_content_tokens():
    batches, texts = synthetic_batches()
    result = analysis.analyze_hidden_states(batches)
    pooled = np.concatenate([h[:, content] for h, content in texts], axis=1)  # [layers, T, d]
    assert result["layers"] == [0, 1, 2] and result["num_texts"] == len(texts)
    assert result["num_tokens"] == pooled.shape[1]
    for layer in range(LAYERS):
        x = pooled[layer]
        np.testing.assert_allclose(result["isoscore"][layer], isoscore_numpy(x), rtol=2e-4)
        s2 = np.linalg.svd(x, compute_uv=False) ** 2
        np.testing.assert_allclose(result["anisotropy"][layer], s2[0] / s2.sum(), rtol=1e-4)
        c2 = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
        np.testing.assert_allclose(result["anisotropy_centered"][layer], c2[0] / c2.sum(), rtol=1e-4)
        u = unit(x)
        n = len(x)
        np.testing.assert_allclose(result["mean_cosine"][layer], ((u @ u.T).sum() - n) / (n * (n - 1)), rtol=1e-4)
        cc = (u.sum(0) ** 2 - (u * u).sum(0)) / (n * (n - 1))
        np.testing.assert_allclose(result["rogue_top1_share"][layer], np.abs(cc).max() / np.abs(cc).sum(), rtol=1e-4)
        where = np.unravel_index(np.abs(x).argmax(), x.shape)
        assert result["max_abs"][layer] == pytest.approx(np.abs(x).max(), rel=1e-6)
        assert result["max_abs_dim"][layer] == where[1]
    # The per-text columns: numpy on each text's real tokens (all of them), averaged over the texts of 2 or more.
    paired = [h for h, _ in texts if h.shape[1] >= 2]
    assert result["num_sentence_texts"] == len(paired)
    token_uni = [[((unit(h[lay]) @ unit(h[lay]).T).sum() - h.shape[1]) / (h.shape[1] * (h.shape[1] - 1))
                  for lay in range(LAYERS)] for h in paired]  # fmt: skip
    np.testing.assert_allclose(result["token_uni"], np.mean(token_uni, 0), rtol=1e-4)
    ratio = [[np.abs(h[lay]).max() / np.median(np.abs(h[lay])) for lay in range(LAYERS)] for h in paired]
    np.testing.assert_allclose(result["massive_ratio"], np.mean(ratio, 0), rtol=1e-4)


def test_tokens_per_text_counts_the_first_content_tokens():
    batches, texts = synthetic_batches(1)
    result = analysis.analyze_hidden_states(batches, tokens_per_text=2)
    first_two = np.concatenate([h[:, np.flatnonzero(content)[:2]] for h, content in texts], axis=1)
    assert result["num_tokens"] == first_two.shape[1] < sum(c.sum() for _, c in texts)
    np.testing.assert_allclose(result["isoscore"], [isoscore_numpy(x) for x in first_two], rtol=2e-4)


def test_bad_batches():
    batches, _ = synthetic_batches()
    h, mask, _ = batches[0]
    with pytest.raises(ValueError, match="batches is empty"):
        analysis.analyze_hidden_states([])
    with pytest.raises(ValueError, match=r"mask must be a bool array of shape \[B, L\]"):
        analysis.analyze_hidden_states([(h, mask[:, :-1])])
    with pytest.raises(ValueError, match=r"hidden_states must be \[B, layers, L, d\]"):
        analysis.analyze_hidden_states([(h[0], mask)])
    with pytest.raises(TypeError, match="batches must yield"):
        analysis.analyze_hidden_states([h])
    bad = h.copy()
    bad[1, 2, 0, 0] = np.nan  # a real token of layer 2
    result = analysis.analyze_hidden_states([(bad, mask)])
    assert np.isnan(result["isoscore"][2]) and np.isfinite(result["isoscore"][:2]).all()  # NaN, never a number


@pytest.fixture(scope="module")
def default_model(default_model_path):
    import isojax

    return isojax.from_pretrained("default")


SENTENCES = [
    "A man is playing a guitar.",
    "Stocks fell sharply today after the report.",
    "Hi",
    "The cat sat on the mat while the dog slept.",
    "Two children are running through a field of tall grass.",
]


def test_isoscore_of_all_content_tokens_equals_pytorch_hidden_states_and_the_isoscore_package(default_model, tmp_path):
    """``isojax analyze --texts FILE`` on the bundled model: per layer, IsoScore over all content tokens equals the
    isoscore package on transformers' PyTorch hidden states of the same tokens ([CLS]/[SEP] left out)."""
    transformers, torch = require("transformers"), require("torch")
    isoscore_package = require("IsoScore.IsoScore")
    from isojax.cli import main
    from isojax.models.hub import bundled_model_path

    _, _, tokenizer = default_model
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(SENTENCES[:3]) + "\n\n" + "\n".join(SENTENCES[3:]) + "\n")
    code = main(
        ["analyze", "--texts", str(path), "--out", str(tmp_path), "--json", str(tmp_path / "a.json"), "--quiet"]
    )
    assert code == 0
    result = json.loads((tmp_path / "a.json").read_text())
    reference = transformers.AutoModel.from_pretrained(bundled_model_path()).eval()
    per_layer = [[] for _ in range(7)]
    for text in SENTENCES:
        enc = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            hidden = reference(**enc, output_hidden_states=True).hidden_states
        for layer, h in enumerate(hidden):
            per_layer[layer].append(h[0, 1:-1].numpy().astype(np.float64))  # content: not [CLS], not [SEP]
    pooled = [np.concatenate(p) for p in per_layer]
    assert result["num_texts"] == 5 and result["num_tokens"] == len(pooled[0]) and result["texts"] == str(path)
    expected = [float(isoscore_package.IsoScore(x)) for x in pooled]
    np.testing.assert_allclose(result["isoscore"], expected, rtol=1e-3, atol=1e-5)
    expected_max = [np.abs(x).max() for x in pooled]
    np.testing.assert_allclose(result["max_abs"], expected_max, rtol=1e-3)

    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("\n".join(json.dumps({"id": i, "body": t}) for i, t in enumerate(SENTENCES)))
    args = ["analyze", "--texts", str(jsonl), "--field", "body", "--max-texts", "4", "--quiet"]
    assert main(args + ["--out", str(tmp_path), "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["num_texts"] == 4
    assert main(["analyze", "--texts", str(jsonl), "--quiet", "--out", str(tmp_path)]) == 2  # no "text" field

    # --dataset: a local directory in the Hub's layout (a CSV per split), read through the datasets package
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.csv").write_text("body,label\n" + "".join(f'"{t}",{i}\n' for i, t in enumerate(SENTENCES)))
    args = ["analyze", "--dataset", str(corpus), "--split", "train", "--field", "body", "--quiet", "--out"]
    assert main(args + [str(tmp_path), "--json", str(tmp_path / "c.json")]) == 0
    from_dataset = json.loads((tmp_path / "c.json").read_text())
    assert from_dataset["num_tokens"] == result["num_tokens"] and from_dataset["split"] == "train"
    np.testing.assert_allclose(from_dataset["isoscore"], result["isoscore"], rtol=1e-6)
    assert main(["analyze", "--dataset", str(corpus), "--split", "train", "--quiet", "--out", str(tmp_path)]) == 2


def test_a_second_identical_call_compiles_nothing(default_model):
    """encode and analyze_layers reuse their compiled functions: the second identical call compiles 0 times."""
    module, params, tokenizer = default_model
    compiles = []

    def listener(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for fn in (encode, analysis.analyze_layers):
            fn(module, params, tokenizer, SENTENCES)
            compiles.clear()
            fn(module, params, tokenizer, SENTENCES)
            assert compiles == [], f"{fn.__name__}: {len(compiles)} compilations on the second identical call"
        assert analysis.analyze_layers(module, params, tokenizer, SENTENCES[:2])["num_texts"] == 2
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_twonn_of_a_sample_holding_every_content_token_equals_scikit_dimension():
    skdim = require("skdim")
    batches, texts = synthetic_batches(2)
    pooled = np.concatenate([h[:, content] for h, content in texts], axis=1)  # [layers, T, d]
    result = analysis.analyze_hidden_states(batches, twonn_tokens=1000)  # more than the T content tokens
    assert result["twonn_tokens"] == pooled.shape[1]
    want = [skdim.id.TwoNN().fit(x).dimension_ for x in pooled]
    np.testing.assert_allclose(result["twonn"], want, rtol=1e-4)
    sampled = analysis.analyze_hidden_states(batches, twonn_tokens=12)
    assert sampled["twonn_tokens"] == 12 and np.isfinite(sampled["twonn"]).all()
    assert "twonn" not in analysis.analyze_hidden_states(batches, twonn_tokens=0)


def test_the_massive_activation_map_covers_every_real_token_with_its_position():
    """The first token of each synthetic text (not content, like [CLS]) holds +30 in dimension 2: the map finds it
    at position 0, while max_abs, over content tokens only, does not."""
    batches, texts = synthetic_batches()
    result = analysis.analyze_hidden_states(batches)
    found = result["massive_map"]
    every = np.concatenate([h for h, _ in texts], axis=1)  # [layers, T, d], every real token
    largest = np.abs(every).max(axis=1)  # [layers, d]
    assert found["dims"][0] == 2 and len(found["dims"]) == D
    np.testing.assert_allclose(np.asarray(found["max_abs"]), largest[:, found["dims"]], rtol=1e-6)
    assert all(row[0] == 0 for row in found["position"])  # at the first token
    assert all(m < big for m, big in zip(result["max_abs"], largest[:, 2]))


def test_sink_columns_average_the_first_attention_of_every_text_and_head():
    batches, _ = synthetic_batches()
    rng = np.random.default_rng(3)
    firsts = [rng.uniform(0, 0.6, size=(b[1].shape[0], LAYERS, 4)).astype(np.float32) for b in batches]
    result = analysis.analyze_hidden_states([(*b, f) for b, f in zip(batches, firsts)])
    every = np.concatenate(firsts)  # [texts, layers, heads]
    np.testing.assert_allclose(result["sink_alpha1"], every.mean(axis=(0, 2)), rtol=1e-6)
    np.testing.assert_allclose(result["sink_rate"], (every > 0.3).mean(axis=(0, 2)), rtol=1e-6)
    assert "sink_rate" not in analysis.analyze_hidden_states(batches)
    with pytest.raises(ValueError, match="every batch or with none"):
        analysis.analyze_hidden_states([(*batches[0], firsts[0]), batches[1]])
    with pytest.raises(ValueError, match=r"first_attention must be \[B, layers, heads\]"):
        analysis.analyze_hidden_states([(*batches[0], firsts[0][:, :1])])


def test_the_sinks_of_a_causal_lm_equal_those_of_pytorch_attention_probabilities(tmp_path):
    """A tiny Llama through ``analyze_layers``: α₁ and Sink_0.3 per layer from transformers' attention probabilities
    (numpy: the mean over real queries of the attention paid to the first token)."""
    transformers, torch = require("transformers"), require("torch")
    from decoder_helpers import tiny_llm

    import isojax

    model = tiny_llm("llama-gqa-llama3-rope")
    model.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    texts = ["a b c d e", "b c", "c d e f g h i", "d e f"]

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{chr(ord("a") + i): 3 + i for i in range(9)}}  # one id per letter
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")
    result = analysis.analyze_layers(module, params, tokenizer, texts, batch_size=2, twonn_tokens=0)
    alpha = []
    for text in texts:
        ids = torch.tensor([[3 + ord(w) - ord("a") for w in text.split()]])
        with torch.no_grad():
            probs = model(input_ids=ids, output_attentions=True).attentions  # per layer [1, heads, n, n]
        alpha.append([p[0, :, :, 0].numpy().mean(axis=-1) for p in probs])  # [layers, heads]
    alpha = np.asarray(alpha)  # [texts, layers, heads]
    assert np.isnan(result["sink_alpha1"][0])  # layer 0, the embedding output, attends to nothing
    np.testing.assert_allclose(result["sink_alpha1"][1:], alpha.mean(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(result["sink_rate"][1:], (alpha > 0.3).mean(axis=(0, 2)))
