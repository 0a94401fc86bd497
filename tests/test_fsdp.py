"""FSDP: the parameters and Adam moments split over the mesh's data axis train exactly as when replicated, each
device really holds 1/8 of them, and checkpoints move between FSDP and the other placements and device counts.

The runs are the ones ``isojax finetune`` makes: :func:`isojax.train.loop.prepare` and
:func:`~isojax.train.loop.stage_runner` build the model, optimiser,
train step and runner of a configuration (a 1-layer, 16-wide BERT with the default model's vocabulary, the task
loss plus I-STAR on [CLS] and the cosine regulariser on the word embeddings, AdamW with warm-up, decay and gradient
clipping, no dropout), and the batches are those :func:`~isojax.train.loop.fit` feeds.

References: the replicated run on the same 8 devices (data parallel, no FSDP), itself checked against one device
by tests/test_train_parallel.py; the shard shapes against ``global / 8`` along the dimension the rule names,
worked out here by hand from the shapes.
"""

import jax
import numpy as np
import pytest
import transformers
from conftest import read_json, read_jsonl, save_tiny_encoder
from jax.sharding import PartitionSpec as P

from isojax.cli import main
from isojax.models.partitioning import fsdp_spec
from isojax.train import (
    LoggingConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    PlacementConfig,
    TaskConfig,
    TrainConfig,
)
from isojax.train.checkpoint import Checkpoints
from isojax.train.cli import config_from_argv
from isojax.train.feed import batch_indices, process_batches
from isojax.train.loop import checkpoint_meta, prepare, stage_runner, stage_steps
from isojax.train.methods import RegularizerSpec
from isojax.train.parallel import make_runner
from isojax.train.state import create_state

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")

B, STEPS = 16, 5  # 4 steps compared, a 5th after a checkpoint; the schedule spans all 5 in every run
RTOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    return save_tiny_encoder(tmp_path_factory.mktemp("tiny") / "model", tokenizer)


def _config(model, output_dir: str | None = None, log_every: int | None = None, **placement) -> TrainConfig:
    """The test's run; ``placement`` (devices, fsdp, model_parallel) and the two logging fields as given."""
    logging = {"progress": False}
    if output_dir is not None:
        logging["output_dir"] = output_dir
    if log_every is not None:
        logging["log_every"] = log_every
    return TrainConfig(
        task=TaskConfig(name="stsb", max_length=32, train_limit=4 * B, eval_limit=B),
        model=ModelConfig(name=model, dropout=False),
        method=MethodConfig(
            regularizers=(RegularizerSpec("istar", 0.3, "cls"), RegularizerSpec("cosine", 1.0, "embedding"))
        ),
        optim=OptimConfig(batch_size=B, eval_batch_size=B, steps=STEPS, learning_rate=3e-3),
        placement=PlacementConfig(**placement),
        logging=LoggingConfig(**logging),
    )


class Run:
    """A prepared configuration's first stage: its runner, placed state and the batches ``fit`` feeds it."""

    def __init__(self, config: TrainConfig):
        self.config, (recipe, model, self.train_rows, _, variables, references) = config, prepare(config)
        self.per_epoch = len(self.train_rows) // B
        total = stage_steps(config, self.per_epoch)[0]
        stage = config.stages()[0]
        optimizer, self.abstract, self.runner, _ = stage_runner(
            config, recipe, model, variables, references, stage, start=0, total=total
        )
        self.history: list[dict] = []
        self.placed = self.runner.place(create_state(variables, optimizer, config.seed))

    def batch(self, k: int) -> dict:
        """Batch ``k`` of the run, as :func:`isojax.train.loop.fit` draws it (one process: every row)."""
        epoch, index = divmod(k, self.per_epoch)
        order = batch_indices(len(self.train_rows), B, shuffle=True, seed=self.config.seed, epoch=epoch)
        return next(process_batches(self.train_rows, [order[index]], np.arange(B)))

    def train(self, steps: int) -> "Run":
        for _ in range(steps):
            k = int(self.runner.host(self.placed.step))
            self.placed, metrics = self.runner.train(self.placed, self.batch(k))
            self.history.append({name: float(v) for name, v in self.runner.host(metrics).items()})
        return self

    def host(self):
        return self.runner.host(self.placed)

    def save(self, directory) -> None:
        step = int(self.runner.host(self.placed.step))
        with Checkpoints(str(directory)) as checkpoints:
            checkpoints.save(
                step,
                self.runner.checkpoint_view(self.placed),
                checkpoint_meta(self.config, 0, step, start=0, per_epoch=self.per_epoch),
            )

    def restore(self, directory) -> "Run":
        with Checkpoints(str(directory)) as checkpoints:
            _, state, _ = checkpoints.restore_latest(lambda meta: self.runner.restore_target(self.abstract))
        self.placed = self.runner.from_checkpoint(state)
        return self


