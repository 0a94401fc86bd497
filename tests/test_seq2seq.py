"""Pieces of sequence-to-sequence fine-tuning against independent references: the label-smoothed cross-entropy
(PyTorch's ``cross_entropy``), the shifted decoder inputs (transformers' ``shift_tokens_right`` of BART and mBART),
BLEU and ROUGE (sacrebleu and rouge-score called directly), the trained flow layer (the fitted flow of
:mod:`isojax.calibrate.flow` on the same parameters, and a float64 numpy Gaussian log-density), and the errors of
bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
import seq2seq_helpers
import torch
from conftest import require
from rouge_score import rouge_scorer
from transformers.models.bart.modeling_bart import shift_tokens_right as bart_shift
from transformers.models.mbart.modeling_mbart import shift_tokens_right as mbart_shift

from isojax.calibrate import Flow, FlowState, apply_flow
from isojax.data.seq2seq import Seq2SeqData, load_seq2seq, seq2seq_task
from isojax.eval.generation_metrics import bleu, generation_metrics, rouge
from isojax.train.tasks.seq2seq import IGNORE_INDEX, Seq2SeqSplit, label_smoothed_cross_entropy, shift_tokens_right

HYPOTHESES = [
    "the cat sat on the mat",
    "a quick brown fox jumps over a lazy dog",
    "Hello there, general Kenobi!",
    "rain in spain stays mainly",
    "it is what it is",
]
REFERENCES = [
    "the cat is sitting on the mat",
    "the quick brown fox jumped over the lazy dog",
    "hello there general kenobi",
    "the rain in Spain stays mainly in the plain",
    "it is what it was",
]
SECOND = [
    "a cat sat on a mat",
    "quick brown foxes jump over lazy dogs",
    "Hello there, General Kenobi!",
    "rain in spain falls mainly on the plain",
    "it is as it is",
]


def _padded_labels(rng, lengths, width, vocab):
    labels = np.full((len(lengths), width), IGNORE_INDEX, np.int64)
    for i, n in enumerate(lengths):
        labels[i, :n] = rng.integers(3, vocab, n)
    return labels


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_cross_entropy_matches_torch(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 3
    labels = _padded_labels(rng, [7, 4, 1], 7, 11)
    losses, mask = jax.jit(label_smoothed_cross_entropy)(logits, labels, label_smoothing=eps)  # eps traced
    want = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, 11),
        torch.tensor(labels).reshape(-1),
        label_smoothing=eps,
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    np.testing.assert_allclose(np.asarray(losses).ravel(), want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mask, labels != IGNORE_INDEX)
    mean = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, 11),
        torch.tensor(labels).reshape(-1),
        label_smoothing=eps,
        ignore_index=IGNORE_INDEX,
    )
    np.testing.assert_allclose(float(np.sum(losses) / np.sum(mask)), float(mean), rtol=1e-5)


def test_label_smoothed_cross_entropy_rejects_mismatched_labels():
    with pytest.raises(ValueError, match=r"labels must have shape \(2, 3\)"):
        label_smoothed_cross_entropy(np.zeros((2, 3, 5)), np.zeros((2, 4), np.int32))


@pytest.mark.parametrize("start", [2, None], ids=["bart", "mbart"])
def test_shift_tokens_right_matches_transformers(start):
    rng = np.random.default_rng(1)
    labels = _padded_labels(rng, [6, 3, 5, 1], 6, 20)
    if start is None:  # mBART's targets end with </s> and the language code
        for i, n in enumerate([6, 3, 5, 1]):
            labels[i, n - 1] = 17
    got = shift_tokens_right(labels, 1, start)
    want = bart_shift(torch.tensor(labels), 1, start) if start is not None else mbart_shift(torch.tensor(labels), 1)
    np.testing.assert_array_equal(got, want.numpy())


def test_shift_tokens_right_rejects_non_integer_labels():
    with pytest.raises(ValueError, match="labels must be integer"):
        shift_tokens_right(np.zeros((2, 3), np.float32), 1, 2)


def test_split_arrays_tokenise_and_shift_as_transformers():
    tokenizer = seq2seq_helpers.digit_tokenizer()
    data = Seq2SeqData(["1 2 3", "4 5", "6"], ["3 2 1", "5 4 9 9", "6"], seq2seq_task("seq2seq"), "train")
    split = Seq2SeqSplit(data, tokenizer, max_length=8, max_target_length=5, decoder_start_token_id=2)
    arrays = split.arrays([0, 1, 2])
    want = tokenizer(text_target=data.targets, max_length=5, truncation=True, padding="longest", return_tensors="pt")
    labels = want["input_ids"].masked_fill(want["attention_mask"] == 0, IGNORE_INDEX)
    np.testing.assert_array_equal(arrays["labels"], labels.numpy())
    np.testing.assert_array_equal(arrays["decoder_input_ids"], bart_shift(labels, 1, 2).numpy())
    np.testing.assert_array_equal(arrays["decoder_attention_mask"], want["attention_mask"].numpy())
    assert arrays["labels"][1].tolist() == [0, 9, 8, 13, 2]  # <s> 5 4 9 </s>: truncated to 5 tokens, ends with </s>
    source = tokenizer(data.sources, padding="longest", return_tensors="np")
    np.testing.assert_array_equal(arrays["input_ids"], source["input_ids"])


def test_corpus_bleu_equals_sacrebleu():
    assert bleu(HYPOTHESES, REFERENCES) == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-12
    )
    two = [[a, b] for a, b in zip(REFERENCES, SECOND)]
    assert bleu(HYPOTHESES, two) == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, SECOND]).score, abs=1e-12
    )
    lower = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True).score
    assert bleu(HYPOTHESES, REFERENCES, lowercase=True) == pytest.approx(lower, abs=1e-12)
    assert lower > bleu(HYPOTHESES, REFERENCES)  # case matters by default ("Hello" vs "hello")
    assert bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)


def test_sentence_bleu_is_the_mean_of_sacrebleus_sentence_scores():
    want = np.mean([sacrebleu.sentence_bleu(h, [r]).score for h, r in zip(HYPOTHESES, REFERENCES)])
    assert bleu(HYPOTHESES, REFERENCES, level="sentence") == pytest.approx(want, abs=1e-12)
    assert want != pytest.approx(bleu(HYPOTHESES, REFERENCES))


def test_rouge_equals_rouge_score():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(r, h) for h, r in zip(HYPOTHESES, REFERENCES)]
    got = rouge(HYPOTHESES, REFERENCES)
    for t in ("rouge1", "rouge2", "rougeL"):
        assert got[t] == pytest.approx(100 * np.mean([s[t].fmeasure for s in scores]), abs=1e-12)
    plain = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False)
    assert rouge(HYPOTHESES, REFERENCES, types=["rouge1"], use_stemmer=False)["rouge1"] == pytest.approx(
        100 * np.mean([plain.score(r, h)["rouge1"].fmeasure for h, r in zip(HYPOTHESES, REFERENCES)]), abs=1e-12
    )
    best = [
        max(scorer.score(a, h)["rouge2"].fmeasure, scorer.score(b, h)["rouge2"].fmeasure)
        for h, a, b in zip(HYPOTHESES, REFERENCES, SECOND)
    ]
    multi = rouge(HYPOTHESES, [[a, b] for a, b in zip(REFERENCES, SECOND)], types=["rouge2"])
    assert multi["rouge2"] == pytest.approx(100 * np.mean(best), abs=1e-12)


def test_generation_metrics_picks_the_named_metrics():
    out = generation_metrics(("bleu", "rougeL"), HYPOTHESES, REFERENCES)
    assert set(out) == {"bleu", "rougeL"}
    assert out["rougeL"] == rouge(HYPOTHESES, REFERENCES, types=["rougeL"])["rougeL"]


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: bleu(["a", "b"], ["a"]), ValueError, r"hypotheses \(2\) and references \(1\)"),
        (lambda: bleu("a b", ["a b"]), TypeError, "hypotheses must be a sequence of strings"),
        (lambda: bleu(["a", 3], ["a", "b"]), TypeError, r"hypotheses\[1\] must be a string"),
        (lambda: bleu([], []), ValueError, "at least one text"),
        (lambda: bleu(["a"], ["a"], level="doc"), ValueError, "level must be one of"),
        (lambda: bleu(["a", "b"], [["a"], ["b", "c"]]), ValueError, "same number of references"),
        (lambda: rouge(["a"], [[]]), TypeError, r"references\[0\] must be a string or a non-empty list"),
        (lambda: rouge(["a"], ["a"], types=["rouge3"]), ValueError, "types must be some of"),
        (lambda: generation_metrics(("meteor",), ["a"], ["a"]), ValueError, "unknown generation metric"),
    ],
)
def test_bad_metric_input_is_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _flow_and_state(rows, x):
    flow = Flow(levels=2, depth=2, hidden=16)
    variables = flow.init(jax.random.key(3), rows)
    state = FlowState(
        params=variables["params"]["glow"],
        constants=variables["constants"]["glow"],
        log_likelihood=jnp.zeros(0),
        levels=2,
        depth=2,
        hidden=16,
    )
    return flow, variables, state


def test_flow_layer_is_the_fitted_flow_on_the_same_parameters():
    """z = f(x) equals apply_flow's, and log_likelihood = (log N(z; 0, I) + log|det|) / d (numpy, float64)."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(40, 8)).astype(np.float32) * np.linspace(0.5, 3, 8) + 2
    x = rng.normal(size=(3, 5, 8)).astype(np.float32) * 2
    flow, variables, state = _flow_and_state(rows, x)
    z_ref, logdet = apply_flow(state, x)
    np.testing.assert_allclose(flow.apply(variables, x), z_ref, rtol=1e-6, atol=1e-6)
    z64 = np.asarray(z_ref).astype(np.float64)
    want = (-0.5 * np.sum(z64**2, -1) - 4 * np.log(2 * np.pi) + np.asarray(logdet).astype(np.float64)) / 8
    got = flow.apply(variables, x, method=Flow.log_likelihood)
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_flow_layer_gradients_reach_disjoint_parameters():
    """The task path f(x) trains x (the model below) but not the flow; the likelihood trains the flow but not x."""
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(32, 8)).astype(np.float32)
    flow, variables, _ = _flow_and_state(rows, rows)
    consts = {"constants": variables["constants"]}
    d_params = jax.grad(lambda p: jnp.sum(flow.apply({"params": p, **consts}, rows) ** 2))(variables["params"])
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(d_params))
    d_x = jax.grad(lambda x: jnp.sum(flow.apply(variables, x) ** 2))(rows)
    assert np.any(np.asarray(d_x) != 0)
    ll = lambda p, x: jnp.mean(flow.apply({"params": p, **consts}, x, method=Flow.log_likelihood))  # noqa: E731
    assert np.all(np.asarray(jax.grad(ll, argnums=1)(variables["params"], rows)) == 0)
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(jax.grad(ll)(variables["params"], rows)))


def test_flow_layer_rejects_too_few_features():
    with pytest.raises(ValueError, match=r"needs \[..., d\] with d > 2\*\*\(levels-1\) = 4"):
        Flow(levels=3).init(jax.random.key(0), np.zeros((4, 4), np.float32))


def test_missing_target_column_names_the_file(tmp_path):
    require("datasets")
    (tmp_path / "train.jsonl").write_text('{"source": "1 2", "summary": "2 1"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl.*target"):
        load_seq2seq("seq2seq", "train", source=str(tmp_path))
    with pytest.raises(ValueError, match="has no Hub copy"):
        load_seq2seq("seq2seq", "train")
    with pytest.raises(ValueError, match="unknown sequence-to-sequence task"):
        load_seq2seq("wmt14", "train", source=str(tmp_path))


def test_translation_columns_are_read_from_the_dictionaries(tmp_path):
    require("datasets")
    (tmp_path / "validation.jsonl").write_text(
        '{"translation": {"en": "a house", "ro": "o casa"}}\n{"translation": {"en": "a cat"}}\n'
    )
    with pytest.raises(ValueError, match=r"line 2.*text under 'ro'"):
        load_seq2seq("wmt16_en_ro", "validation", source=str(tmp_path))
