"""The scale table: per-device memory and communication of the real fine-tuning train step, read from the compiled
step for each placement, against their analytic minima.

    python -m experiments.benchmarks.scale [--models bert-base,bart-large,mbart-large] [--layouts all|replicated 8,...]
                                [--dtypes float32,bfloat16] [--remat none,full] [--batches 16,32] [--length 128]
                                [--out experiments/results]
                                [--keep [--redo "fsdp 8,fsdp 4 x model 2"] [--redo-models bart-large,mbart-large]]

**Step.** The first stage's train step of ``isojax finetune --method baseline`` as :func:`isojax.train.loop.fit`
builds it (:func:`isojax.train.loop.stage_runner`: objective, AdamW, clipping, the runner's ``jit`` with its
shardings and donated state), on a model built from a config (nothing is downloaded, nothing is initialised: the
state is abstract, ``jax.eval_shape``), dropout on, layers unrolled: BERT-base (GLUE RTE, a 2-class head), BART-large (CNN/DailyMail)
and mBART-large (WMT16 en-ro) shapes, sources and targets of ``--length`` tokens. Each cell is only lowered and
compiled (``runner.train_step.lower(state, batch).compile()``), never run. ``remat full`` is the encoders' option
(``TrainConfig`` refuses ``remat`` for a sequence-to-sequence task, so the encoder-decoders have ``none`` only).

**Layouts** (``(data, model)`` mesh of :mod:`isojax.train.parallel`): ``replicated N`` (data parallel over N
devices), ``model M`` (8 devices, data 8/M x model M, the Megatron rules), ``fsdp 8`` and ``fsdp 4 x model 2``
(parameters and optimiser moments sharded over the data axis too, ``placement.fsdp``; the step computes on the
parameters gathered and sums the gradient over the data axis, :mod:`isojax.train.parallel`).

**Measured, per device.** ``compiled.memory_analysis()``: argument, output, temporary and aliased bytes of the
per-device program; the *state* bytes are the argument bytes less the device's batch rows. *Peak* =
argument + temporary + output - aliased (the donated state's output reuses its input). **Collective bytes** per step
are summed over the collectives in ``compiled.as_text()`` (:func:`collective_bytes`), each counted by the size of
the *whole array it operates on*: all-reduce, all-gather, all-to-all and collective-permute by their result,
reduce-scatter by its result times its group size (its input). A ring moves about ``(g-1)/g`` of that per device
(twice for an all-reduce). A collective in a loop body would count once per step, not per iteration
(``collectives_in_loops`` in the JSON, :func:`collectives_in_loops`: the unrolled steps here have none).
``batch_shaped_collective_bytes``: the bytes of the collectives that move an array whose leading dimension is the
global batch or a data shard's rows (activations, masks, labels), not parameters.

**Analytic minima** (:func:`analytic`), ``P`` the parameter count, ``b`` the rows per data shard, ``s`` the length,
``h`` the width, ``a`` the heads, ``L`` the layers, ``t`` the model-axis size, ``N`` the data-axis size:

- collectives, data parallel: one all-reduce of the float32 gradient, ``4P``; FSDP: the parameters all-gathered for
  the forward and again for the backward, and the gradient reduce-scattered, ``3 x 4P`` (the issue's count; a step
  that keeps the forward's gathered parameters for the backward needs ``2 x 4P``, and the goals say which the
  compiled step does, :func:`why_missed`); the model axis adds
  Megatron's activation all-reduces of ``[b, s, h]`` in the compute dtype, 2 forward + 2 backward per encoder layer
  (+2 recomputed forward with ``remat full``), 3 + 4 per decoder layer (self-, cross-attention and MLP; the
  cross-attention's keys and values return a gradient to the encoder output), and the data axis all-reduces the
  gradient of each model shard (``4 P_shard``);
- state: parameters + the two Adam moments, ``3 x 4P`` (over ``N`` under FSDP, the Megatron-split matrices over
  ``t``);
- temporary: the gradient (``4P``, sharded as the parameters) + activations by Korthikanti et al. 2022 (Reducing
  activation recomputation, eq. 1-2): per encoder layer ``s b h (10 + 24/t + 5 a s / (h t))`` bytes with 16-bit
  activations (bfloat16; x2 for float32), ``2 s b h`` per layer with full recomputation (the layer input only); a
  decoder layer adds a cross-attention block (``s b h (5 + 6/t) + 5 a s^2 b / t``; its own 2-byte layer input);
  and the float32 logits and their gradient, ``8 s b V`` (``V`` the vocabulary for a language-model head).

**Fit.** Every layout is compiled at two global batch sizes; a device of M bytes fits the largest batch ``B`` (a
multiple of the data-axis size) with ``peak(B) <= M``, extrapolated linearly from the two (peak = intercept +
slope x B).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":  # the mesh cells need 8 devices; on CPU they are virtual (as tests/conftest.py does)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.tooling.report import RESULTS, markdown_table, provenance, write_result  # noqa: E402
from isojax.argtypes import int_at_least  # noqa: E402

GIB = 2**30
DEVICES_GIB = {"TPU v5e (16 GiB)": 16, "TPU v4 (32 GiB)": 32, "H100 (80 GiB)": 80}

_BART_LARGE = dict(
    model_type="bart",
    d_model=1024,
    encoder_layers=12,
    decoder_layers=12,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4096,
    decoder_ffn_dim=4096,
    vocab_size=50265,
    max_position_embeddings=1024,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=2,
)
_MBART_LARGE = {k: v for k, v in _BART_LARGE.items() if k != "decoder_start_token_id"}
_MBART_LARGE.update(model_type="mbart", vocab_size=250027, scale_embedding=True)

MODELS = {
    "bert-base": (
        "rte",
        dict(
            model_type="bert",
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            vocab_size=30522,
            max_position_embeddings=512,
        ),
    ),
    "bart-large": ("cnn_dailymail", _BART_LARGE),
    "mbart-large": ("wmt16_en_ro", _MBART_LARGE),
}
"""Name -> (task, Hugging Face config): the shapes of bert-base-uncased, facebook/bart-large and
facebook/mbart-large-cc25."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """A placement: ``devices`` over a ``(devices / model_parallel, model_parallel)`` mesh, ``fsdp`` sharding the
    parameters and optimiser moments over the data axis too."""

    name: str
    devices: int
    model_parallel: int = 1
    fsdp: bool = False

    @property
    def data(self) -> int:
        return self.devices // self.model_parallel


LAYOUTS = {
    layout.name: layout
    for layout in (
        *(Layout(f"replicated {n}", n) for n in (1, 2, 4, 8)),
        *(Layout(f"model {m}", 8, m) for m in (2, 4, 8)),
        Layout("fsdp 8", 8, fsdp=True),
        Layout("fsdp 4 x model 2", 8, 2, fsdp=True),
    )
}


# ------------------------------------------------------------------------------------------------ the HLO


DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
DTYPE_BYTES.update({"f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16})
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")


def _array_bytes(shape_text: str) -> list[int]:
    return [
        DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(shape_text)
    ]


def _group_size(line: str, num_devices: int) -> int:
    """Size of the replica groups of a collective: ``{{0,1},{2,3}}`` -> 2, iota form ``[2,4]<=[8]`` -> 4, none
    (``{}``) -> every device."""
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
    if iota:
        return int(iota.group(1).split(",")[-1])
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    return len(listed.group(1).split(",")) if listed else num_devices


def collectives(hlo_text: str, num_devices: int):
    """``(op, bytes, arrays)`` of each collective of an HLO module's text (module docstring: each op counted by the
    whole array it operates on; reduce-scatter by result x group size). An async ``-start`` op counts for its pair
    (``-done`` is not counted); of its tuple result, the outputs: all of an all-reduce's, the second half of the
    non-scalar arrays of the others (their result holds the operands first). ``arrays``: ``(dtype, dimensions)``
    of each counted array (dimensions ``()`` for a scalar), in order."""
    for line in hlo_text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        op, arrays = m.group("op"), _ARRAY.findall(m.group("shape"))
        if m.group("start") and op != "all-reduce":
            arrays = [a for a in arrays if a[1]]
            arrays = arrays[len(arrays) // 2 :]
        total = sum(_array_bytes(f"{dtype}[{dims}]")[0] for dtype, dims in arrays)
        if op == "reduce-scatter":
            total *= _group_size(line, num_devices)
        yield op, total, tuple((dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in arrays)


def batch_shaped_bytes(hlo_text: str, num_devices: int, rows: tuple[int, ...], parameter_shapes: set) -> int:
    """Bytes of the collectives' arrays (:func:`collectives`; counted as there) whose leading dimension is one of
    ``rows`` (the global batch, a data shard's rows) and whose shape is no parameter's (a ``[2, h]`` token-type
    table is not a batch of 2 rows): activations, masks, token ids, labels."""
    out = 0
    for _, total, arrays in collectives(hlo_text, num_devices):
        sizes = [DTYPE_BYTES[dtype] * math.prod(dims) for dtype, dims in arrays]
        factor = total / max(sum(sizes), 1)  # a reduce-scatter's group size, else 1
        out += round(
            factor
            * sum(
                n
                for n, (_, dims) in zip(sizes, arrays)
                if dims[:1] in {(r,) for r in rows} and dims not in parameter_shapes
            )
        )
    return out


def collective_bytes(hlo_text: str, num_devices: int) -> dict[str, int]:
    """``{op: bytes}`` summed over the collectives of an HLO module's text (:func:`collectives`)."""
    out = dict.fromkeys(COLLECTIVES, 0)
    for op, total, _ in collectives(hlo_text, num_devices):
        out[op] += total
    return out


def collectives_in_loops(hlo_text: str) -> int:
    """How many collectives lie in the body of a ``while`` loop (:func:`collective_bytes` counts each once, not once
    per iteration), directly or in a computation that the body calls."""
    bodies: set[str] = set()
    calls: dict[str, set[str]] = {}
    ops: dict[str, int] = {}
    name = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head:
            name = head.group(1)
            calls[name], ops[name] = set(), 0
            continue
        if name is None:
            continue
        bodies.update(re.findall(r"body=%?([\w.\-]+)", line))
        for target in re.findall(r"(?:calls|to_apply|branch_computations|body|condition)=(\{[^}]*\}|%?[\w.\-]+)", line):
            calls[name].update(re.findall(r"[\w.\-]+", target))
        ops[name] += bool(_OP.match(line))
    seen, todo = set(), list(bodies)
    while todo:
        c = todo.pop()
        if c not in seen and c in calls:
            seen.add(c)
            todo.extend(calls[c])
    return sum(ops[c] for c in seen)


# ------------------------------------------------------------------------------------------------ the step


def model_config(name: str):
    """The :class:`isojax.models.TransformerConfig` of a :data:`MODELS` entry (through the Hugging Face translation)."""
    from isojax.models import config_from_hf

    return config_from_hf(MODELS[name][1])


def train_config(name: str, layout: Layout, *, dtype: str, remat: str, batch: int, length: int):
    """The :class:`~isojax.train.config.TrainConfig` of a cell (method baseline, one step, the layout's devices)."""
    from isojax.train.config import TrainConfig

    overrides = {
        "task.name": MODELS[name][0],
        "task.max_length": length,
        "model.name": name,
        "model.dtype": dtype,
        "model.remat": remat,
        "optim.batch_size": batch,
        "optim.steps": 1,
        "optim.eval_batch_size": batch,
        "logging.progress": False,
        "placement.parallel": "mesh",
        "placement.devices": layout.devices,
        "placement.model_parallel": layout.model_parallel,
        "placement.fsdp": layout.fsdp,
    }
    if MODELS[name][0] in ("cnn_dailymail", "wmt16_en_ro"):
        overrides["seq2seq.max_target_length"] = length
    return TrainConfig().override(overrides)


class _LanguageCodes:
    """Stands in for the tokenizer that Seq2SeqRecipe.build loads: mBART's decoding starts from the target language
    code's id, which only the prediction step (not compiled here) uses."""

    def __init__(self, token_id: int):
        self.token_id = token_id

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.token_id


def build_step(name: str, layout: Layout, *, dtype: str, remat: str, batch: int, length: int):
    """``(jitted step, abstract state, abstract batch, config)``: the runner's train step of the cell (module
    docstring) and its arguments as ``ShapeDtypeStruct`` s with the runner's shardings."""
    from isojax.data.glue import glue_task
    from isojax.models import build_encoder, build_model, init_params
    from isojax.train import loop
    from isojax.train.model import TaskModel, init_variables
    from isojax.train.parallel import MeshRunner
    from isojax.train.tasks import classification, seq2seq

    config = train_config(name, layout, dtype=dtype, remat=remat, batch=batch, length=length)
    cfg = model_config(name)
    compute = jnp.dtype(dtype)
    # each branch pairs a recipe with its own model type, the pairing stage_runner is generic over (a union of the
    # two would not say which recipe goes with which model)
    recipe: Any
    model: Any
    init: Callable[..., dict]
    rows: dict[str, tuple[int, ...]]
    if config.is_seq2seq:
        recipe = seq2seq.Seq2SeqRecipe(config)
        recipe.model_config = cfg  # what Seq2SeqRecipe.build sets from the checkpoint it loads
        recipe.tokenizer = _LanguageCodes(cfg.eos_token_id)
        model = seq2seq.Seq2SeqModel(build_model(cfg, dtype=compute))
        network, init = model.encoder, seq2seq.init_variables
        rows = {k: (batch, length) for k in (*seq2seq.Seq2SeqModel.INPUTS, "labels")}
    else:
        recipe = classification.ClassificationRecipe(config)
        network = build_encoder(cfg, dtype=compute, remat=remat)
        model = TaskModel(
            network, num_labels=glue_task(config.task.name).num_labels, pooling=config.model.pooling, dropout_rate=0.1
        )
        init = init_variables
        rows = {k: (batch, length) for k in TaskModel.INPUTS} | {"labels": (batch,)}
    loop.check_setup(config, model)
    variables = jax.eval_shape(lambda: init(model, init_params(network, jax.random.key(0)), jax.random.key(1)))
    total = loop.stage_steps(config, per_epoch=1)[0]
    _, abstract, runner, _ = loop.stage_runner(
        config, recipe, model, variables, {}, config.stages()[0], start=0, total=total
    )
    assert isinstance(runner, MeshRunner)  # the layouts here are meshes (module docstring)
    state = runner.restore_target(abstract)
    batch_args = {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=runner.batch_sharding) for k, s in rows.items()}
    return runner.train_step, state, batch_args, config