def assert_same_state(got, want) -> None:
    """Parameters and the whole optimiser state (Adam's moments and counts) within rtol 1e-5."""
    for name in ("step", "params", "opt_state"):
        jax.tree.map(
            lambda g, w: np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-7), getattr(got, name), getattr(want, name)
        )


def assert_same_history(history, reference) -> None:
    assert len(history) == len(reference)
    for got, want in zip(history, reference, strict=True):
        assert set(got) == set(want)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=RTOL, abs=1e-7), key


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """The replicated reference (4 steps, checkpointed, a 5th), FSDP over 8 devices (4 steps, checkpointed),
    FSDP over data 4 x model 2 (4 steps) and the pmap placement over 8 devices (4 steps)."""
    directory = tmp_path_factory.mktemp("checkpoints")
    reference = Run(_config(tiny, devices=8)).train(4)
    at_4 = reference.host()
    reference.save(directory / "replicated")
    reference.train(1)
    fsdp = Run(_config(tiny, devices=8, fsdp=True)).train(4)
    fsdp.save(directory / "fsdp")
    fsdp_model = Run(_config(tiny, devices=8, fsdp=True, model_parallel=2)).train(4)
    pmap = Run(_config(tiny, devices=8, parallel="pmap")).train(4)
    trained = {"reference": reference, "at_4": at_4, "fsdp": fsdp, "fsdp_model": fsdp_model, "pmap": pmap}
    return trained | {"directory": directory}


@pytest.mark.parametrize("name", ["fsdp", "fsdp_model", "pmap"], ids=["fsdp8", "fsdp4x2", "pmap8"])
@pytest.mark.slow
def test_four_fsdp_steps_equal_the_replicated_run(runs, name):
    run, reference = runs[name], runs["reference"]
    assert_same_history(run.history, reference.history[:4])
    assert_same_state(run.host(), runs["at_4"])
    assert reference.history[3]["loss"] != reference.history[0]["loss"]  # it did train
    assert set(reference.history[0]) >= {"loss", "task", "istar@cls", "cosine@embedding", "grad_norm"}


def _shard_shapes(array) -> set:
    return {shard.data.shape for shard in array.addressable_shards}


def _keys(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)


def _moments(opt_state, param_path) -> list:
    """Adam's first and second moments of the parameter at ``param_path``: the optimiser-state arrays under ``mu`` /
    ``nu`` whose path ends with the parameter's."""
    keys = _keys(param_path)
    return [
        x
        for path, x in jax.tree_util.tree_leaves_with_path(opt_state)
        if _keys(path)[-len(keys) :] == keys and {"mu", "nu"} & set(_keys(path))
    ]


