"""The model contract (isojax.models.registry) for every architecture, encoders and decoders: config translation
against transformers' config classes, partition rules that name every parameter, the accessors train/ and eval/
use, and MPNet's relative-position buckets against Hugging Face's function.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from isojax import SoftDecay
from isojax.models import (
    ARCHITECTURES,
    TRANSFORM,
    build_encoder,
    build_model,
    config_from_hf,
    config_to_hf,
    has_pooler,
    init_params,
    model_kind,
    partition_rules,
    to_scanned,
    uses_token_types,
    word_embeddings,
)
from isojax.models.registry import buffers, parameter_group
from isojax.train.model import TaskModel, init_variables
from isojax.train.parallel import partition_spec

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40)


LLMS = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text")
KINDS = {"gpt2": "causal_lm", "bart": "encoder_decoder", "mbart": "encoder_decoder", **dict.fromkeys(LLMS, "causal_lm")}


def hf_config(model_type: str):
    """A tiny transformers config object of ``model_type`` (the independent reference for the translation)."""
    if model_type == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=40, max_position_embeddings=40, dropout=0.15
        )
    if model_type == "gpt2":
        return transformers.GPT2Config(
            vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=40, n_positions=42, resid_pdrop=0.15, embd_pdrop=0.15
        )
    if model_type in ("bart", "mbart"):
        return transformers.AutoConfig.for_model(
            model_type,
            vocab_size=99,
            d_model=32,
            encoder_layers=2,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=2,
            encoder_ffn_dim=40,
            decoder_ffn_dim=24,
            max_position_embeddings=42,
            dropout=0.15,
            scale_embedding=True,
        )
    if model_type in LLMS:  # dropout only in attention; grouped-query heads
        return transformers.AutoConfig.for_model(
            model_type, **TINY, num_key_value_heads=2, max_position_embeddings=42, attention_dropout=0.15
        )
    extra = {"albert": dict(embedding_size=16, num_hidden_groups=2, inner_group_num=1)}.get(model_type, {})
    return transformers.AutoConfig.for_model(
        model_type, **TINY, max_position_embeddings=42, hidden_dropout_prob=0.15, **extra
    )


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_config_translation_agrees_with_transformers(model_type):
    ref = hf_config(model_type)
    cfg = config_from_hf(ref.to_dict())
    assert cfg.model_type == model_type and cfg.hidden_size == 32 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4 and cfg.intermediate_size == 40
    if model_type in LLMS:
        assert cfg.attention_probs_dropout_prob == 0.15 and cfg.hidden_dropout_prob == 0
        assert (
            cfg.key_value_heads == 2
            and cfg.attention_head_dim == (getattr(ref, "head_dim", None) or 8)
            and cfg.norm == "rms_norm"
        )
        assert cfg.tie_word_embeddings == ref.tie_word_embeddings and cfg.layer_norm_eps == ref.rms_norm_eps
    else:
        assert cfg.hidden_dropout_prob == 0.15
    assert cfg.pad_token_id == ref.pad_token_id
    assert uses_token_types(cfg) == (model_type in ("bert", "roberta", "albert"))
    assert model_kind(cfg) == KINDS.get(model_type, "encoder")
    # positions: RoBERTa and MPNet start after the padding index, BART's at 2 (on a table 2 rows longer)
    assert cfg.max_sequence_length == (
        42 - ref.pad_token_id - 1 if model_type in ("roberta", "mpnet") else ref.max_position_embeddings
    )
    assert cfg.pre_norm == (model_type in ("gpt2", "mbart", *LLMS))
    if model_type in ("bart", "mbart"):
        dec = cfg.decoder_config()
        assert (dec.num_hidden_layers, dec.num_attention_heads, dec.intermediate_size) == (3, 2, 24)
        assert cfg.scale_embedding and (cfg.eos_token_id, cfg.forced_eos_token_id) == (2, 2)
    made_in_code = dataclasses.replace(cfg, hf_config=None)
    written = config_to_hf(made_in_code)
    reread = transformers.AutoConfig.for_model(**written)  # transformers accepts what isojax writes
    assert type(reread) is type(ref)
    assert config_from_hf(reread.to_dict()) == made_in_code


def test_unknown_model_type_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"unknown model_type 'gpt5'; isojax supports bert, roberta, .*mpnet"):
        config_from_hf({"model_type": "gpt5"})
    with pytest.raises(ValueError, match=r"no 'hidden_size' \(required for model_type 'bert'\)"):
        config_from_hf({"model_type": "bert", "vocab_size": 10})


def _all_parameter_paths(model_type: str, scan_layers: bool = False):
    """(model, params): an encoder with every optional part (SoftDecay, IsoBN, Isotropy Layer, head) in a
    TaskModel, or a decoder model with its LM head."""
    cfg = config_from_hf(hf_config(model_type).to_dict())
    if model_kind(cfg) != "encoder":
        model = build_model(cfg)
        return model, init_params(model, jax.random.key(0))
    encoder = build_encoder(cfg, last_layer_transform=SoftDecay(), scan_layers=scan_layers)
    params = encoder.init(jax.random.key(0), jnp.ones((1, 5), jnp.int32))["params"]
    model = TaskModel(encoder, num_labels=3, use_isobn=True, use_isotropy_layer=True)
    variables = init_variables(model, params, jax.random.key(1))
    return model, variables["params"]


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_parameter_of_every_architecture_matches_a_partition_rule(model_type):
    model, params = _all_parameter_paths(model_type)
    rules = partition_rules(model.config) if model_type in KINDS else model.partition_rules()
    specs = {
        "/".join(path): partition_spec("/".join(path), leaf.shape, 2, rules)
        for path, leaf in traverse_util.flatten_dict(params).items()
    }
    assert specs  # partition_spec raises for a parameter no rule names
    sharded = {path for path, spec in specs.items() if spec != P()}
    # Megatron: per block, q/k/v kernels and biases, the feed-forward input kernel and bias, two output kernels;
    # a decoder block's cross-attention adds its q/k/v kernels and biases and its output kernel
    # (an LLM block: q/k/v kernels (and Qwen2's biases), gate and up kernels, two output kernels; an untied LM head)
    blocks = {path.split("/attention/")[0] for path in specs if "/attention/query/kernel" in path}
    cross = {path.split("/cross_attention/")[0] for path in specs if "/cross_attention/query/kernel" in path}
    per_block = 10 if model_type not in LLMS else 7 + 3 * model.config.attention_bias
    assert len(sharded) == per_block * len(blocks) + 7 * len(cross) and blocks  # (vocabulary 99: LM head whole)
    assert len(cross) == (3 if model_type in ("bart", "mbart") else 0)
    assert all(specs[f"{b}/attention/query/kernel"] == P(None, "model") for b in blocks)
    assert all(specs[f"{b}/output/kernel"] == P("model", None) for b in blocks)


@pytest.mark.parametrize("model_type", sorted(set(ARCHITECTURES) - set(KINDS)))
def test_partition_rules_cover_a_scanned_stack_as_its_layers(model_type):
    """Scanned (``scan_layers=True``), every parameter still matches a rule, and a block's stacked ``[L, ...]`` weight
    is laid out as its per-layer weights with a leading unsharded axis (ALBERT's shared blocks: as they are)."""
    model, params = _all_parameter_paths(model_type)
    scanned_model, scanned = _all_parameter_paths(model_type, scan_layers=True)
    rules = model.partition_rules()
    flat = traverse_util.flatten_dict(params)
    unrolled = {"/".join(path): partition_spec("/".join(path), leaf.shape, 2, rules) for path, leaf in flat.items()}
    expected = traverse_util.flatten_dict(to_scanned(scanned_model.encoder, params["encoder"]))
    assert set(expected) == {path[1:] for path in traverse_util.flatten_dict(scanned) if path[0] == "encoder"}
    stacked = 0
    for path, leaf in traverse_util.flatten_dict(scanned).items():
        spec = partition_spec("/".join(path), leaf.shape, 2, rules)
        if "layers" in path:  # a stacked block weight: spec of layer_0's weight after the layer axis
            stacked += 1
            per_layer = unrolled["/".join(path).replace("/layers/block/", "/layer_0/")]
            assert spec == (P(None, *per_layer) if per_layer != P() else P()), path
        else:  # ALBERT's group_{g}/block_{j} is group_{g}_layer_{j} unscanned
            joined = re.sub(
                r"/group_(\d+)/block(?:_(\d+))?/", lambda m: f"/group_{m[1]}_layer_{m[2] or 0}/", "/".join(path)
            )
            assert spec == unrolled[joined], path
    assert stacked == (0 if model_type == "albert" else 16)  # 16 weights per block: 4 projections, 2 norms


def test_a_new_parameter_without_a_rule_is_reported():
    with pytest.raises(ValueError, match="no partition rule names parameter 'encoder/encoder/layer_0/adapter"):
        partition_spec(
            "encoder/encoder/layer_0/adapter/kernel",
            (4, 4),
            2,
            partition_rules(config_from_hf(hf_config("bert").to_dict())),
        )


@pytest.mark.parametrize("model_type", sorted(KINDS))
def test_accessors_of_decoders(model_type):
    """The word-embedding accessor gives the matrix the LM head uses: logits = h Wᵀ (+ BART's final bias)."""
    model, params = _all_parameter_paths(model_type)
    cfg = model.config
    w = word_embeddings(params)
    assert w.shape == (cfg.vocab_size, cfg.hidden_size) and np.asarray(w).std() > 0
    assert not has_pooler(model) and not uses_token_types(cfg)
    ids = jnp.array([[3, 4, 5]])
    causal = model_kind(cfg) == "causal_lm"
    out = model.apply({"params": params}, *((ids,) if causal else (ids, None, ids)))
    h = out.last_hidden_state if causal else out.decoder.last_hidden_state
    bias = 0 if causal else params["final_logits_bias"]
    head = np.asarray(w).T if cfg.tie_word_embeddings else np.asarray(params["lm_head"]["kernel"])
    np.testing.assert_allclose(out.logits, np.asarray(h) @ head + bias, atol=1e-5)


@pytest.mark.parametrize("model_type", sorted(set(ARCHITECTURES) - set(KINDS)))
def test_accessors(model_type):
    model, params = _all_parameter_paths(model_type)
    cfg = model.encoder.config
    w = word_embeddings(params["encoder"])
    assert w.shape == (cfg.vocab_size, cfg.embedding_size)
    assert np.asarray(w).std() > 0
    assert set(params["encoder"][TRANSFORM]) == {"theta"}
    assert has_pooler(model.encoder) == (model_type != "distilbert")
    assert has_pooler(build_encoder(cfg, add_pooling_layer=False)) is False


_BLOCKS = {"layer_0", "layer_1"}
PARAMETER_GROUPS = {  # the tiny configs of hf_config: 2 layers (BART: 2 encoder, 3 decoder), ALBERT: 2 groups
    "bert": {"embeddings", *_BLOCKS, "pooler", TRANSFORM},
    "roberta": {"embeddings", *_BLOCKS, "pooler", TRANSFORM},
    "distilbert": {"embeddings", *_BLOCKS, TRANSFORM},
    "albert": {"embeddings", "group_0_layer_0", "group_1_layer_0", "pooler", TRANSFORM},
    "mpnet": {"embeddings", *_BLOCKS, "encoder", "pooler", TRANSFORM},  # encoder: the shared relative bias
    "gpt2": {"embeddings", "decoder_layer_0", "decoder_layer_1", "decoder"},  # decoder: ln_f
    "bart": {"embeddings", "encoder_embeddings", "decoder_embeddings", *_BLOCKS}
    | {f"decoder_layer_{i}" for i in range(3)}
    | {"final_logits_bias"},
}
PARAMETER_GROUPS["mbart"] = PARAMETER_GROUPS["bart"] | {"encoder", "decoder"}  # each stack's final layer_norm
for _llm in LLMS:  # decoder: the final norm; an untied LM head (all but Gemma in these tiny configs)
    PARAMETER_GROUPS[_llm] = PARAMETER_GROUPS["gpt2"] | ({"lm_head"} if _llm != "gemma3_text" else set())


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_parameter_groups_and_buffers_of_every_architecture(model_type):
    """Every parameter falls in its block or the top-level part that holds it; the buffers are the parameters that
    transformers' own model registers as buffers (BART's final_logits_bias), and nothing else."""
    model, params = _all_parameter_paths(model_type)
    if model_type not in KINDS:
        params = params["encoder"]
    groups = {parameter_group(path) for path in traverse_util.flatten_dict(params)}
    assert groups == PARAMETER_GROUPS[model_type]
    torch_model = (
        transformers.AutoModelForSeq2SeqLM if model_type in ("bart", "mbart") else transformers.AutoModel
    ).from_config(hf_config(model_type))
    persistent = set(torch_model.state_dict())
    theirs = {name for name, _ in torch_model.named_buffers() if name in persistent and "." not in name}
    assert set(buffers(params)) == theirs
    assert buffers(params) == (("final_logits_bias",) if model_type in ("bart", "mbart") else ())


def test_mpnet_relative_position_buckets_equal_hugging_face():
    torch = pytest.importorskip("torch")
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from isojax.models.mpnet import relative_position_bucket

    relative = np.arange(-600, 601)
    theirs = MPNetEncoder.relative_position_bucket(torch.tensor(relative)).numpy()
    np.testing.assert_array_equal(np.asarray(relative_position_bucket(jnp.asarray(relative))), theirs)
