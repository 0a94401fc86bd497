"""Decoding under jit (isojax.models.generate) against transformers' ``generate`` on tiny random GPT-2, BART and
mBART made here: the same greedy tokens, the same best beam (and its score); the key/value cache against the
uncached forward, step by step; one compilation per input shape."""

import dataclasses
import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import isojax
from isojax.models import build_encoder, config_from_hf, init_cache, init_params, model_kind
from isojax.models.generate import generate, generation_config, left_align

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from decoder_helpers import padded, tiny_hf_model  # noqa: E402  (needs torch)

MAX_LENGTH = 12
# (num_beams, length_penalty, early_stopping): greedy, and beam search with a length penalty below and above 1
SETTINGS = {
    "gpt2": [(1, 1.0, False), (3, 0.7, False), (4, 2.0, True)],
    "bart": [(1, 1.0, False), (3, 0.7, False), (4, 2.0, True)],
    "mbart": [(1, 1.0, False), (3, 1.5, "never")],
}
FORCED = {"mbart": {"forced_bos_token_id": 7}}  # mBART's target-language token, as translation passes it


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def lm(request, tmp_path_factory):
    """A tiny LM whose predictions are confident and vary along the sequences (larger random weights, LayerNorms
    near their initialisation)."""
    arch = request.param
    model = tiny_hf_model(arch, seed=0, scale=0.5, norm_scale=0.1)
    path = tmp_path_factory.mktemp(f"gen-{arch}")
    model.save_pretrained(path)
    module, params, _ = isojax.from_pretrained(str(path))
    if arch == "gpt2":
        ids, mask = padded((5, 3, 1, 4), 5, 99, 5, left=True, seed=2, low=6)
    else:
        ids, mask = padded((7, 5, 2, 6), 7, 99, 1, seed=2)
    return arch, model, module, params, ids, mask


def decode_both(model, module, params, ids, mask, pad, **settings):
    """Decode with transformers and isojax, the same settings: the same tokens (transformers crops the finished batch,
    isojax pads it to MAX_LENGTH) and beam scores; returns isojax's sequences."""
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            do_sample=False,
            max_length=MAX_LENGTH,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_scores=True,
            **settings,
        )
    out = generate(module, params, ids, mask, max_length=MAX_LENGTH, pad_token_id=pad, **settings)
    theirs, mine = ref.sequences.numpy(), np.asarray(out.sequences)
    assert mine.shape == (len(ids), MAX_LENGTH)
    np.testing.assert_array_equal(mine[:, : theirs.shape[1]], theirs, err_msg=str(settings))
    assert (mine[:, theirs.shape[1] :] == pad).all()  # transformers crops what isojax pads
    if settings.get("num_beams", 1) > 1:
        # float32: a score sums up to MAX_LENGTH log-probabilities that XLA and torch compute in another order (1.7e-5
        # relative seen on one host); a wrong beam or length penalty moves it by orders more
        np.testing.assert_allclose(out.scores, ref.sequences_scores.numpy(), rtol=1e-4, atol=1e-6)
    else:
        assert out.scores is None
    return mine


@pytest.mark.slow
def test_greedy_and_beam_search_equal_transformers_generate(lm):
    arch, model, module, params, ids, mask = lm
    pad, start = (5, ids.shape[1]) if arch == "gpt2" else (1, 1)
    for beams, penalty, early in SETTINGS[arch]:
        mine = decode_both(
            model,
            module,
            params,
            ids,
            mask,
            pad,
            num_beams=beams,
            length_penalty=penalty,
            early_stopping=early,
            **FORCED.get(arch, {}),
        )
        assert len(np.unique(mine[:, start:])) >= 4  # the models do not just repeat one token
        if arch == "mbart":  # the forced target-language token follows the decoder start token
            assert (mine[:, :2] == [2, 7]).all()
    # an end token the model produces early (the third generated token of the first input) ends sequences early
    greedy = decode_both(model, module, params, ids, mask, pad)
    eos = int(greedy[0, start + 2])
    for beams in (1, 3):
        ended = decode_both(model, module, params, ids, mask, pad, num_beams=beams, eos_token_id=eos)
        assert (ended[0, start + 3 :] == pad).all() or beams > 1


@pytest.mark.parametrize("lm", ["gpt2"], indirect=True)  # prompt padding concerns decoder-only models
def test_right_padded_prompts_decode_as_left_padded_ones(lm):
    arch, _, module, params, ids, mask = lm
    right_ids, right_mask = padded((5, 3, 1, 4), 5, 99, 5, seed=2, low=6)
    np.testing.assert_array_equal(right_ids[right_mask == 1], ids[mask == 1])  # the same prompts
    for beams in (1, 3):
        left = generate(module, params, ids, mask, max_length=MAX_LENGTH, num_beams=beams, length_penalty=0.7)
        right = generate(
            module, params, right_ids, right_mask, max_length=MAX_LENGTH, num_beams=beams, length_penalty=0.7
        )
        np.testing.assert_array_equal(right.sequences, left.sequences)
    np.testing.assert_array_equal(left_align(jnp.asarray(right_ids), jnp.asarray(right_mask) == 1)[0], ids)