def _per_device_bytes(tree) -> int:
    """Bytes of one device's shards of a tree of ``ShapeDtypeStruct`` s with shardings (the largest shard)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def measure(name: str, layout: Layout, *, dtype: str, remat: str, batch: int, length: int) -> dict:
    """One compiled cell: per-device memory, collective bytes, the parameter count and the compile seconds."""
    start = time.perf_counter()
    step, state, batch_args, _ = build_step(name, layout, dtype=dtype, remat=remat, batch=batch, length=length)
    compiled = step.lower(state, batch_args).compile()
    seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    text = compiled.as_text()
    batch_bytes = _per_device_bytes(batch_args)
    return {
        "model": name,
        "layout": layout.name,
        "dtype": dtype,
        "remat": remat,
        "batch": batch,
        "length": length,
        "params": sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
        "params_per_device_bytes": _per_device_bytes(state.params),
        "argument_bytes": mem.argument_size_in_bytes,
        "output_bytes": mem.output_size_in_bytes,
        "temp_bytes": mem.temp_size_in_bytes,
        "alias_bytes": mem.alias_size_in_bytes,
        "batch_bytes": batch_bytes,
        "state_bytes": mem.argument_size_in_bytes - batch_bytes,
        "peak_bytes": mem.argument_size_in_bytes
        + mem.temp_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes,
        "collectives": collective_bytes(text, layout.devices),
        "batch_shaped_collective_bytes": batch_shaped_bytes(
            text, layout.devices, (batch, batch // layout.data), {x.shape for x in jax.tree.leaves(state.params)}
        ),
        "collectives_in_loops": collectives_in_loops(text),
        "compile_s": round(seconds, 1),
    }


# ------------------------------------------------------------------------------------------------ analytic


def analytic(name: str, layout: Layout, *, dtype: str, remat: str, batch: int, length: int, params: int) -> dict:
    """Analytic minima per device (module docstring): ``collective_bytes``, ``state_bytes``, ``temp_bytes``."""
    cfg = model_config(name)
    t, n = layout.model_parallel, layout.data
    b, s, h, a = batch // n, length, cfg.hidden_size, cfg.num_attention_heads
    act = 2 if dtype == "bfloat16" else 4  # bytes of a stored activation
    enc_layers, dec_layers = cfg.num_hidden_layers, cfg.decoder_layers or 0
    # parameters the Megatron rules split over the model axis: q, k, v (and their biases), the attention output,
    # the two FFN matrices and the FFN input bias
    attn, ffn = 4 * h * h + 3 * h, 2 * h * cfg.intermediate_size + cfg.intermediate_size
    split = enc_layers * (attn + ffn) + dec_layers * (2 * attn + ffn)
    shard = params - split + split / t  # parameters per model shard
    per_device = shard / n if layout.fsdp else shard
    coll = 0.0
    if layout.fsdp:
        coll += 3 * 4 * shard
    elif n > 1:
        coll += 4 * shard
    if t > 1:
        enc_passes = 4 + (2 if remat == "full" else 0)
        coll += (enc_layers * enc_passes + dec_layers * 7) * b * s * h * act
    if remat == "full":
        activations = enc_layers * 2 * s * b * h
    else:
        per_token = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * act / 2
        cross = s * b * h * (5 + 6 / t) * act / 2 + 5 * a * s * s * b / t * act / 2
        activations = enc_layers * per_token + dec_layers * (per_token + cross)
    logits = 8 * s * b * cfg.vocab_size if dec_layers else 0
    return {
        "collective_bytes": coll,
        "state_bytes": 3 * 4 * per_device,
        "temp_bytes": 4 * per_device + activations + logits,
    }


# ------------------------------------------------------------------------------------------------ the table


@dataclasses.dataclass(frozen=True)
class Cell:
    """One configuration of the table, compiled at each of ``batches`` (two: the fit extrapolates from them)."""

    model: str
    layout: str
    dtype: str = "float32"
    remat: str = "none"
    batches: tuple[int, ...] = (16,)

    def skip_reason(self) -> str | None:
        """Why the cell is not run here (None: it is)."""
        cfg, layout = model_config(self.model), LAYOUTS[self.layout]
        if self.remat != "none" and cfg.decoder_layers:
            return "remat is the encoders' option (TrainConfig refuses it for a sequence-to-sequence task)"
        if layout.devices > jax.device_count():
            return f"not run ({jax.device_count()} devices here)"
        if cfg.num_attention_heads % layout.model_parallel:
            return f"{cfg.num_attention_heads} heads do not divide over {layout.model_parallel}"
        return None


def default_plan(batches=(16, 32)) -> list[Cell]:
    """The cells compiled by default, most telling first (compile time on a small shared CPU machine is the
    constraint; ``--grid full`` compiles every combination): data parallel over 8 and FSDP 8 at two batches (the
    goals, and the fit), one device, the model axis, bfloat16 with full remat, the encoder-decoders, and then the
    remaining layouts and dtypes."""
    one = batches[:1]
    return [
        Cell("bert-base", "replicated 8", batches=batches),
        Cell("bert-base", "fsdp 8", batches=batches),
        Cell("bert-base", "replicated 1", batches=one),
        Cell("bert-base", "model 2", batches=one),
        Cell("bert-base", "replicated 8", "bfloat16", "full", batches=batches),
        Cell("bert-base", "fsdp 8", "bfloat16", "full", batches=batches),
        Cell("bart-large", "replicated 8", batches=one),
        Cell("mbart-large", "replicated 8", batches=one),
        Cell("bert-base", "fsdp 4 x model 2", batches=one),
        Cell("bart-large", "fsdp 8", batches=one),
        Cell("bart-large", "model 8", batches=one),
        Cell("bert-base", "model 4", batches=one),
        Cell("bert-base", "model 8", batches=one),
        Cell("bert-base", "replicated 2", batches=one),
        Cell("bert-base", "replicated 4", batches=one),
        Cell("bert-base", "replicated 8", "bfloat16", batches=batches),
        Cell("bert-base", "replicated 8", remat="full", batches=batches),
        Cell("mbart-large", "fsdp 8", batches=one),
        Cell("bart-large", "replicated 8", "bfloat16", batches=one),
        Cell("mbart-large", "replicated 8", "bfloat16", batches=one),
    ]


def local_plan(num_devices: int, batches=(16, 32)) -> list[Cell]:
    """The cells for a machine of ``num_devices`` devices (what ``python -m experiments.accelerator`` compiles on
    the device it sees): every model, float32 and bfloat16 (BERT also with full remat), in each layout over the
    largest device count of :data:`LAYOUTS` that it has, at two batches (the fit for this device)."""
    count = max(layout.devices for layout in LAYOUTS.values() if layout.devices <= num_devices)
    return [
        Cell(model, layout.name, dtype, remat, tuple(batches))
        for model in MODELS
        for layout in LAYOUTS.values()
        if layout.devices == count
        for dtype in ("float32", "bfloat16")
        for remat in (("none", "full") if model == "bert-base" else ("none",))
    ]


def full_grid(models, layouts, dtypes, remats, batches) -> list[Cell]:
    """Every combination, each at every batch size."""
    return [Cell(m, n, d, r, tuple(batches)) for m in models for n in layouts for d in dtypes for r in remats]


def fit(small: dict, large: dict, device_bytes: int, data: int) -> int | None:
    """Largest global batch (a multiple of ``data``) with peak <= ``device_bytes``, from the peaks at two batch
    sizes extrapolated linearly; None when even ``data`` rows do not fit."""
    slope = (large["peak_bytes"] - small["peak_bytes"]) / (large["batch"] - small["batch"])
    intercept = small["peak_bytes"] - slope * small["batch"]
    if slope <= 0:
        return None
    batch = int((device_bytes - intercept) // slope) // data * data
    return batch if batch >= data else None


def _ratio(measured, minimum) -> float | None:
    return round(measured / minimum, 3) if minimum else None


def row(measured: dict, layout: Layout) -> dict:
    """A measured cell with its analytic minima and the ratios measured / analytic."""
    keys = ("dtype", "remat", "batch", "length", "params")
    ana = analytic(measured["model"], layout, **{k: measured[k] for k in keys})
    coll = sum(measured["collectives"].values())
    return {
        **measured,
        "analytic": ana,
        "collective_ratio": _ratio(coll, ana["collective_bytes"]),
        "state_ratio": _ratio(measured["state_bytes"], ana["state_bytes"]),
        "temp_ratio": _ratio(measured["temp_bytes"], ana["temp_bytes"]),
    }


def _mib(x) -> str:
    return f"{x / 2**20:,.1f}"


def tables(rows: list[dict], skipped: list[dict], fits: list[dict]) -> list[str]:
    headers = [
        "model",
        "layout",
        "dtype",
        "remat",
        "batch",
        "state MiB",
        "/ analytic",
        "temp MiB",
        "/ analytic",
        "peak MiB",
        "collective MiB",
        "/ analytic",
        "collectives by op (MiB)",
        "compile s",
    ]
    body = [
        [
            r["model"],
            r["layout"],
            r["dtype"],
            r["remat"],
            r["batch"],
            _mib(r["state_bytes"]),
            r["state_ratio"],
            _mib(r["temp_bytes"]),
            r["temp_ratio"],
            _mib(r["peak_bytes"]),
            _mib(sum(r["collectives"].values())),
            r["collective_ratio"],
            ", ".join(f"{k} {_mib(v)}" for k, v in r["collectives"].items() if v),
            r["compile_s"],
        ]
        for r in rows
    ]
    sections = ["## Per device, per step\n\n" + markdown_table(headers, body)]
    if skipped:
        sections.append(
            "## Not run\n\n"
            + markdown_table(
                ["model", "layout", "dtype", "remat", "why"],
                [[s["model"], s["layout"], s["dtype"], s["remat"], s["why"]] for s in skipped],
            )
        )
    if fits:
        sections.append(
            "## What fits where (largest global batch; linear in batch from two compiled sizes)\n\n"
            + markdown_table(
                ["model", "layout", "dtype", "remat", "peak MiB at batch", "MiB per row", *DEVICES_GIB],
                [
                    [
                        f["model"],
                        f["layout"],
                        f["dtype"],
                        f["remat"],
                        f"{_mib(f['peak_bytes'])} at {f['batch']}",
                        _mib(f["bytes_per_row"]),
                        *(f["fits"][d] if f["fits"][d] is not None else "no" for d in DEVICES_GIB),
                    ]
                    for f in fits
                ],
            )
        )
    return sections


def why_missed(r: dict) -> str:
    """What the compiled step's collectives do other than the analytic minimum, read from the ops' bytes in units
    of the float32 parameters (``4P``), with the reason the HLO shows (the ``Why`` of the goals)."""
    unit = 4 * r["params"]
    c = {k: v / unit for k, v in r["collectives"].items() if v}
    notes = ["by op, x 4P: " + ", ".join(f"{k} {v:.3f}" for k, v in c.items())]
    cfg = model_config(r["model"])
    if cfg.decoder_layers and LAYOUTS[r["layout"]].model_parallel == 1:
        tied = 4 * cfg.vocab_size * cfg.hidden_size
        extra = r["collectives"]["all-reduce"] - unit  # the gradient's all-reduce, data parallel and FSDP alike
        if extra > tied / 2:
            notes.append(
                f"the all-reduce exceeds the gradient by {extra / tied:.2f} x the tied embedding matrix (V x d): its "
                "gradient is all-reduced once per use (encoder input, decoder input, LM head), the three summed after"
            )
        else:
            notes.append(
                "the tied embedding matrix's gradient is all-reduced once (its three uses summed per data shard "
                "first, docs/design/tied-embeddings.md); final_logits_bias, a buffer, has no gradient"
            )
    batch_shaped = r["batch_shaped_collective_bytes"] / max(sum(r["collectives"].values()), 1)
    if batch_shaped > 0.05:
        notes.append(
            f"{batch_shaped:.0%} of the bytes are arrays of the batch's rows ([B, s, h] activations, masks): XLA's "
            "sharding propagation gathered the global batch's activations and all-reduced their partial sums, as "
            "model parallelism does, instead of gathering parameters (each device then computes every row; these "
            "bytes grow with the batch)"
        )
    elif LAYOUTS[r["layout"]].fsdp:
        if c.get("all-gather", 0) < 1.5:
            notes.append(
                "the parameters are all-gathered once: the backward reuses the forward's gathered copies (they stay "
                "in temporary memory) instead of gathering again"
            )
        if not c.get("reduce-scatter") and c.get("all-reduce", 0) > 0.5:
            notes.append(
                "the gradient is all-reduced whole and then sliced: XLA formed no reduce-scatter (the same "
                "whole-array bytes, twice a reduce-scatter's ring traffic)"
            )
        if LAYOUTS[r["layout"]].model_parallel == 1:
            ring = 2 * c.get("all-reduce", 0) + sum(v for k, v in c.items() if k != "all-reduce")
            notes.append(
                f"as ring traffic per device (an all-reduce sends 2 (N-1)/N of its array, the others (N-1)/N) the "
                f"step sends {ring / 3:.3f} x the analytic count's 3 (N-1)/N x 4P"
            )
    if not cfg.decoder_layers and not LAYOUTS[r["layout"]].fsdp and c.get("all-reduce", 0) < 1:
        notes.append("parameters without a gradient are not reduced (the pooler, unused with [CLS] pooling)")
    return "; ".join(notes)


def goals(rows: list[dict]) -> list[str]:
    """The issue's goals, per cell they apply to: collective bytes within 5 % of the analytic minimum (data parallel
    over more than one device, FSDP), and FSDP's per-device state within 5 % of total / N; a missed goal (or a
    collective total off the analytic one) says why (:func:`why_missed`)."""
    lines = []
    for r in rows:
        layout = LAYOUTS[r["layout"]]
        label = f"{r['model']} {r['layout']} {r['dtype']} remat {r['remat']} batch {r['batch']}"
        if layout.model_parallel == 1 and (layout.fsdp or layout.data > 1):
            met = abs(r["collective_ratio"] - 1) <= 0.05
            lines.append(
                f"- {label}: collectives {r['collective_ratio']} x analytic ({_mib(sum(r['collectives'].values()))} "
                f"of {_mib(r['analytic']['collective_bytes'])} MiB): {'met' if met else 'MISSED'}; {why_missed(r)}"
            )
        if layout.fsdp and layout.model_parallel == 1:
            total = 3 * 4 * r["params"] / layout.devices
            ratio = r["state_bytes"] / total
            lines.append(
                f"- {label}: state per device {ratio:.3f} x total/{layout.devices}: "
                + ("met" if abs(ratio - 1) <= 0.05 else "MISSED")
            )
    return lines


def run(plan: list[Cell], length: int, done=None, log=print, kept=None):
    """``(rows, skipped, fits)`` of the cells of ``plan``; ``done(rows, skipped, fits)`` after each cell (the table
    is written as it grows, so a run stopped early keeps what it compiled). ``kept``: an earlier run's JSON payload
    whose rows, fits and reasons are kept, and whose cells are not compiled again (a cell that failed is)."""
    kept = kept or {}
    rows, fits = list(kept.get("rows", [])), list(kept.get("fits", []))
    skipped = [s for s in kept.get("skipped", []) if not s["why"].startswith("FAILS")]
    have = {(r["model"], r["layout"], r["dtype"], r["remat"]) for r in rows + skipped}
    for cell in plan:
        label = {"model": cell.model, "layout": cell.layout, "dtype": cell.dtype, "remat": cell.remat}
        if tuple(label.values()) in have:
            continue
        why = cell.skip_reason()
        if why:
            skipped.append({**label, "why": why})
            continue
        layout = LAYOUTS[cell.layout]
        pair = []
        for batch in cell.batches:
            try:
                measured = measure(cell.model, layout, dtype=cell.dtype, remat=cell.remat, batch=batch, length=length)
            except Exception as e:  # noqa: BLE001 - a cell that does not build or compile is a row of the table
                skipped.append({**label, "why": f"FAILS at batch {batch}: {type(e).__name__}: {e}"[:300]})
                log(skipped[-1]["why"])
                break
            r = row(measured, layout)
            log(json.dumps({**label, "batch": batch, "compile_s": r["compile_s"]}))
            rows.append(r)
            pair.append(r)
        if len(pair) == 2:
            small, large = pair
            fits.append(
                {
                    **label,
                    "batch": large["batch"],
                    "peak_bytes": large["peak_bytes"],
                    "bytes_per_row": (large["peak_bytes"] - small["peak_bytes"]) / (large["batch"] - small["batch"]),
                    "fits": {d: fit(small, large, g * GIB, layout.data) for d, g in DEVICES_GIB.items()},
                }
            )
        if done is not None:
            done(rows, skipped, fits)
    return rows, skipped, fits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=("default", "full"), default="default", help="default: default_plan()")
    ap.add_argument("--models", default=",".join(MODELS), help="--grid full: the models")
    ap.add_argument("--layouts", default="all", help="--grid full: comma-separated names of LAYOUTS, or all")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="--grid full: the compute dtypes")
    ap.add_argument("--remat", default="none,full", help="--grid full: the remat policies")
    ap.add_argument("--batches", default="16,32", help="two global batch sizes (the fit extrapolates from them)")
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the cells of OUT/scale.json, compile the others")
    ap.add_argument(
        "--redo", default="", help="with --keep: comma-separated LAYOUTS whose kept cells are compiled again"
    )
    ap.add_argument(
        "--redo-models", default="", help="with --keep: comma-separated MODELS whose kept cells are compiled again"
    )
    args = ap.parse_args(argv)
    redo = [name for name in args.redo.split(",") if name]
    unknown = [name for name in redo if name not in LAYOUTS]
    if unknown or (redo and not args.keep):
        raise ValueError(f"--redo: names of LAYOUTS ({', '.join(LAYOUTS)}) with --keep, got {args.redo!r}")
    redo_models = [name for name in args.redo_models.split(",") if name]
    unknown = [name for name in redo_models if name not in MODELS]
    if unknown or (redo_models and not args.keep):
        raise ValueError(f"--redo-models: names of MODELS ({', '.join(MODELS)}) with --keep, got {args.redo_models!r}")
    batches = tuple(int(b) for b in args.batches.split(","))
    if len(batches) != 2 or batches[0] >= batches[1]:
        raise ValueError(f"--batches: two increasing batch sizes, got {args.batches!r}")
    if args.grid == "default":
        plan = default_plan(batches)
    else:
        models = args.models.split(",")
        names = list(LAYOUTS) if args.layouts == "all" else args.layouts.split(",")
        for given, known, what in ((models, MODELS, "--models"), (names, LAYOUTS, "--layouts")):
            unknown = [x for x in given if x not in known]
            if unknown:
                raise ValueError(f"{what}: unknown {unknown}; known: {', '.join(known)}")
        plan = full_grid(models, names, args.dtypes.split(","), args.remat.split(","), batches)
    prov = provenance("scale")

    def done(rows, skipped, fits):
        return write(
            rows,
            skipped,
            fits,
            plan=plan,
            length=args.length,
            prov=prov,
            directory=args.out,
        )

    kept = None
    if args.keep and os.path.exists(os.path.join(args.out, "scale.json")):
        with open(os.path.join(args.out, "scale.json")) as f:
            kept = json.load(f)
        if kept["length"] != args.length:
            raise ValueError(f"--keep: the kept table is at length {kept['length']}, not --length {args.length}")
        kept = {
            k: [c for c in kept[k] if c["layout"] not in redo and c["model"] not in redo_models]
            for k in ("rows", "skipped", "fits")
        }
    print(done(*run(plan, args.length, done=done, kept=kept)))


def write(rows, skipped, fits, *, plan, length, prov, directory=RESULTS, stem="scale") -> str:
    """``STEM.{md,json}`` in ``directory`` (the goals, the table, the cells not run and the fit); returns the .md
    path."""
    intro = (
        "The train step of `isojax finetune --method baseline` (dropout on, layers unrolled, AdamW) compiled for "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s) at sequence length {length}; only lowered and "
        f"compiled, never run ({sum(r['compile_s'] for r in rows):.0f} s of building and compiling, {len(rows)} "
        f"compiled steps of the "
        f"{sum(len(c.batches) for c in plan)} planned). Bytes per device; how each number is read and what the "
        "analytic minimum counts: the module docstring of `experiments/benchmarks/scale.py`. On CPU, XLA promotes bfloat16 "
        "collectives to float32 (the HLO converts around them)."
    )
    payload = {"length": length, "rows": rows, "skipped": skipped, "fits": fits, "goals": goals(rows)}
    sections = [intro, "## Goals\n\n" + "\n".join(payload["goals"]), *tables(rows, skipped, fits)]
    return write_result(stem, "Scale table from compiled train steps", sections, payload, prov, directory)


if __name__ == "__main__":
    main()