def test_every_parameter_and_adam_moment_is_split_over_the_8_devices(runs):
    placed = runs["fsdp"].placed
    params = jax.tree_util.tree_leaves_with_path(placed.params)
    moments = [m for path, _ in params for m in _moments(placed.opt_state, path)]
    assert len(moments) == 2 * len(params)
    unsplit = []
    for path, x in params:
        # the rule by hand: the largest dimension divisible by 8 (earliest on ties)
        dims = [i for i, n in enumerate(x.shape) if n % 8 == 0]
        if not dims:
            unsplit.append(jax.tree_util.keystr(path))
            assert x.sharding.is_fully_replicated
            continue
        dim = max(dims, key=lambda i: (x.shape[i], -i))
        want = tuple(n // 8 if i == dim else n for i, n in enumerate(x.shape))
        assert x.sharding.shard_shape(x.shape) == want, path
        assert _shard_shapes(x) == {want}, path
        # Adam's two moments of this parameter: the same split
        for moment in _moments(placed.opt_state, path):
            assert moment.sharding.spec == x.sharding.spec and _shard_shapes(moment) == {want}, path
    assert unsplit == ["['head']['classifier']['bias']"]  # [1]: nothing to split

    # per-device bytes of the split parameters and moments: total / 8 on every device
    split = [x for _, x in params if not x.sharding.is_fully_replicated]
    split += [m for m in moments if not m.sharding.is_fully_replicated]
    total = sum(x.nbytes for x in split)
    per_device = dict.fromkeys(jax.devices(), 0)
    for x in split:
        for shard in x.addressable_shards:
            per_device[shard.device] += shard.data.nbytes
    assert len(per_device) == 8
    for device, nbytes in per_device.items():
        assert abs(nbytes - total / 8) <= 0.05 * total / 8, (device, nbytes, total)
    # and all of the parameters and moments together (the one replicated bias included)
    everything = [x for _, x in params] + moments
    assert (
        max(sum(s.data.nbytes for x in everything for s in x.addressable_shards if s.device == d) for d in per_device)
        <= 1.05 * sum(x.nbytes for x in everything) / 8
    )


def test_fsdp_combines_with_the_model_axis(runs):
    placed = runs["fsdp_model"].placed
    layer = placed.params["encoder"]["encoder"]["layer_0"]
    assert runs["fsdp_model"].runner.mesh.shape == {"data": 4, "model": 2}
    # query [16, 16]: output features over model (Megatron), input features over data
    assert layer["attention"]["query"]["kernel"].sharding.spec == P("data", "model")
    assert layer["attention"]["query"]["kernel"].sharding.shard_shape((16, 16)) == (4, 8)
    # attention output [16, 16]: input features over model, so output features over data
    assert layer["attention"]["output"]["kernel"].sharding.spec == P("model", "data")
    # intermediate [16, 32]: 32 is over model, so 16 over data
    assert layer["intermediate"]["kernel"].sharding.spec == P("data", "model")
    assert layer["intermediate"]["kernel"].sharding.shard_shape((16, 32)) == (4, 16)
    # word embeddings [vocab 30522, 16]: 30522 does not divide by 4, so the 16 features
    embedding = placed.params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    assert embedding.sharding.spec == P(None, "data")
    assert embedding.sharding.shard_shape(embedding.shape) == (embedding.shape[0], 4)


@pytest.mark.parametrize(
    ("saved", "placement"),
    [
        ("fsdp", {"devices": 2}),
        ("fsdp", {"devices": 4, "model_parallel": 2}),
        ("replicated", {"devices": 4, "fsdp": True}),
        ("replicated", {"devices": 8, "fsdp": True, "model_parallel": 2}),
        ("fsdp", {"devices": 8, "parallel": "pmap"}),
        ("replicated", {"devices": 4, "parallel": "pmap"}),
    ],
    ids=[
        "fsdp8-to-replicated2",
        "fsdp8-to-model2x2",
        "replicated8-to-fsdp4",
        "replicated8-to-fsdp4x2",
        "fsdp8-to-pmap8",
        "replicated8-to-pmap4",
    ],
)
def test_a_checkpoint_restores_under_another_placement_and_device_count(runs, tiny, saved, placement):
    """Saved after step 4 under one placement on 8 devices, restored under another (the pmap placement among them) on
    2, 4 or 8 devices, one more step: the state and loss of the uninterrupted replicated run's step 5."""
    run = Run(_config(tiny, **placement)).restore(runs["directory"] / saved)
    restored = run.host()
    assert int(restored.step) == 4
    assert_same_state(restored, runs["at_4"])
    assert {len(x.sharding.device_set) for x in jax.tree.leaves(run.placed)} == {placement["devices"]}
    run.train(1)
    assert_same_history(run.history, runs["reference"].history[4:])
    assert_same_state(run.host(), runs["reference"].host())


def test_fsdp_spec_rule():
    # largest divisible dimension; ties to the earlier one; a dimension over the model axis is not taken
    assert fsdp_spec("a/kernel", (16, 32), P(), 8) == P(None, "data")
    assert fsdp_spec("a/kernel", (16, 16), P(), 8) == P("data", None)
    assert fsdp_spec("a/kernel", (24, 16), P(), 8) == P("data", None)
    assert fsdp_spec("a/kernel", (16, 32), P(None, "model"), 4) == P("data", "model")
    # nothing divides: the model-parallel spec unchanged; one data device: unchanged
    assert fsdp_spec("a/bias", (3,), P(), 8) == P()
    assert fsdp_spec("a/kernel", (12, 6), P(None, "model"), 8) == P(None, "model")
    assert fsdp_spec("a/kernel", (16, 32), P(None, "model"), 1) == P(None, "model")
    assert fsdp_spec("step", (), P(), 8) == P()
    # a scanned stack's layer axis is never split, for its parameters and their moments alike
    assert fsdp_spec(
        "encoder/encoder/layers/block/attention/query/kernel", (16, 16, 16), P(None, None, "model"), 8
    ) == P(None, "data", "model")
    assert fsdp_spec("opt_state/0/mu/encoder/encoder/layers/block/output/bias", (16, 8), P(), 8) == P(None, "data")
    with pytest.raises(ValueError, match="data_size"):
        fsdp_spec("a/kernel", (16, 16), P(), 0)


def test_fsdp_is_refused_under_pmap(tiny):
    argv = ["finetune", "--model", tiny, "--fsdp", "--parallel", "pmap"]
    with pytest.raises(ValueError, match="fsdp=True needs parallel='mesh'"):
        config_from_argv(argv)
    with pytest.raises(ValueError, match="fsdp=True needs parallel='mesh'"):
        make_runner(
            "pmap",
            num_devices=8,
            model_parallel=1,
            make_step=None,
            predict=None,
            abstract_state=None,
            partition_rules=(),
            fsdp=True,
        )
    with pytest.raises(TypeError, match=r"placement.fsdp \(--fsdp\) must be true or false"):
        PlacementConfig(fsdp="no")
    assert config_from_argv(["finetune", "--model", tiny, "--fsdp"]).placement.fsdp
    assert not config_from_argv(["finetune", "--model", tiny]).placement.fsdp


def test_isojax_finetune_fsdp_trains_as_the_replicated_run(runs, tiny, tmp_path, capsys):
    """``isojax finetune --fsdp`` on 8 devices: the 5 logged losses and the final state of the replicated
    reference."""
    out = tmp_path / "run"
    argv = ["finetune", "--task", "stsb", "--model", tiny, "--reg", "istar=0.3@cls", "--reg", "cosine=1.0@embedding"]
    argv += ["--max-length", "32", "--batch-size", str(B), "--eval-batch-size", str(B), "--train-limit", str(4 * B)]
    argv += ["--eval-limit", str(B), "--steps", str(STEPS), "--lr", "3e-3", "--no-dropout", "--log-every", "1"]
    argv += ["--devices", "8", "--fsdp", "--out", str(out), "--no-progress"]
    assert config_from_argv(argv) == _config(tiny, devices=8, fsdp=True, output_dir=str(out), log_every=1)
    assert main(argv) == 0
    records = read_jsonl(out / "log.jsonl")
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses == pytest.approx([h["loss"] for h in runs["reference"].history], rel=RTOL)
    saved = read_json(out / "results.json")
    assert saved["config"]["placement"]["fsdp"] is True and saved["step"] == STEPS
    # the run's final checkpoint (saved under FSDP) read into the replicated placement: the reference's state
    reference = runs["reference"]
    with Checkpoints(str(out / "checkpoints")) as checkpoints:
        step, state, _ = checkpoints.restore_latest(lambda meta: reference.runner.restore_target(reference.abstract))
    assert step == STEPS
    assert_same_state(reference.runner.host(state), reference.host())
