"""Checkpoint files as models ship them (single and sharded safetensors and ``.bin``) and loading onto a mesh.

References: the state dict of the PyTorch model that wrote the files (transformers' ``save_pretrained`` for
safetensors shards; ``torch.save`` of the shards that ``huggingface_hub.split_torch_state_dict_into_shards`` cuts,
the layout transformers 4 wrote with ``safe_serialization=False``, for ``.bin`` shards); for the mesh, the params
loaded onto one device and the shardings worked out by hand from the shapes below.
"""

import json

import jax
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import isojax
from isojax.models import checkpoint
from isojax.models.hub import param_shardings
from isojax.train.parallel import make_mesh

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# hidden 32, intermediate 64, vocab 100: every dimension below divides by the 4 x 2 mesh where the rules say
CONFIG = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=24,
    type_vocab_size=2,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**CONFIG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def reference(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def single(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    model.save_pretrained(path)
    return path


def _save_bin_shards(model, path, max_shard_size="20KB"):
    """``pytorch_model-0000i-of-0000n.bin`` shards and ``pytorch_model.bin.index.json``, as transformers 4 wrote."""
    from huggingface_hub import split_torch_state_dict_into_shards

    state = model.state_dict()
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="pytorch_model{suffix}.bin", max_shard_size=max_shard_size
    )
    for filename, keys in split.filename_to_tensors.items():
        torch.save({k: state[k].contiguous() for k in keys}, path / filename)
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (path / "config.json").write_text(model.config.to_json_string())
    return len(split.filename_to_tensors)


def test_sharded_safetensors_read_as_the_model_state_dict(model, reference, tmp_path):
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and len(list(tmp_path.glob("*.safetensors"))) > 2
    state = checkpoint.read_state_dict(tmp_path)
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)


def test_sharded_pytorch_bin_read_as_the_model_state_dict_and_run_as_pytorch(model, reference, tmp_path):
    assert _save_bin_shards(model, tmp_path) > 2
    state = checkpoint.read_state_dict(tmp_path)
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)
    module, params, _ = isojax.from_pretrained(str(tmp_path), with_tokenizer=False)
    ids = np.array([[5, 17, 3, 99, 42, 8]])
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
    out = module.apply({"params": params}, ids, np.ones_like(ids))
    np.testing.assert_allclose(np.asarray(out.last_hidden_state), ref, atol=1e-5, rtol=0)


