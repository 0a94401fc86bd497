"""Softmax attention over blocks of texts (the CPU path) against a numpy softmax, with every mask and bias layout
the stacks pass, a remainder block, grouped-query heads and gradients; and whole models run through it against
transformers' PyTorch classes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import isojax
from isojax.models import attention

B, L, S, HEADS, HEAD_DIM = 32, 6, 7, 4, 3
TEXT_BYTES = HEADS * L * S * 4  # one text's float32 scores


def numpy_attention(q, k, v, allowed, bias, scale_base):
    """``softmax(q kᵀ / sqrt(scale_base) + bias) v`` over the allowed keys, in float64, one head at a time."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    allowed = np.broadcast_to(allowed, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    bias = np.zeros(allowed.shape) if bias is None else np.broadcast_to(bias, allowed.shape)
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        for h in range(q.shape[2]):
            scores = q[b, :, h] @ k[b, :, h // group].T / np.sqrt(scale_base) + bias[b, h]
            scores = np.where(allowed[b, h], scores, -np.inf)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            out[b, :, h] = weights / weights.sum(-1, keepdims=True) @ v[b, :, h // group]
    return out


def inputs(kv_heads, allowed_layout, bias_layout, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, L, HEADS, HEAD_DIM)).astype(np.float32)
    k, v = (rng.normal(size=(B, S, kv_heads, HEAD_DIM)).astype(np.float32) for _ in range(2))
    keys = np.arange(S)[None, :] < rng.integers(1, S + 1, B)[:, None]  # [B, S]: padded keys
    allowed = {
        "padding": keys[:, None, None, :],
        "causal and padding": keys[:, None, None, :] & (np.arange(S)[None, :] <= np.arange(L)[:, None] + 1),
    }[allowed_layout]
    bias = {
        None: None,
        "shared": rng.normal(size=(1, HEADS, L, S)).astype(np.float32),
        "per text": rng.normal(size=(B, HEADS, L, S)).astype(np.float32),
    }[bias_layout]
    return q, k, v, allowed, bias


BLOCKS = [1, 16 * TEXT_BYTES, 10**9]  # on 8 devices (conftest): 4 steps of 8 x 1 texts, 2 of 8 x 2, one of 32


@pytest.mark.parametrize("block_bytes", BLOCKS, ids=["1 text a part", "2 texts a part", "whole batch"])
@pytest.mark.parametrize("kv_heads", [HEADS, 2])
@pytest.mark.parametrize("allowed_layout", ["padding", "causal and padding"])
@pytest.mark.parametrize("bias_layout", [None, "shared", "per text"])
def test_blocked_attention_equals_the_softmax_of_each_head(
    monkeypatch, block_bytes, kv_heads, allowed_layout, bias_layout
):
    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", block_bytes)
    q, k, v, allowed, bias = inputs(kv_heads, allowed_layout, bias_layout)
    got, probs = jax.jit(lambda *a: attention.blocked_attention(*a, scale_base=HEAD_DIM))(q, k, v, allowed, bias)
    assert probs is None
    np.testing.assert_allclose(np.asarray(got), numpy_attention(q, k, v, allowed, bias, HEAD_DIM), atol=1e-6)


@pytest.mark.parametrize("block_bytes", BLOCKS[:2], ids=["1 text a part", "2 texts a part"])
def test_blocked_attention_with_dropout_and_probabilities_equals_one_batched_softmax(monkeypatch, block_bytes):
    """The keep mask drawn for the whole batch drops the same weights in each block; the probabilities returned are
    the weights before dropout, as the numpy softmax gives them."""
    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", block_bytes)
    q, k, v, allowed, bias = inputs(2, "causal and padding", "shared", seed=4)
    keep = np.random.default_rng(5).random((B, HEADS, L, S)) < 0.7
    options = dict(scale_base=HEAD_DIM, rate=0.3, with_probs=True)
    got, probs = jax.jit(lambda *a: attention.blocked_attention(*a, **options))(q, k, v, allowed, bias, keep)
    group = HEADS // 2  # the context: numpy attention with the dropped, rescaled weights, head by head
    want = np.zeros(q.shape)
    ref_probs = np.zeros((B, HEADS, L, S))
    full_allowed = np.broadcast_to(allowed, ref_probs.shape)
    for b in range(B):
        for h in range(HEADS):
            scores = q[b, :, h].astype(np.float64) @ k[b, :, h // group].T / np.sqrt(HEAD_DIM) + bias[0, h]
            scores = np.where(full_allowed[b, h], scores, -np.inf)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            ref_probs[b, h] = w / w.sum(-1, keepdims=True)
            want[b, :, h] = (ref_probs[b, h] * keep[b, h] / 0.7) @ v[b, :, h // group]
    np.testing.assert_allclose(np.asarray(probs), ref_probs, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@pytest.mark.parametrize("bias_layout", [None, "shared", "per text"])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_the_gradients_of_blocked_attention_equal_those_of_one_batched_softmax(monkeypatch, bias_layout, rate):
    """The block-by-block backward pass (weights recomputed in each step) against autodiff of the formula on the whole
    batch: the gradients of queries, keys, values (grouped heads) and the bias, with and without a dropout mask."""
    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", BLOCKS[1])
    q, k, v, allowed, bias = inputs(2, "causal and padding", bias_layout, seed=1)
    probe = np.random.default_rng(2).normal(size=q.shape).astype(np.float32)
    keep = np.random.default_rng(3).random((B, HEADS, L, S)) >= rate if rate else None

    def loss(fn, q, k, v, bias):
        return jnp.sum(fn(q, k, v, allowed, bias, keep)[0] * probe)

    def batched(q, k, v, allowed, bias, keep):  # the formula with jax.numpy, in one batch
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(k, 2, axis=2)) / np.sqrt(HEAD_DIM)
        weights = jax.nn.softmax(jnp.where(allowed, scores if bias is None else scores + bias, -jnp.inf), axis=-1)
        if keep is not None:
            weights = jnp.where(keep, weights / (1 - rate), 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", weights, jnp.repeat(v, 2, axis=2)), None

    blocked = lambda *a: attention.blocked_attention(*a, scale_base=HEAD_DIM, rate=rate)  # noqa: E731
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    got = jax.jit(jax.grad(lambda *a: loss(blocked, *a), argnums=argnums))(q, k, v, bias)
    want = jax.grad(lambda *a: loss(batched, *a), argnums=argnums)(q, k, v, bias)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)


def test_attention_is_blocked_on_cpu_and_fused_for_gpu_and_tpu(monkeypatch):
    """The platform choice is made at lowering: the CPU program loops over blocks, the others hold no loop."""
    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", 1)
    q, k, v, allowed, _ = inputs(HEADS, "padding", None)

    def attend(q, k, v, allowed):
        return jax.lax.platform_dependent(
            q,
            k,
            v,
            allowed,
            None,
            cpu=lambda *a: attention.blocked_attention(*a, scale_base=HEAD_DIM),
            default=lambda *a: attention.fused_attention(*a, scale_base=HEAD_DIM),
        )

    traced = jax.jit(attend).trace(q, k, v, allowed)
    assert "while" in traced.lower(lowering_platforms=("cpu",)).as_text()
    for platform in ("cuda", "tpu"):
        assert "while" not in traced.lower(lowering_platforms=(platform,)).as_text()


def test_blocked_attention_on_a_batch_sharded_over_devices_communicates_nothing(monkeypatch):
    """Each step takes texts from every device's part of the batch: the compiled program holds no collective."""
    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", 1)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    by_text = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    q, k, v, allowed, bias = inputs(2, "padding", "per text")
    args = [jax.device_put(t, by_text) for t in (q, k, v, allowed, bias)]
    attend = jax.jit(lambda *a: attention.blocked_attention(*a, scale_base=HEAD_DIM)[0], out_shardings=by_text)
    hlo = attend.lower(*args).compile().as_text()
    assert jax.device_count() > 1 and "while" in hlo
    for collective in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
        assert collective not in hlo
    np.testing.assert_allclose(np.asarray(attend(*args)), numpy_attention(q, k, v, allowed, bias, HEAD_DIM), atol=1e-6)


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("case", ["llama-gqa-llama3-rope", "gemma3-layer-pattern", "mpnet"])
def test_models_attending_in_blocks_of_one_text_match_pytorch(monkeypatch, tmp_path, case):
    """Logits and hidden states without attention probabilities out (the blocked path), one text per block."""
    from decoder_helpers import padded, tiny_llm

    monkeypatch.setattr(attention, "CPU_BLOCK_BYTES", 1)
    if case == "mpnet":  # relative position bias shared by the texts
        torch.manual_seed(0)
        cfg = transformers.MPNetConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
        )
        model = transformers.MPNetModel(cfg).eval()
    else:
        model = tiny_llm(case)
    model.save_pretrained(tmp_path)
    module, params, _ = isojax.from_pretrained(str(tmp_path))
    ids, mask = padded((9, 4, 7, 1, 6), 9, 99, 1, seed=3)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    out = jax.jit(module.apply)({"params": params}, ids, mask)
    real = mask.astype(bool)
    for mine, hf in zip(out.hidden_states, ref.hidden_states):
        np.testing.assert_allclose(np.asarray(mine)[real], hf.numpy()[real], atol=1e-5, rtol=0)
    if case != "mpnet":
        theirs = ref.logits.numpy()[real]
        np.testing.assert_allclose(np.asarray(out.logits)[real], theirs, atol=1e-4 * np.abs(theirs).max(), rtol=0)
