"""Encoders whose block stack runs as one ``nn.scan`` loop (``scan_layers=True``) and/or under ``nn.remat``: the same
outputs and gradients as the unrolled stack and as Hugging Face PyTorch, checkpoints that keep Hugging Face's names,
and clear errors where scanning is not supported.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import isojax
from isojax.models import TransformerConfig, build_encoder, to_scanned, to_unscanned, token_types
from isojax.models.stack import TransformerStack

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_models import assert_close_on_real, padded_batch, tiny_hf_model, torch_outputs  # noqa: E402  (needs torch)


@pytest.fixture(scope="module", params=["bert", "albert"])
def saved(request, tmp_path_factory):
    """A tiny PyTorch model (ALBERT: 4 layers in 2 groups of 2 inner blocks) saved as a Hugging Face directory."""
    model = tiny_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


def _batch(model, module, seed=0):
    return padded_batch(
        model.config.pad_token_id, model.config.vocab_size, seed=seed, n_types=module.config.type_vocab_size
    )


def test_scanned_hidden_states_match_unscanned_and_pytorch(saved):
    arch, model, path = saved
    module, params, _ = isojax.from_pretrained(str(path), with_tokenizer=False)
    scanned, scanned_params, _ = isojax.from_pretrained(str(path), scan_layers=True, with_tokenizer=False)
    flat = traverse_util.flatten_dict(scanned_params)
    if arch == "bert":  # the 3 layers' weights stacked on a leading axis
        assert flat[("encoder", "layers", "block", "attention", "query", "kernel")].shape == (3, 32, 32)
        assert not any(k[1].startswith("layer_") for k in flat)
    else:  # ALBERT's 2 groups of 2 shared blocks, not stacked
        assert flat[("encoder", "group_1", "block_1", "attention", "query", "kernel")].shape == (32, 32)
    ids, mask, types = _batch(model, module)
    ref = torch_outputs(model, ids, mask, types)
    kwargs = dict(token_type_ids=token_types(module.config, types), output_attentions=True)
    out = module.apply({"params": params}, ids, mask, **kwargs)
    out_scanned = jax.jit(lambda p: scanned.apply({"params": p}, ids, mask, **kwargs))(scanned_params)
    assert len(out_scanned.hidden_states) == len(ref.hidden_states) == len(out.hidden_states)
    assert len(out_scanned.attentions) == len(ref.attentions)
    for mine, unrolled, theirs in zip(out_scanned.hidden_states, out.hidden_states, ref.hidden_states):
        assert_close_on_real(mine, theirs.numpy(), mask, 1e-5)
        assert_close_on_real(mine, unrolled, mask, 4e-6)  # float32 round-off: one jitted program vs op by op
    real_q = mask.astype(bool)
    for mine, theirs in zip(out_scanned.attentions, ref.attentions):
        np.testing.assert_allclose(
            np.asarray(mine).transpose(0, 2, 1, 3)[real_q], theirs.numpy().transpose(0, 2, 1, 3)[real_q], atol=1e-5
        )
    np.testing.assert_allclose(out_scanned.pooler_output, ref.pooler_output.numpy(), atol=1e-5)


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
@pytest.mark.slow
def test_scanned_and_rematerialised_gradients_equal_the_unrolled_ones(saved, remat):
    arch, model, path = saved
    module, params, _ = isojax.from_pretrained(str(path), with_tokenizer=False)
    ids, mask, types = _batch(model, module, seed=2)
    types = token_types(module.config, types)
    weights = jnp.asarray(np.random.default_rng(3).normal(size=(ids.shape[0], ids.shape[1], 32)), jnp.float32)

    def loss(variant, p):
        out = variant.apply({"params": p}, ids, mask, types)
        return jnp.sum(out.last_hidden_state * weights * mask[..., None]) + jnp.sum(out.pooler_output**2)

    reference = jax.jit(jax.grad(lambda p: loss(module, p)))(params)
    scale = max(float(np.abs(r).max()) for r in jax.tree.leaves(reference))  # key biases' gradients are ~0 (round-off)
    for variant in [module.clone(remat=remat), module.clone(scan_layers=True, remat=remat)]:
        if variant.scan_layers:
            grads = to_unscanned(variant, jax.jit(jax.grad(lambda p: loss(variant, p)))(to_scanned(variant, params)))
        else:
            grads = jax.jit(jax.grad(lambda p: loss(variant, p)))(params)
        assert jax.tree.structure(grads) == jax.tree.structure(reference)
        for (key, g), r in zip(traverse_util.flatten_dict(grads).items(), jax.tree.leaves(reference)):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6 * scale, err_msg=str(key))


def test_save_and_load_round_trip_with_scan(saved, tmp_path):
    """A scanned model saves per-layer Hugging Face weights that transformers loads and reproduces, and that load back
    into the scanned layout unchanged."""
    arch, model, path = saved
    module, params, _ = isojax.from_pretrained(str(path), scan_layers=True, with_tokenizer=False)
    params = jax.tree.map(lambda p: p * 1.01, params)
    isojax.save_pretrained(module, params, str(tmp_path))
    reloaded = transformers.AutoModel.from_pretrained(tmp_path).eval()
    reloaded.config._attn_implementation = "eager"
    assert type(reloaded) is type(model)
    ids, mask, types = _batch(model, module, seed=1)
    ref = torch_outputs(reloaded, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, token_types(module.config, types))
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_close_on_real(mine, theirs.numpy(), mask, 1e-5)
    _, again, _ = isojax.from_pretrained(str(tmp_path), scan_layers=True, with_tokenizer=False)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), again, params))


def test_init_layout_and_conversions_are_inverse():
    """A scanned model's own init has the layout ``to_scanned`` produces; the two conversions undo each other."""
    cfg = TransformerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=5, num_attention_heads=2, intermediate_size=24
    )
    module = build_encoder(cfg, scan_layers=True)
    ids = jnp.zeros((1, 3), jnp.int32)
    own = module.init(jax.random.key(0), ids)["params"]
    unrolled = module.clone(scan_layers=False).init(jax.random.key(0), ids)["params"]
    converted = to_scanned(module, unrolled)
    assert jax.tree.structure(converted) == jax.tree.structure(own)
    assert [a.shape for a in jax.tree.leaves(converted)] == [a.shape for a in jax.tree.leaves(own)]
    assert jax.tree.all(
        jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), to_unscanned(module, converted), unrolled)
    )
    layers = own["encoder"]["layers"]["block"]["attention"]["query"]["kernel"]
    assert not np.allclose(layers[0], layers[1])  # every layer initialised with its own key
    one = build_encoder(dataclasses.replace(cfg, num_hidden_layers=1), scan_layers=True)
    one_layer = one.init(jax.random.key(0), ids)["params"]["encoder"]["layers"]["block"]
    assert one_layer["attention"]["query"]["kernel"].shape == (1, 16, 16)  # stacked even when there is one layer


def test_scan_and_remat_refuse_what_they_do_not_support():
    cfg = TransformerConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24
    )
    x, mask = jnp.zeros((1, 3, 16)), jnp.ones((1, 3), bool)
    with pytest.raises(ValueError, match="scan_layers supports stacks of identical blocks without a key/value cache"):
        TransformerStack(cfg, causal=True, cross_attention=True, scan_layers=True).init(
            jax.random.key(0), x, mask, memory=x
        )
    with pytest.raises(ValueError, match="layers of different attention types"):
        windowed = dataclasses.replace(cfg, sliding_window=2, layer_types=("sliding_attention", "full_attention"))
        TransformerStack(windowed, causal=True, scan_layers=True).init(jax.random.key(0), x, mask)
    with pytest.raises(ValueError, match="remat must be 'none' or one of"):
        TransformerStack(cfg, remat="some").init(jax.random.key(0), x, mask)
    module = build_encoder(cfg, scan_layers=True, last_layer_transform=isojax.SoftDecay(), transform_placement="block")
    with pytest.raises(ValueError, match="last-block transform"):
        module.init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32))