def test_a_shard_missing_from_its_index_is_named(model, tmp_path):
    _save_bin_shards(model, tmp_path)
    shard = sorted(tmp_path.glob("pytorch_model-*.bin"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{shard.name} does not exist; the checkpoint index"):
        checkpoint.open_state_dict(tmp_path)


def test_bfloat16_safetensors_read_as_float32(tmp_path):
    from safetensors.torch import save_file

    value = torch.linspace(-3, 3, 12, dtype=torch.bfloat16).reshape(3, 4)
    save_file({"w": value, "b": torch.arange(3, dtype=torch.float32)}, tmp_path / "model.safetensors")
    state = checkpoint.read_state_dict(tmp_path)
    assert state["w"].dtype == np.float32
    np.testing.assert_array_equal(state["w"], value.float().numpy())
    np.testing.assert_array_equal(state["b"], [0, 1, 2])


def test_the_lazy_state_dict_reads_a_tensor_only_when_indexed(single, reference):
    state = checkpoint.open_state_dict(single)
    reads = []
    lazy = checkpoint.LazyStateDict(state, lambda key: reads.append(key) or state[key], "test")
    assert set(lazy) == set(reference) and reads == []
    key = "encoder.layer.1.output.dense.weight"
    np.testing.assert_array_equal(lazy[key], reference[key])
    assert reads == [key]


# ---------------------------------------------------------------- onto a mesh, tensor by tensor

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")

# (path, spec) per placement on the data 4 x model 2 mesh, worked out from the shapes: the word embeddings
# [100, 32] are replicated by the model rules and FSDP splits 100 (largest dividing by 4); the feed-forward kernel
# [32, 64] is split by columns over model, FSDP takes the largest remaining dimension; the attention output kernel
# [32, 32] is split by rows over model; a LayerNorm scale [32] splits over data only.
EMB = ("embeddings", "word_embeddings", "embedding")
FFN = ("encoder", "layer_0", "intermediate", "kernel")
ATT = ("encoder", "layer_1", "attention", "output", "kernel")
NORM = ("encoder", "layer_1", "output_norm", "scale")
EXPECTED = {
    "replicated": {EMB: P(), FFN: P(), ATT: P(), NORM: P()},
    "tensor": {EMB: P(), FFN: P(None, "model"), ATT: P("model", None), NORM: P()},
    "fsdp": {EMB: P("data", None), FFN: P(None, "data"), ATT: P("data", None), NORM: P("data")},
    "fsdp+tensor": {EMB: P("data", None), FFN: P("data", "model"), ATT: P("model", "data"), NORM: P("data")},
}


def _leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


@needs_8
@pytest.mark.parametrize("placement", list(EXPECTED))
def test_params_loaded_onto_a_mesh_equal_the_host_ones_and_carry_their_shardings(single, placement):
    _, host, _ = isojax.from_pretrained(str(single), with_tokenizer=False)
    mesh = make_mesh(8, model_parallel=2)
    module, placed, _ = isojax.from_pretrained(str(single), with_tokenizer=False, mesh=mesh, placement=placement)
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(placed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for path, spec in EXPECTED[placement].items():
        leaf = _leaf(placed, path)
        assert leaf.sharding.mesh == mesh and leaf.sharding.spec == spec, (path, leaf.sharding.spec)
    ffn = _leaf(placed, FFN)  # [32, 64]: each device holds only its block
    rows, cols = (4 if "fsdp" in placement else 1), (2 if "tensor" in placement else 1)
    if placement == "fsdp":
        rows, cols = 1, 4
    assert {s.data.shape for s in ffn.addressable_shards} == {(32 // rows, 64 // cols)}
    ids = np.arange(16).reshape(8, 2) % 100
    expected = module.apply({"params": host}, ids, np.ones_like(ids)).last_hidden_state
    out = jax.jit(module.apply)({"params": placed}, ids, np.ones_like(ids)).last_hidden_state
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5, rtol=0)


@needs_8
def test_bad_mesh_or_placement_is_refused(single):
    explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
    with pytest.raises(ValueError, match=r"Explicit .* build the mesh with Auto axes"):
        isojax.from_pretrained(str(single), with_tokenizer=False, mesh=explicit)
    with pytest.raises(ValueError, match="placement must be one of"):
        isojax.from_pretrained(str(single), with_tokenizer=False, mesh=make_mesh(8), placement="zero3")
    with pytest.raises(ValueError, match="placement='fsdp' needs a mesh"):
        isojax.from_pretrained(str(single), with_tokenizer=False, placement="fsdp")
    data_only = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    config = isojax.models.config_from_hf(json.loads((single / "config.json").read_text()))
    shapes = {"w": jax.ShapeDtypeStruct((8, 8), np.float32)}
    with pytest.raises(ValueError, match="needs a mesh axis named 'model'"):
        param_shardings(shapes, config, data_only, "tensor")


@needs_8
def test_a_scanned_encoder_is_stacked_then_placed(single):
    _, host, _ = isojax.from_pretrained(str(single), with_tokenizer=False, scan_layers=True)
    mesh = make_mesh(8, model_parallel=2)
    _, placed, _ = isojax.from_pretrained(
        str(single), with_tokenizer=False, scan_layers=True, mesh=mesh, placement="fsdp+tensor"
    )
    for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(placed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # [layers 2, 32, 64]: the layer axis is never split; FSDP takes the 32 rows, the model axis the 64 columns
    kernel = placed["encoder"]["layers"]["block"]["intermediate"]["kernel"]
    assert kernel.sharding.spec == P(None, "data", "model")
    assert {s.data.shape for s in kernel.addressable_shards} == {(2, 8, 32)}
