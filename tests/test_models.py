"""Encoders against Hugging Face PyTorch: tiny random models made here, saved, loaded back, compared.

Reference: transformers' PyTorch classes (float32, eager attention), outputs compared on real tokens.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import isojax
from isojax.models import build_encoder, config_from_hf, token_types
from isojax.models.embeddings import Embed

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=40,
)


def tiny_hf_model(arch: str):
    """A random tiny PyTorch model of ``arch`` (with non-trivial LayerNorm and bias values)."""
    torch.manual_seed(0)
    if arch == "bert":
        cfg = transformers.BertConfig(**TINY, type_vocab_size=3)
        model = transformers.BertModel(cfg)
    elif arch == "roberta":
        cfg = transformers.RobertaConfig(**{**TINY, "max_position_embeddings": 42}, type_vocab_size=1, pad_token_id=1)
        model = transformers.RobertaModel(cfg)
    elif arch == "albert":
        cfg = transformers.AlbertConfig(
            **{**TINY, "num_hidden_layers": 4},
            embedding_size=16,
            num_hidden_groups=2,
            inner_group_num=2,
            type_vocab_size=2,
        )
        model = transformers.AlbertModel(cfg)
    elif arch == "distilbert":
        cfg = transformers.DistilBertConfig(
            vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=37, max_position_embeddings=40
        )
        model = transformers.DistilBertModel(cfg)
    elif arch == "mpnet":  # max_position_embeddings 42: positions run after pad_token_id 1, up to length 40
        cfg = transformers.MPNetConfig(
            **{**TINY, "max_position_embeddings": 42}, pad_token_id=1, relative_attention_num_buckets=32
        )
        model = transformers.MPNetModel(cfg)
    else:
        raise AssertionError(arch)
    model.config._attn_implementation = "eager"
    with torch.no_grad():  # make every parameter informative (HF initialises LayerNorm to 1/0 and biases to 0)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def padded_batch(pad_id: int, vocab: int, lengths=(9, 4, 7, 1), seed=0, n_types=2):
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), max(lengths)), pad_id, np.int64)
    mask = np.zeros(ids.shape, np.int64)
    for i, n in enumerate(lengths):
        real = rng.integers(0, vocab, n)
        real[real == pad_id] = (pad_id + 1) % vocab
        ids[i, :n], mask[i, :n] = real, 1
    types = (np.arange(ids.shape[1])[None] >= np.array(lengths)[:, None] // 2).astype(np.int64) * mask
    types = types % max(n_types, 1)
    return ids, mask, types


def torch_outputs(model, ids, mask, types):
    kwargs = dict(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        output_hidden_states=True,
        output_attentions=True,
    )
    if getattr(model.config, "type_vocab_size", 0):  # DistilBERT and MPNet take no token types
        kwargs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        return model(**kwargs)


def assert_close_on_real(a, b, mask, atol):
    a, b = np.asarray(a), np.asarray(b)
    real = mask.astype(bool)
    np.testing.assert_allclose(a[real], b[real], atol=atol, rtol=0)


ARCHS = ["bert", "roberta", "albert", "distilbert", "mpnet"]


@pytest.fixture(scope="module", params=ARCHS)
def saved(request, tmp_path_factory):
    model = tiny_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


def test_hidden_states_match_pytorch(saved):
    arch, model, path = saved
    module, params, tokenizer = isojax.from_pretrained(str(path))
    assert tokenizer is None and module.config.model_type == arch
    ids, mask, types = padded_batch(
        model.config.pad_token_id, model.config.vocab_size, n_types=module.config.type_vocab_size
    )
    ref = torch_outputs(model, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, token_types(module.config, types), output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states)
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_close_on_real(mine, theirs.numpy(), mask, 1e-5)
    for mine, theirs in zip(out.attentions, ref.attentions):  # [B, heads, q, k]: compare rows of real queries
        real_q = mask.astype(bool)
        np.testing.assert_allclose(
            np.asarray(mine).transpose(0, 2, 1, 3)[real_q], theirs.numpy().transpose(0, 2, 1, 3)[real_q], atol=1e-5
        )
    if arch == "distilbert":
        assert out.pooler_output is None
    else:
        np.testing.assert_allclose(out.pooler_output, ref.pooler_output.numpy(), atol=1e-5)


def test_round_trip_back_to_pytorch(saved, tmp_path):
    arch, model, path = saved
    module, params, _ = isojax.from_pretrained(str(path))
    params = jax.tree.map(lambda p: p * 1.01, params)  # changed weights must survive the trip
    isojax.save_pretrained(module, params, str(tmp_path))
    reloaded = transformers.AutoModel.from_pretrained(tmp_path).eval()
    reloaded.config._attn_implementation = "eager"
    assert type(reloaded) is type(model)
    ids, mask, types = padded_batch(
        model.config.pad_token_id, model.config.vocab_size, seed=1, n_types=module.config.type_vocab_size
    )
    ref = torch_outputs(reloaded, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, token_types(module.config, types))
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_close_on_real(mine, theirs.numpy(), mask, 1e-5)


def test_task_checkpoint_prefix_and_head_keys_are_handled(tmp_path):
    """A BertForSequenceClassification checkpoint ("bert." prefix, classifier head) loads the encoder."""
    torch.manual_seed(1)
    cfg = transformers.BertConfig(**TINY, num_labels=3)
    task = transformers.BertForSequenceClassification(cfg).eval()
    task.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    ids, mask, types = padded_batch(0, 99)
    ref = torch_outputs(task.bert, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, types)
    assert_close_on_real(out.last_hidden_state, ref.last_hidden_state.numpy(), mask, 1e-5)


def test_pytorch_bin_checkpoint(tmp_path):
    model = tiny_hf_model("bert")
    model.save_pretrained(tmp_path, safe_serialization=False) if _accepts_safe_serialization() else torch.save(
        model.state_dict(), tmp_path / "pytorch_model.bin"
    )
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    ids, mask, types = padded_batch(0, 99)
    ref = torch_outputs(model, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, types)
    assert_close_on_real(out.last_hidden_state, ref.last_hidden_state.numpy(), mask, 1e-5)


def _accepts_safe_serialization():
    import inspect

    return "safe_serialization" in inspect.signature(transformers.PreTrainedModel.save_pretrained).parameters


# ---------------------------------------------------------------- jit, sharding, bf16


@pytest.fixture(scope="module")
def bert_tiny(tmp_path_factory):
    model = tiny_hf_model("bert")
    path = tmp_path_factory.mktemp("bert_tiny")
    model.save_pretrained(path)
    module, params, _ = isojax.from_pretrained(str(path))
    return module, params, path


def test_jit_and_sharded_batch_equal_single_device(bert_tiny):
    module, params, _ = bert_tiny
    ids, mask, types = padded_batch(0, 99, lengths=(9, 4, 7, 1, 3, 8, 2, 5))
    eager = module.apply({"params": params}, ids, mask, types).last_hidden_state
    fwd = jax.jit(lambda p, i, m, t: module.apply({"params": p}, i, m, t).last_hidden_state)
    np.testing.assert_allclose(fwd(params, ids, mask, types), eager, atol=1e-6)
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    batch_sharding = jax.NamedSharding(mesh, jax.P("data"))
    replicated = jax.NamedSharding(mesh, jax.P())
    args = [jax.device_put(a, batch_sharding) for a in (ids, mask, types)]
    sharded = fwd(jax.device_put(params, replicated), *args)
    assert len(sharded.sharding.device_set) == n
    np.testing.assert_allclose(sharded, eager, atol=1e-6)


def test_bf16_compute_stays_close(bert_tiny):
    """bf16 compute (float32 params, float32 LayerNorm/softmax statistics): within 0.05 max-abs of float32 on
    unit-scale LayerNorm outputs (bf16 has an 8-bit mantissa: ~0.4% relative per rounding, 3 layers deep)."""
    _, params, path = bert_tiny
    module16, _, _ = isojax.from_pretrained(str(path), dtype=jnp.bfloat16)
    module32, _, _ = isojax.from_pretrained(str(path))
    ids, mask, types = padded_batch(0, 99)
    out16 = module16.apply({"params": params}, ids, mask, types)
    out32 = module32.apply({"params": params}, ids, mask, types)
    assert out16.last_hidden_state.dtype == jnp.bfloat16
    err = np.abs(np.asarray(out16.last_hidden_state, np.float32) - np.asarray(out32.last_hidden_state))
    assert err[mask.astype(bool)].max() < 0.05


def test_dropout_is_active_when_not_deterministic(bert_tiny):
    module, params, _ = bert_tiny
    ids, mask, types = padded_batch(0, 99)

    def run(seed):
        rngs = {"dropout": jax.random.key(seed)}
        return module.apply({"params": params}, ids, mask, types, deterministic=False, rngs=rngs).last_hidden_state

    assert not np.allclose(run(0), run(1))
    np.testing.assert_array_equal(run(2), run(2))


# ---------------------------------------------------------------- clear errors


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "vocab_size": 10}))
    with pytest.raises(ValueError, match="unknown model_type 't5'"):
        isojax.from_pretrained(str(tmp_path))


def test_missing_unexpected_and_misshapen_keys(bert_tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, _, path = bert_tiny
    state = load_file(path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())

    def write(s):
        save_file(s, tmp_path / "model.safetensors")

    missing = dict(state)
    del missing["encoder.layer.1.attention.self.key.weight"]
    write(missing)
    with pytest.raises(ValueError, match=r"missing 1 key.*encoder\.layer\.1\.attention\.self\.key\.weight"):
        isojax.from_pretrained(str(tmp_path))
    write({**state, "encoder.layer.7.output.dense.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match=r"unexpected base-model key.*encoder\.layer\.7\.output\.dense\.weight"):
        isojax.from_pretrained(str(tmp_path))
    misshapen = dict(state)
    misshapen["encoder.layer.0.intermediate.dense.weight"] = np.zeros((36, 32), np.float32)
    write(misshapen)
    with pytest.raises(
        ValueError,
        match=r"'encoder\.layer\.0\.intermediate\.dense\.weight' has shape \(36, 32\).*"
        r"expects \(32, 37\)",
    ):
        isojax.from_pretrained(str(tmp_path))


def _copy_with(path, tmp_path, edit_config=None, weights=None):
    """A copy of the model directory ``path`` in ``tmp_path`` with its config.json edited and/or weights replaced."""
    config = json.loads((path / "config.json").read_text())
    if edit_config:
        config.update(edit_config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(
        (path / "model.safetensors").read_bytes() if weights is None else weights
    )
    return tmp_path


@pytest.mark.parametrize(
    "edit, message",
    [  # each loaded before, and ran: 0 heads divided by zero, a rate of 1.5 dropped everything, eps < 0 gave NaN
        ({"num_attention_heads": 0}, "num_attention_heads must be an integer >= 1, got 0"),
        ({"hidden_size": -32, "num_attention_heads": -4}, "hidden_size must be an integer >= 1, got -32"),
        ({"vocab_size": "99"}, "vocab_size must be an integer >= 1, got '99'"),
        ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob must be a dropout rate in \[0, 1\), got 1.5"),
        ({"attention_probs_dropout_prob": -0.1}, r"attention_probs_dropout_prob must be a dropout rate in \[0, 1\)"),
        ({"layer_norm_eps": -1.0}, "layer_norm_eps must be a finite number > 0, got -1.0"),
    ],
)
def test_a_config_json_outside_its_ranges_is_refused_naming_the_file_and_field(bert_tiny, tmp_path, edit, message):
    _, _, path = bert_tiny
    model = _copy_with(path, tmp_path, edit)
    with pytest.raises(ValueError, match=f"^{re.escape(str(model / 'config.json'))}: {message}"):
        isojax.from_pretrained(str(model))


def test_a_config_takes_numpy_scalars_for_its_sizes_and_rates():
    from isojax.models import TransformerConfig

    config = TransformerConfig(hidden_size=np.int64(32), num_attention_heads=4, hidden_dropout_prob=np.float32(0.1))
    assert (config.hidden_size, config.embedding_size, float(config.hidden_dropout_prob)) == (32, 32, np.float32(0.1))


@pytest.mark.parametrize(
    "config, message", [("{", r"not JSON \(Expecting property name"), ("[1]", "expected a JSON object, got list")]
)
def test_a_config_json_that_is_no_object_is_refused_naming_the_file(tmp_path, config, message):
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'config.json'))}: {message}"):
        isojax.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("cut", [0, 1000])
def test_a_truncated_safetensors_file_is_refused_naming_it(bert_tiny, tmp_path, cut):
    _, _, path = bert_tiny
    model = _copy_with(path, tmp_path, weights=(path / "model.safetensors").read_bytes()[:cut])
    with pytest.raises(ValueError, match=f"^{re.escape(str(model / 'model.safetensors'))}: not a readable safetensors"):
        isojax.from_pretrained(str(model))


def test_a_save_that_fails_halfway_leaves_the_earlier_save_whole(bert_tiny, tmp_path, monkeypatch):
    import safetensors.numpy

    module, params, _ = bert_tiny
    isojax.save_pretrained(module, params, str(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a safetensors header")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        isojax.save_pretrained(module, jax.tree.map(lambda p: p + 1, params), str(tmp_path))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no .part, nothing half-written
    _, loaded, _ = isojax.from_pretrained(str(tmp_path), with_tokenizer=False)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, params, loaded)))


def test_unreadable_tokenizer_files_are_refused_naming_the_directory(default_model_path, tmp_path):
    from isojax.models.hub import load_tokenizer

    for name in ("tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((default_model_path / name).read_bytes())
    (tmp_path / "tokenizer.json").write_text("{")  # was transformers' bare JSONDecodeError, naming no file
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}: its tokenizer files cannot be read"):
        load_tokenizer(str(tmp_path))


def test_bad_inputs_raise(bert_tiny):
    module, params, _ = bert_tiny
    apply = lambda *a, **k: module.apply({"params": params}, *a, **k)  # noqa: E731
    ids = np.ones((2, 5), np.int32)
    with pytest.raises(ValueError, match="length 41, longer than the 40 positions"):
        apply(np.ones((1, 41), np.int32))
    with pytest.raises(ValueError, match=r"input_ids holds \[99\] outside \[0, 99\)"):
        apply(np.array([[1, 99, 2]]))
    with pytest.raises(ValueError, match=r"input_ids holds \[-1\] outside"):
        apply(np.array([[1, -1, 2]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\), input_ids \(2, 5\)"):
        apply(ids, np.ones((2, 4)))
    with pytest.raises(ValueError, match="token_type_ids holds"):
        apply(ids, None, np.full((2, 5), 3))
    with pytest.raises(ValueError, match="input_ids must be integer"):
        apply(np.ones((2, 5), np.float32))


@pytest.mark.parametrize("bad", [99, -1, -100])  # past the vocabulary (99), negative (-100: the ignored label id)
def test_out_of_vocabulary_ids_under_jit_are_nan_not_clamped(bert_tiny, bad):
    module, params, _ = bert_tiny
    with pytest.raises(ValueError, match=rf"input_ids holds \[{bad}\] outside \[0, 99\)"):
        module.apply({"params": params}, np.array([[1, bad, 2]]))
    out = jax.jit(lambda i: module.apply({"params": params}, i).last_hidden_state)(np.array([[1, bad, 2]]))
    assert np.isnan(np.asarray(out)).any()
    table = params["embeddings"]["word_embeddings"]["embedding"]
    embed = Embed(99, table.shape[1])
    rows = jax.jit(lambda i: embed.apply({"params": {"embedding": table}}, i))(np.array([1, bad, 2]))
    np.testing.assert_array_equal(rows[::2], table[np.array([1, 2])])  # the good ids read their rows
    assert np.isnan(np.asarray(rows[1])).all()  # the bad one a NaN row, not the row it would wrap or clamp to


def test_distilbert_rejects_token_types():
    cfg = config_from_hf(
        dict(
            model_type="distilbert",
            vocab_size=20,
            dim=8,
            n_layers=1,
            n_heads=2,
            hidden_dim=8,
            max_position_embeddings=16,
        )
    )
    module = build_encoder(cfg)
    params = module.init(jax.random.key(0), jnp.ones((1, 3), jnp.int32))["params"]
    with pytest.raises(ValueError, match="distilbert has no token types"):
        module.apply({"params": params}, jnp.ones((1, 3), jnp.int32), None, jnp.zeros((1, 3), jnp.int32))


def test_distilbert_sinusoidal_positions_start_as_transformers_table():
    """``sinusoidal_pos_embds=True``: a freshly initialised position table equals the one transformers' DistilBERT
    builds (sin on even, cos on odd columns); without it the table is random (std initializer_range)."""
    hf = dict(vocab_size=20, dim=10, n_layers=1, n_heads=2, hidden_dim=8, max_position_embeddings=16)
    torch.manual_seed(0)
    reference = transformers.DistilBertModel(transformers.DistilBertConfig(**hf, sinusoidal_pos_embds=True))
    expected = reference.embeddings.position_embeddings.weight.detach().numpy()
    ids = jnp.ones((1, 3), jnp.int32)
    for sinusoidal in (True, False):
        module = build_encoder(config_from_hf(dict(model_type="distilbert", **hf, sinusoidal_pos_embds=sinusoidal)))
        params = module.init(jax.random.key(0), ids)["params"]
        table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
        if sinusoidal:
            np.testing.assert_allclose(table, expected, atol=1e-6)
        else:
            assert np.abs(table - expected).max() > 0.5 and 0.01 < table.std() < 0.03


# ---------------------------------------------------------------- last-layer SoftDecay


@pytest.mark.slow
def test_softdecay_on_the_last_layer(bert_tiny, tmp_path):
    """alpha lives in params["last_layer_transform"]; the output is soft_decay of the plain model's last layer
    per sequence over real tokens; gradients w.r.t. alpha are finite on a padded batch; save/load keeps alpha."""
    from isojax import SoftDecay, soft_decay

    plain, params, path = bert_tiny
    module, sd_params, _ = isojax.from_pretrained(str(path), last_layer_transform=SoftDecay(alpha_init=-0.4))
    assert set(sd_params["last_layer_transform"]) == {"theta"}
    ids, mask, types = padded_batch(0, 99)
    # each forward and the gradient jitted whole (op by op, the SVD's gradient alone compiles hundreds of programs)
    out = jax.jit(module.apply)({"params": sd_params}, ids, mask, types)
    ref = jax.jit(plain.apply)({"params": params}, ids, mask, types)
    for i, n in enumerate(mask.sum(1)):
        np.testing.assert_allclose(
            out.last_hidden_state[i, :n], soft_decay(ref.last_hidden_state[i, :n], -0.4), atol=2e-5
        )
    np.testing.assert_allclose(out.hidden_states[-2], ref.hidden_states[-2], atol=1e-6)

    def loss(p):
        return (module.apply({"params": p}, ids, mask, types).pooler_output ** 2).sum()

    grads = jax.jit(jax.grad(loss))(sd_params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert float(grads["last_layer_transform"]["theta"]) != 0.0
    changed = jax.tree.map(lambda x: x, sd_params)
    changed["last_layer_transform"]["theta"] = jnp.asarray(0.7)
    isojax.save_pretrained(module, changed, str(tmp_path))
    assert (tmp_path / "isojax_extra.safetensors").exists()
    _, reloaded, _ = isojax.from_pretrained(str(tmp_path), last_layer_transform=SoftDecay(alpha_init=-0.4))
    assert float(reloaded["last_layer_transform"]["theta"]) == pytest.approx(0.7)
    transformers.AutoModel.from_pretrained(tmp_path)  # the main file stays loadable by transformers


def _authors_soft_decay(x, alpha):
    """The SoftDecay authors' transform, transcribed in PyTorch: per-sample SVD of the [L, H] token matrix (no
    padding mask), f(s) = -log(1 - alpha (s + alpha) + 1e-7) / alpha, rescaled so that the largest value stays."""
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    new = -torch.log(1 - alpha * (s + alpha) + 1e-7) / alpha
    new = new * (s.max(-1, keepdim=True).values / new.max(-1, keepdim=True).values)
    return u @ torch.diag_embed(new) @ vh


@pytest.mark.slow
def test_softdecay_authors_placement_equals_a_pytorch_transcription_of_their_block(tmp_path):
    """transform_placement="block": LayerNorm(SoftDecay(dropout(dense(h)) + x) + x) in the last block, as the
    authors' modified BertOutput computes it (the residual added twice), against that block written in PyTorch."""
    from isojax import SoftDecay

    model = tiny_hf_model("bert")
    model.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(
        str(tmp_path), last_layer_transform=SoftDecay(alpha_init=-0.6), transform_placement="block"
    )
    last = model.encoder.layer[-1].output

    def authors_forward(hidden_states, input_tensor):
        hidden_states = last.dropout(last.dense(hidden_states))
        hidden_states = _authors_soft_decay(hidden_states + input_tensor, -0.6)
        return last.LayerNorm(hidden_states + input_tensor)

    last.forward = authors_forward
    ids, mask, types = padded_batch(0, 99, lengths=(9, 9, 9))  # unpadded: the authors' SVD has no mask
    ref = torch_outputs(model, ids, mask, types)
    out = module.apply({"params": params}, ids, mask, types)
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        np.testing.assert_allclose(mine, theirs.numpy(), atol=2e-5)
    np.testing.assert_allclose(out.pooler_output, ref.pooler_output.numpy(), atol=2e-5)
    plain, _, _ = isojax.from_pretrained(str(tmp_path), last_layer_transform=SoftDecay(alpha_init=-0.6))
    assert (
        np.abs(
            np.asarray(plain.apply({"params": params}, ids, mask, types).last_hidden_state)
            - np.asarray(out.last_hidden_state)
        ).max()
        > 1e-2
    )  # the two placements differ
    with pytest.raises(ValueError, match="transform_placement must be one of"):
        build_encoder(module.config, transform_placement="inside").init(jax.random.key(0), ids)
