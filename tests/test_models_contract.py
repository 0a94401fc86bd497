"""The model contract (isojax.models.registry) for every architecture: config translation against transformers'
config classes, partition rules that name every parameter, the accessors train/ and eval/ use, and MPNet's
relative-position buckets against Hugging Face's function.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from isojax import SoftDecay
from isojax.models import (ARCHITECTURES, TRANSFORM, build_encoder, config_from_hf, config_to_hf, has_pooler,
                           partition_rules, uses_token_types, word_embeddings)
from isojax.train.model import TaskModel, init_variables
from isojax.train.parallel import partition_spec

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40)


def hf_config(model_type: str):
    """A tiny transformers config object of ``model_type`` (the independent reference for the translation)."""
    if model_type == "distilbert":
        return transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=40,
                                             max_position_embeddings=40, dropout=0.15)
    extra = {"albert": dict(embedding_size=16, num_hidden_groups=2, inner_group_num=1)}.get(model_type, {})
    return transformers.AutoConfig.for_model(model_type, **TINY, max_position_embeddings=42,
                                             hidden_dropout_prob=0.15, **extra)


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_config_translation_agrees_with_transformers(model_type):
    ref = hf_config(model_type)
    cfg = config_from_hf(ref.to_dict())
    assert cfg.model_type == model_type and cfg.hidden_size == 32 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4 and cfg.intermediate_size == 40 and cfg.hidden_dropout_prob == 0.15
    assert cfg.pad_token_id == ref.pad_token_id
    assert uses_token_types(cfg) == (model_type in ("bert", "roberta", "albert"))
    # positions: RoBERTa and MPNet start after the padding index
    assert cfg.max_sequence_length == (42 - ref.pad_token_id - 1 if model_type in ("roberta", "mpnet")
                                       else ref.max_position_embeddings)
    made_in_code = dataclasses.replace(cfg, hf_config=None)
    written = config_to_hf(made_in_code)
    reread = transformers.AutoConfig.for_model(**written)  # transformers accepts what isojax writes
    assert type(reread) is type(ref)
    assert config_from_hf(reread.to_dict()) == made_in_code


def test_unknown_model_type_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"unknown model_type 'gpt5'; isojax supports bert, roberta, .*mpnet"):
        config_from_hf({"model_type": "gpt5"})
    with pytest.raises(ValueError, match="has no 'hidden_size'"):
        config_from_hf({"model_type": "bert", "vocab_size": 10})


def _all_parameter_paths(model_type: str):
    cfg = config_from_hf(hf_config(model_type).to_dict())
    encoder = build_encoder(cfg, last_layer_transform=SoftDecay())
    params = encoder.init(jax.random.key(0), jnp.ones((1, 5), jnp.int32))["params"]
    model = TaskModel(encoder, num_labels=3, use_isobn=True, use_isotropy_layer=True)
    variables = init_variables(model, params, jax.random.key(1))
    return model, variables["params"]


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_parameter_of_every_architecture_matches_a_partition_rule(model_type):
    model, params = _all_parameter_paths(model_type)
    rules = model.partition_rules()
    specs = {"/".join(path): partition_spec("/".join(path), leaf.shape, 2, rules)
             for path, leaf in traverse_util.flatten_dict(params).items()}
    assert specs  # partition_spec raises for a parameter no rule names
    sharded = {path for path, spec in specs.items() if spec != P()}
    # Megatron: per block, q/k/v kernels and biases, the feed-forward input kernel and bias, two output kernels
    blocks = {path.split("/attention/")[0] for path in specs if "/attention/query/kernel" in path}
    assert len(sharded) == 10 * len(blocks) and blocks
    assert all(specs[f"{b}/attention/query/kernel"] == P(None, "model") for b in blocks)
    assert all(specs[f"{b}/output/kernel"] == P("model", None) for b in blocks)


def test_a_new_parameter_without_a_rule_is_reported():
    with pytest.raises(ValueError, match="no partition rule names parameter 'encoder/encoder/layer_0/adapter"):
        partition_spec("encoder/encoder/layer_0/adapter/kernel", (4, 4), 2, partition_rules(config_from_hf(
            hf_config("bert").to_dict())))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_accessors(model_type):
    model, params = _all_parameter_paths(model_type)
    cfg = model.encoder.config
    w = word_embeddings(params["encoder"])
    assert w.shape == (cfg.vocab_size, cfg.embedding_size)
    assert np.asarray(w).std() > 0
    assert set(params["encoder"][TRANSFORM]) == {"theta"}
    assert has_pooler(model.encoder) == (model_type != "distilbert")
    assert has_pooler(build_encoder(cfg, add_pooling_layer=False)) is False


def test_mpnet_relative_position_buckets_equal_hugging_face():
    torch = pytest.importorskip("torch")
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from isojax.models.mpnet import relative_position_bucket

    relative = np.arange(-600, 601)
    theirs = MPNetEncoder.relative_position_bucket(torch.tensor(relative)).numpy()
    np.testing.assert_array_equal(np.asarray(relative_position_bucket(jnp.asarray(relative))), theirs)