@pytest.mark.slow
def test_cached_steps_equal_the_uncached_forward(lm):
    """Prefill the cache, then feed one argmax token at a time (one jitted step): every step's logits equal those
    of the uncached forward over the whole sequence at that position (within 1e-5 of the largest logit; causal
    attention makes the prefix's logits independent of what follows), and so do their argmaxes."""
    arch, _, module, params, ids, mask = lm
    apply = functools.partial(module.apply, {"params": params})
    steps, batch = 6, len(ids)
    if model_kind(module.config) == "causal_lm":
        prefix, prefix_mask = jnp.asarray(ids), jnp.asarray(mask) == 1
        out = apply(prefix, prefix_mask, cache=init_cache(module.config, batch, ids.shape[1] + steps))
        step = jax.jit(lambda token, cache: apply(token, cache=cache))
        uncached = lambda seq, seq_mask: apply(seq, seq_mask).logits  # noqa: E731
    else:
        memory = apply(ids, mask, method="encode").last_hidden_state
        prefix = jnp.full((batch, 1), module.config.decoder_start_token_id, jnp.int32)
        prefix_mask = jnp.ones(prefix.shape, bool)
        out = apply(
            prefix, memory, mask, cache=init_cache(module.config.decoder_config(), batch, 1 + steps), method="decode"
        )
        step = jax.jit(lambda token, cache: apply(token, memory, mask, cache=cache, method="decode"))
        uncached = lambda seq, seq_mask: apply(seq, memory, mask, seq_mask, method="decode").logits  # noqa: E731
    cached_logits, tokens = [], []
    for _ in range(steps):
        cached_logits.append(out.logits[:, -1])
        tokens.append(jnp.argmax(out.logits[:, -1], -1)[:, None].astype(prefix.dtype))
        out = step(tokens[-1], out.cache)
    assert int(out.cache.index) == prefix.shape[1] + steps
    seq = jnp.concatenate([prefix, *tokens], axis=1)
    full = uncached(seq, jnp.concatenate([prefix_mask, jnp.ones((batch, steps), bool)], axis=1))
    expected = full[:, prefix.shape[1] - 1 : -1]  # the logits that predicted each fed token
    # float32 rounding: the two paths sum attention over different lengths, so they differ by rounding that scales with
    # the logits (up to 1.1e-5 seen, logits up to 11); a cache at a wrong position moves them by ~1
    atol = 1e-5 * float(jnp.abs(expected).max())
    np.testing.assert_allclose(jnp.stack(cached_logits, 1), expected, atol=atol, rtol=0)
    np.testing.assert_array_equal(jnp.argmax(expected, -1), jnp.concatenate(tokens, 1))


def test_decoding_compiles_once_per_input_shape(lm):
    """The model is traced for the prefill and once for the loop body (not once per step), and a second batch of
    the same shape reuses the compilation."""
    arch, _, module, params, ids, mask = lm
    real_apply = type(module).apply
    traced = []

    def counting_apply(self, *args, **kwargs):
        traced.append(kwargs.get("method"))
        return real_apply(self, *args, **kwargs)

    with mock.patch.object(type(module), "apply", counting_apply):
        first = generate(module, params, ids, mask, max_length=9)
        first_traces = len(traced)
        rng = np.random.default_rng(7)
        other = np.where(mask == 1, rng.integers(6, 99, ids.shape), ids)
        generate(module, params, other, mask, max_length=9)
        again_traces = len(traced) - first_traces
    expected = 2 if arch == "gpt2" else 3  # (encode,) prefill, loop body
    assert first_traces == expected and again_traces == 0
    assert first.sequences.shape == (len(ids), 9)


def test_bad_settings_raise_clear_errors(lm):
    arch, _, module, params, ids, mask = lm
    run = lambda **k: generate(module, params, ids, mask, **k)  # noqa: E731
    with pytest.raises(ValueError, match="max_length=41 must lie in \\[2, 40\\]"):
        run(max_length=41)
    with pytest.raises(ValueError, match="eos_token_id=99 must be a token id in \\[0, 99\\)"):
        run(eos_token_id=99)
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1"):
        run(num_beams=0)
    with pytest.raises(ValueError, match="early_stopping must be one of"):
        run(early_stopping="sometimes")
    with pytest.raises(TypeError, match="unknown generation settings \\['do_sample'\\]"):
        run(do_sample=True)
    with pytest.raises(ValueError, match="at least one real token"):
        generate(module, params, ids, np.zeros_like(mask))
    if arch == "gpt2":
        with pytest.raises(ValueError, match="max_length=5 leaves no room after the prompt of length 5"):
            run(max_length=5)
    else:  # an encoder-decoder needs a token to start the decoder from
        no_bos = dataclasses.replace(module.config, bos_token_id=None)
        with pytest.raises(ValueError, match="decoder_start_token_id is needed for an encoder-decoder"):
            generation_config(no_bos, decoder_start_token_id=None)


def test_an_encoder_cannot_generate():
    cfg = config_from_hf(
        dict(
            model_type="bert",
            vocab_size=20,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
        )
    )
    encoder = build_encoder(cfg)
    params = jax.eval_shape(lambda: init_params(encoder, jax.random.key(0)))
    with pytest.raises(
        ValueError,
        match="generate needs a causal language model .decoder only. or an "
        "encoder-decoder; this bert model is an encoder .BERT family.",
    ):
        generate(encoder, params, np.ones((1, 3), np.int32))
