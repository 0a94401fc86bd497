"""The pretrained masked-LM heads of the BERT family against transformers' ...ForMaskedLM, and the common-enemies
split applied to them.

References: transformers' PyTorch MLM models (logits on the real tokens of a padded batch); jax.grad of the
masked-LM cross-entropy with respect to the tied output matrix; numpy for the alignment cosines.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import isojax
from isojax import gradients
from isojax.models import load_mlm_head, word_embeddings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=60,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=42,
)


def tiny_mlm(arch: str):
    torch.manual_seed(0)
    if arch == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**TINY, hidden_act="gelu_new"))
    elif arch == "roberta":
        model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**TINY, pad_token_id=1))
    elif arch == "albert":
        model = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**TINY, embedding_size=16))
    elif arch == "distilbert":
        model = transformers.DistilBertForMaskedLM(
            transformers.DistilBertConfig(
                vocab_size=60, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=42
            )
        )
    else:
        model = transformers.MPNetForMaskedLM(transformers.MPNetConfig(**TINY, pad_token_id=1))
    model.config._attn_implementation = "eager"
    with torch.no_grad():  # informative LayerNorm and bias values everywhere, the tied weights kept tied
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _batch(pad_id):
    rng = np.random.default_rng(0)
    lengths = (9, 4, 7)
    ids = np.full((3, 9), pad_id, np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(pad_id + 1, 60, n)
        mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize("arch", ["bert", "roberta", "albert", "distilbert", "mpnet"])
def test_mlm_logits_match_pytorch(arch, tmp_path):
    model = tiny_mlm(arch)
    model.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    head, head_params = load_mlm_head(str(tmp_path))
    ids, mask = _batch(model.config.pad_token_id)
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    out = module.apply({"params": params}, ids, mask)
    got = head.apply({"params": head_params}, out.last_hidden_state, word_embeddings(params))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=1e-5, rtol=0)


def test_a_checkpoint_without_the_head_or_with_an_untied_one_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    model = tiny_mlm("bert")
    model.bert.save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match=r"no masked-LM head: missing \['cls.predictions.transform.dense.weight'"):
        load_mlm_head(str(tmp_path / "base"))
    model.save_pretrained(tmp_path / "mlm")
    state = load_file(tmp_path / "mlm" / "model.safetensors")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"] + 1
    save_file(state, tmp_path / "mlm" / "model.safetensors")
    with pytest.raises(ValueError, match="cls.predictions.decoder.weight' differs from"):
        load_mlm_head(str(tmp_path / "mlm"))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(
        json.dumps(dict(model_type="gpt2", vocab_size=60, n_embd=32, n_layer=1, n_head=4, n_positions=16))
    )
    with pytest.raises(ValueError, match="masked-LM head needs an encoder"):
        load_mlm_head(str(tmp_path / "gpt2"))


def test_common_enemies_split_of_a_tiny_mlm(tmp_path):
    """The split of the output-layer gradient of a masked-LM loss sums to jax.grad with respect to the tied W; the
    non-target part's mean direction and its cosine with W's mean agree with a numpy computation."""
    model = tiny_mlm("bert")
    model.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    head, head_params = load_mlm_head(str(tmp_path))
    ids, mask = _batch(0)
    positions = np.argwhere(mask.astype(bool))[::2]  # "masked" positions: every other real token
    targets = jnp.asarray(ids[positions[:, 0], positions[:, 1]])
    hidden = module.apply({"params": params}, ids, mask).last_hidden_state[positions[:, 0], positions[:, 1]]
    t = head.apply({"params": head_params}, hidden, method=head.transform)
    w, bias = word_embeddings(params), head_params["bias"]
    split = gradients.softmax_gradient_split(w, t, targets, bias=bias)

    def loss(w):
        logits = t @ w.T + bias
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    np.testing.assert_allclose(split.target + split.non_target, jax.grad(loss)(w), atol=1e-6)
    alignment = gradients.common_enemies_alignment(w, split.non_target)
    g, mu = -np.asarray(split.non_target, np.float64).sum(0), np.asarray(w, np.float64).mean(0)
    assert float(alignment.mean_cosine) == pytest.approx(g @ mu / np.linalg.norm(g) / np.linalg.norm(mu), abs=1e-5)
