"""What a fine-tuning run is: task, model, isotropy method, optimiser, placement, outputs and seed, as plain frozen
dataclasses checked on construction.

This module imports only the standard library, :mod:`isojax.train.methods` (the methods and regularisers, each
defined there once) and ``tyro.conf``'s annotations: reading or writing a configuration loads no JAX, model or
data. Every leaf has a dotted path (``optim.learning_rate``), the ``isojax finetune`` flag that sets it (tyro:
``--optim.learning-rate`` and the short alias ``--lr``) and its help (the docstring under the field). The objects
the settings describe (the objective's regularisers, optax schedules, the flow, the task's data) are built where
they are used.

Tasks: a GLUE task (:mod:`isojax.data.glue`; a classifier, :class:`~isojax.train.model.TaskModel`) or a
sequence-to-sequence task (:mod:`isojax.data.seq2seq`; an encoder-decoder, :mod:`isojax.train.tasks.seq2seq`), which
takes the methods of :data:`~isojax.train.methods.SEQ2SEQ_METHODS` and regularisers of the ``embedding`` or
``tokens`` representation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from typing import Annotated, Any, ClassVar, Literal

from tyro.conf import UseAppendAction, arg
from tyro.constructors import PrimitiveConstructorSpec

from isojax.train.methods import (
    ISOTROPY_LAYER_TERM,
    METHOD_ALIASES,
    METHODS,
    SEQ2SEQ_METHODS,
    SEQ2SEQ_REPRESENTATIONS,
    Method,
    RegularizerSpec,
    check_number_or_schedule,
    is_schedule_text,
    method,
)

GLUE_TASK_NAMES = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
"""The keys of :data:`isojax.data.glue.GLUE_TASKS` (a test keeps the copies here equal to their modules')."""
SEQ2SEQ_TASK_NAMES = ("wmt16_en_ro", "wmt16_de_en", "cnn_dailymail", "seq2seq")
"""The keys of :data:`isojax.data.seq2seq.SEQ2SEQ_TASKS`."""
DEFAULT_BUCKETS = (32, 64, 128, 256, 512)
""":data:`isojax.data.batching.DEFAULT_BUCKETS`."""
Pooling = Literal["cls", "last", "pooler", "mean", "first_last_avg", "last2avg"]
""":data:`isojax.models.heads.POOLINGS`."""
Placement = Literal["output", "block"]
""":data:`isojax.models.encoder.TRANSFORM_PLACEMENTS`."""
Remat = Literal["none", "full", "dots"]
"""``"none"`` and the keys of :data:`isojax.models.stack.REMAT_POLICIES`."""
Combination = Literal["sum", "balanced", "weighted"]
Schedule = Literal["linear", "cosine", "constant"]
Parallel = Literal["mesh", "pmap"]
POOLINGS, TRANSFORM_PLACEMENTS, REMATS = typing.get_args(Pooling), typing.get_args(Placement), typing.get_args(Remat)
DTYPES = ("float32", "bfloat16")
COMBINATIONS = typing.get_args(Combination)
"""How the task loss and the regularisers join (:class:`isojax.train.objective.Objective`)."""
SCHEDULES = typing.get_args(Schedule)
"""Learning-rate schedules after the warm-up (:func:`isojax.train.optim.make_optimizer`)."""
PARALLEL_MODES = typing.get_args(Parallel)
FSDP_NEEDS_MESH = "fsdp=True needs parallel='mesh' (pmap keeps a whole copy of the state on every device)"

MethodName = Literal[
    "baseline",
    "softdecay",
    "cosine",
    "spectrum_pol",
    "spectrum_exp",
    "isoscore",
    "istar",
    "persistent_entropy",
    "persistent_entropy_all",
    "isobn",
    "isotropy_layer",
    "flow",
    "none",
]
"""The keys of :data:`~isojax.train.methods.METHODS` and their aliases."""

_REGULARIZER_TEXT = PrimitiveConstructorSpec(
    nargs=1,
    metavar="SPEC",
    instance_from_str=lambda args: RegularizerSpec.parse(args[0]),
    is_instance=lambda value: isinstance(value, RegularizerSpec),
    str_from_instance=lambda spec: [spec.text],
)


def flag(alias: str, **options: Any) -> Any:
    """The ``tyro.conf.arg`` of a setting: its short ``isojax finetune`` flag beside the dotted one."""
    return arg(aliases=(alias,), **options)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a run (:meth:`TrainConfig.stages`).

    Attributes:
      name: ``"finetune"`` or ``"isotropy_layer"``.
      frozen: the top-level parameter groups it does not train.
      regularizers: its objective's regularisers.
      combine: how they join the task loss (``"sum"``, ``"balanced"``, ``"weighted"``).
      epochs: its length in epochs over the training set, unless ``steps`` is given.
      steps: its length in batches, or None.
    """

    name: str
    frozen: tuple[str, ...]
    regularizers: tuple[RegularizerSpec, ...]
    combine: str
    epochs: float
    steps: int | None


class Section:
    """A part of :class:`TrainConfig`: each field's value is checked against its type on construction (text is
    not converted here: the command line is parsed by tyro, JSON gives typed values), then :meth:`check` checks
    the section's own rules."""

    SECTION: ClassVar[str]

    def __post_init__(self):
        hints = _hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, _typed(self.label(f.name), getattr(self, f.name), hints[f.name]))
        self.check()

    def check(self) -> None:
        """The section's rules beyond each field's type."""

    @classmethod
    def label(cls, name: str) -> str:
        """How errors name a field: ``optim.learning_rate (--lr)``."""
        hint = _hints(cls)[name]
        aliases = [a for m in getattr(hint, "__metadata__", ()) for a in (getattr(m, "aliases", None) or ())]
        path = f"{cls.SECTION}.{name}" if cls.SECTION else name
        return f"{path} ({aliases[0]})" if aliases else path

    def _at_least(self, low: int, *names: str) -> None:
        """Each of ``names`` (None allowed) at least ``low``: 0 (non-negative) or 1 (a positive integer)."""
        for name in names:
            value = getattr(self, name)
            if value is not None and value < low:
                kind = "a positive integer" if low == 1 else "non-negative"
                raise ValueError(f"{self.label(name)} must be {kind}, got {value!r}")

    def _positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.label(name)} must be a positive number, got {getattr(self, name)!r}")

    def _within(self, name: str, low: float, high: float, closed: str = "[)") -> None:
        value = getattr(self, name)
        low_ok = value >= low if closed[0] == "[" else value > low
        high_ok = value <= high if closed[1] == "]" else value < high
        if not (low_ok and high_ok):
            raise ValueError(f"{self.label(name)} must be in {closed[0]}{low:g}, {high:g}{closed[1]}, got {value!r}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def _typed(label: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the type ``hint`` (and normalised: an int for a float is a float, a list for a
    tuple a tuple, a path a string); ``TypeError`` / ``ValueError`` naming ``label``."""
    hint = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{label} must be one of {list(args)}, got {value!r}")
        return value
    if hint == float | str:
        return check_number_or_schedule(value, label)
    if origin in (typing.Union, type(int | None)) and type(None) in args:
        return None if value is None else _typed(label, value, next(a for a in args if a is not type(None)))
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise TypeError(f"{label} must be a list, got {value!r}")
        return tuple(_typed(label, v, args[0]) for v in value)
    if hint is RegularizerSpec:
        try:
            spec = RegularizerSpec.from_json(value)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{label}: {e}") from None
        if type(spec) is not RegularizerSpec:
            raise TypeError(
                f"{label} must hold RegularizerSpec settings (an objective's Regularizer is built from them), got "
                f"{type(spec).__name__}"
            )
        return spec
    if hint is str:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(value, str):
            raise TypeError(f"{label} must be a string, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{label} must be true or false, got {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (hint is int and value != int(value)):
            raise TypeError(f"{label} must be {'an integer' if hint is int else 'a number'}, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{label} must be finite, got {value!r}")
        return hint(value)
    return value


def _task_name(task: str) -> str:
    """The canonical name of a GLUE or sequence-to-sequence task (case, dashes and underscores as
    :func:`isojax.data.glue.glue_task` and :func:`isojax.data.seq2seq.seq2seq_task` read them); ``ValueError``
    listing both kinds."""
    glue = str(task).lower().replace("-", "").replace("_", "")
    if glue in GLUE_TASK_NAMES:
        return glue
    seq2seq = str(task).lower().replace("-", "_")
    if seq2seq in SEQ2SEQ_TASK_NAMES:
        return seq2seq
    raise ValueError(
        f"task: unknown GLUE task {task!r}; expected one of {sorted(GLUE_TASK_NAMES)}; or a sequence-to-sequence "
        f"task: {sorted(SEQ2SEQ_TASK_NAMES)}"
    )


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
    """The task and its data."""

    SECTION: ClassVar[str] = "task"
    name: Annotated[str, flag("--task")] = "stsb"
    """GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli) or sequence-to-sequence task (an
    encoder-decoder model: wmt16_en_ro, wmt16_de_en, cnn_dailymail, seq2seq)"""
    max_length: Annotated[int, flag("--max-length")] = 128
    """tokens per example, at most the model's positions (sequence-to-sequence: of the source)"""
    buckets: Annotated[tuple[int, ...], flag("--buckets")] = DEFAULT_BUCKETS
    """batch widths in tokens: each batch is cut to the smallest that holds its longest row (capped at
    --max-length); finer buckets pad short texts less and compile more batch shapes"""
    train_limit: Annotated[int, flag("--train-limit")] = 0
    """use the first N training rows (0 = all)"""
    eval_limit: Annotated[int, flag("--eval-limit")] = 0
    """evaluate on the first N >= 2 dev rows (0 = all)"""
    data_source: Annotated[str, flag("--data-source")] = "auto"
    """GLUE source: auto (--data-dir, else $ISOJAX_DATA_DIR, else the Hub; STS-B falls back to the offline
    package), hub, package, or a local directory/file in the Hub's layout; sequence-to-sequence: auto (the Hub) or
    a local directory/file (task seq2seq: columns source, target)"""
    data_dir: Annotated[str | None, flag("--data-dir")] = None
    """directory of the original data releases: sts/STS12..STS16, sick/, glue/<Task>/ (default $ISOJAX_DATA_DIR;
    without either, the Hugging Face Hub)"""

    def check(self) -> None:
        try:
            object.__setattr__(self, "name", _task_name(self.name))
        except ValueError as e:
            raise ValueError(f"{self.label('name')}: {str(e).removeprefix('task: ')}") from None
        if self.data_dir is not None and self.data_source != "auto":
            raise ValueError(
                f"{self.label('data_dir')} is read with {self.label('data_source')} 'auto', got "
                f"{self.data_source!r}; pass one of the two"
            )
        self._at_least(1, "max_length")
        if not self.buckets:
            raise ValueError(f"{self.label('buckets')} must be one or more positive integers, got ()")
        if min(self.buckets) < 1:
            raise ValueError(f"{self.label('buckets')} must be positive integers, got {self.buckets!r}")
        object.__setattr__(self, "buckets", tuple(sorted(set(self.buckets))))
        self._at_least(0, "train_limit", "eval_limit")
        if self.eval_limit == 1:  # else the first evaluation, after training, fails in IsoScore / the correlations
            raise ValueError(
                f"{self.label('eval_limit')} must be 0 (all rows) or at least 2: the dev isotropy measures and "
                "correlations need two rows, got 1"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The pretrained model and how it runs."""

    SECTION: ClassVar[str] = "model"
    name: Annotated[str, flag("--model")] = "default"
    """model directory, Hub id, or 'default' (all-MiniLM-L6-v2)"""
    pooling: Annotated[Pooling, flag("--pooling")] = "cls"
    """sentence representation fed to the head"""
    dtype: Annotated[Literal["float32", "bfloat16"], flag("--dtype")] = "float32"
    """compute dtype"""
    scan_layers: Annotated[bool, flag("--scan-layers")] = False
    """run the encoder's blocks as one nn.scan loop (compile time flat in depth)"""
    remat: Annotated[Remat, flag("--remat")] = "none"
    """recompute each block's forward in the backward pass (encoders only)"""
    dropout: Annotated[bool, flag("--dropout")] = True
    """dropout (--no-dropout: off)"""


@dataclasses.dataclass(frozen=True)
class MethodConfig(Section):
    """The isotropy method, extra regularisers and how they join the task loss."""

    SECTION: ClassVar[str] = "method"
    name: Annotated[MethodName, flag("--method")] = "baseline"
    """isotropy method (listed in --help's epilogue)"""
    regularizers: Annotated[
        tuple[Annotated[RegularizerSpec, _REGULARIZER_TEXT], ...], flag("--reg"), UseAppendAction
    ] = ()
    """extra regulariser NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...], repeatable (added to --config's);
    WEIGHT and float VALUEs are numbers or schedules of the step, e.g. istar=linear:0:1:500@cls"""
    combine: Annotated[Combination, flag("--combine")] = "sum"
    """task loss + regularisers: sum, balanced (moving-average balancer), weighted (alpha L1 + (1-alpha) L2);
    isotropy_layer's second stage is balanced unless 'weighted'"""
    joint_alpha: Annotated[float | str, flag("--joint-alpha")] = 0.5
    """alpha of --combine weighted, in [0, 1]: a number or a schedule of the step"""
    balancer_smoothing: Annotated[float | str, flag("--balancer-smoothing")] = 0.15
    """smoothing of --combine balanced's moving averages, in (0, 1]: a number or a schedule of the step"""
    softdecay_alpha: Annotated[float, flag("--softdecay-alpha")] = -0.2
    """initial SoftDecay alpha in (-1, 0)"""
    softdecay_placement: Annotated[Placement, flag("--softdecay-placement")] = "output"
    """SoftDecay on the last layer's output (the paper) or inside the last block before its LayerNorm with the
    residual added twice (the authors' code)"""

    def check(self) -> None:
        if not is_schedule_text(self.joint_alpha):
            self._within("joint_alpha", 0, 1, closed="[]")
        if not is_schedule_text(self.balancer_smoothing):
            self._within("balancer_smoothing", 0, 1, closed="(]")
        self._within("softdecay_alpha", -1, 0, closed="()")
        if self.combine != "sum" and not (self.regularizers or self.spec.regularizers or self.spec.isotropy_layer):
            raise ValueError(f"{self.label('combine')} {self.combine!r} needs at least one regulariser")

    @property
    def spec(self) -> Method:
        return method(self.name)


@dataclasses.dataclass(frozen=True)
class OptimConfig(Section):
    """Optimiser, batches and lengths: ``steps`` (batches) when given, else ``epochs`` over the training set; with
    ``grad_accumulation`` k a step is one batch and the optimiser updates every k steps; ``stage2_*`` size the
    Isotropy Layer stage."""

    SECTION: ClassVar[str] = "optim"
    learning_rate: Annotated[float, flag("--lr")] = 2e-5
    """peak learning rate"""
    transform_learning_rate: Annotated[float, flag("--transform-lr")] = 1e-3
    """learning rate of SoftDecay alpha, the Isotropy Layer and the flow (constant for the flow)"""
    weight_decay: Annotated[float, flag("--weight-decay")] = 0.01
    """AdamW weight decay"""
    warmup_ratio: Annotated[float, flag("--warmup-ratio")] = 0.1
    """fraction of the updates warming up, in [0, 1)"""
    schedule: Annotated[Schedule, flag("--schedule")] = "linear"
    """learning-rate schedule after the warm-up"""
    max_grad_norm: Annotated[float, flag("--max-grad-norm")] = 1.0
    """clip (0 = off)"""
    grad_accumulation: Annotated[int, flag("--grad-accumulation")] = 1
    """batches per update"""
    batch_size: Annotated[int, flag("--batch-size")] = 32
    """global batch"""
    eval_batch_size: Annotated[int, flag("--eval-batch-size")] = 64
    """global batch of the evaluation"""
    epochs: Annotated[float, flag("--epochs")] = 3.0
    """training epochs"""
    steps: Annotated[int | None, flag("--steps")] = None
    """train this many batches instead of --epochs"""
    stage2_epochs: Annotated[float, flag("--stage2-epochs")] = 1.0
    """Isotropy Layer stage length"""
    stage2_steps: Annotated[int | None, flag("--stage2-steps")] = None
    """Isotropy Layer stage length in batches"""

    def check(self) -> None:
        self._at_least(1, "grad_accumulation", "batch_size", "eval_batch_size", "steps", "stage2_steps")
        self._positive("learning_rate", "transform_learning_rate", "epochs", "stage2_epochs")
        self._at_least(0, "weight_decay", "max_grad_norm")
        self._within("warmup_ratio", 0, 1)


@dataclasses.dataclass(frozen=True)
class PlacementConfig(Section):
    """Devices and parallelism (the same run can be repeated on 1 or N devices, under the mesh or pmap)."""

    SECTION: ClassVar[str] = "placement"
    devices: Annotated[int | None, flag("--devices")] = None
    """use the first N devices (default all)"""
    parallel: Annotated[Parallel, flag("--parallel")] = "mesh"
    """jit on a mesh, or pmap"""
    model_parallel: Annotated[int, flag("--model-parallel")] = 1
    """size of the mesh's model axis"""
    fsdp: Annotated[bool, flag("--fsdp")] = False
    """FSDP: split the parameters and Adam moments over the mesh's data axis (parallel mesh only)"""

    def check(self) -> None:
        self._at_least(1, "devices", "model_parallel")
        if self.parallel == "pmap" and self.model_parallel != 1:
            raise ValueError(
                f"{self.label('model_parallel')} > 1 needs parallel='mesh' (pmap is data-parallel only), got "
                f"{self.model_parallel}"
            )
        if self.fsdp and self.parallel == "pmap":
            raise ValueError(f"{self.label('fsdp')}: {FSDP_NEEDS_MESH}")


@dataclasses.dataclass(frozen=True)
class LoggingConfig(Section):
    """Outputs: ``save_every``/``eval_every``/``log_every`` count steps (0 = only at the end of each stage); a step
    with a non-finite loss or gradient is skipped and ``max_nonfinite_steps`` of them in a row stop the run."""

    SECTION: ClassVar[str] = "logging"
    output_dir: Annotated[str, flag("--out")] = "runs/finetune"
    """output directory"""
    save_every: Annotated[int, flag("--save-every")] = 0
    """checkpoint every N steps (0 = stage ends)"""
    keep_checkpoints: Annotated[int, flag("--keep-checkpoints")] = 3
    """checkpoints kept"""
    eval_every: Annotated[int, flag("--eval-every")] = 0
    """evaluate every N steps (0 = stage ends)"""
    log_every: Annotated[int, flag("--log-every")] = 10
    """log the train records every N steps (and at stage ends)"""
    log_gradients: Annotated[bool, flag("--log-gradients")] = False
    """log per-layer gradient norms and the word-embedding gradient's alignment with the mean embedding direction
    (common enemies) every --log-every steps, with a curve in curves.png"""
    max_nonfinite_steps: Annotated[int, flag("--max-nonfinite-steps")] = 10
    """stop after this many steps in a row with a non-finite loss or gradient (each is skipped); rerunning resumes
    from the last good checkpoint"""
    progress: Annotated[bool, flag("--progress")] = True
    """progress bar (--no-progress: none)"""
    accept_changed_data: Annotated[bool, flag("--accept-changed-data")] = False
    """resume although the training or evaluation rows differ from those the checkpoints were written with"""
    export: Annotated[str | None, flag("--export")] = None
    """at the end, also write the trained model as a Hugging Face folder to this directory (isojax export)"""

    def check(self) -> None:
        self._at_least(1, "keep_checkpoints", "max_nonfinite_steps")
        self._at_least(0, "save_every", "eval_every", "log_every")
        if self.log_gradients and not self.log_every:
            raise ValueError(
                f"{self.label('log_gradients')} needs {self.label('log_every')} > 0 (the statistics go into the "
                "logged train records)"
            )


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig(Section):
    """Sequence-to-sequence tasks: target length, label smoothing of the token cross-entropy, and the decoding of
    the dev set (``num_beams`` 1 = greedy; ``generation_max_length`` counts the decoder start token, default
    ``max_target_length`` + 1). Unused by GLUE tasks."""

    SECTION: ClassVar[str] = "seq2seq"
    max_target_length: Annotated[int, flag("--max-target-length")] = 128
    """target tokens per example"""
    label_smoothing: Annotated[float, flag("--label-smoothing")] = 0.1
    """label smoothing of the token cross-entropy"""
    num_beams: Annotated[int, flag("--num-beams")] = 1
    """beams of the dev decoding (1 = greedy)"""
    length_penalty: Annotated[float, flag("--length-penalty")] = 1.0
    """beam search length penalty"""
    generation_max_length: Annotated[int | None, flag("--generation-max-length")] = None
    """longest decoded sequence, start token included (default max-target-length + 1)"""

    def check(self) -> None:
        self._at_least(1, "max_target_length", "num_beams", "generation_max_length")
        self._within("label_smoothing", 0, 1)


@dataclasses.dataclass(frozen=True)
class FlowConfig(Section):
    """The flow of method ``flow``: a Glow of ``levels`` x ``depth`` steps with couplings ``hidden`` wide
    (BERT-flow's 3, 3, 32), its ActNorm started from the pretrained model's representations of the first
    ``init_batches`` training batches. Unused by other methods."""

    SECTION: ClassVar[str] = "flow"
    levels: Annotated[int, flag("--flow-levels")] = 3
    """Glow levels"""
    depth: Annotated[int, flag("--flow-depth")] = 3
    """steps per level"""
    hidden: Annotated[int, flag("--flow-hidden")] = 32
    """coupling network width"""
    init_batches: Annotated[int, flag("--flow-init-batches")] = 1
    """training batches whose pretrained representations start the flow's ActNorm"""

    def check(self) -> None:
        self._at_least(1, "levels", "depth", "hidden", "init_batches")


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """A fine-tuning run: its sections and the ``seed``.

    ``to_json`` / ``from_json`` round-trip; :meth:`override` takes dotted paths::

        TrainConfig(task=TaskConfig("rte"), optim=OptimConfig(learning_rate=3e-5, steps=100))
        TrainConfig().override({"task.name": "rte", "optim.learning_rate": 3e-5})

    Attributes:
      task: the :class:`TaskConfig`.
      model: the :class:`ModelConfig`.
      method: the :class:`MethodConfig`.
      optim: the :class:`OptimConfig`.
      placement: the :class:`PlacementConfig`.
      logging: the :class:`LoggingConfig`.
      seq2seq: the :class:`Seq2SeqConfig` (read by sequence-to-sequence tasks).
      flow: the :class:`FlowConfig` (read by method ``flow``).
      seed: the seed of the initialisation, dropout and batch order (``--seed``).

    Examples:
      The two forms above give the same run (the task's name read in any case):

      >>> a = TrainConfig(task=TaskConfig("RTE"), optim=OptimConfig(learning_rate=3e-5))
      >>> b = TrainConfig().override({"task.name": "rte", "optim.learning_rate": 3e-5})
      >>> a == b, a.task.name, a.optim.steps
      (True, 'rte', None)
      >>> TrainConfig.from_json(a.to_json()) == a
      True
      >>> TrainConfig().override({"optim.lr": 1e-3})
      Traceback (most recent call last):
      ValueError: unknown setting 'optim.lr'; the settings of optim are [...]
    """

    SECTION: ClassVar[str] = ""
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    optim: OptimConfig = OptimConfig()
    placement: PlacementConfig = PlacementConfig()
    logging: LoggingConfig = LoggingConfig()
    seq2seq: Seq2SeqConfig = Seq2SeqConfig()
    flow: FlowConfig = FlowConfig()
    seed: int = 0
    """seed of the initialisation, dropout and batch order"""

    def check(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"TrainConfig.{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}"
                )
        self._at_least(0, "seed")
        if self.is_seq2seq:
            self._check_seq2seq()

    def _check_seq2seq(self) -> None:
        task = self.task.name
        if METHOD_ALIASES.get(self.method.name, self.method.name) not in SEQ2SEQ_METHODS:
            raise ValueError(
                f"{MethodConfig.label('name')} {self.method.name!r} does not apply to the sequence-to-sequence "
                f"task {task}; expected one of {list(SEQ2SEQ_METHODS)}"
            )
        if self.model.scan_layers or self.model.remat != "none":
            raise ValueError(
                f"model.scan_layers and model.remat (--scan-layers, --remat) are for encoders; the "
                f"sequence-to-sequence task {task} runs its encoder-decoder unrolled"
            )
        for reg in self.method_spec.regularizers + self.method.regularizers:
            if reg.representation not in SEQ2SEQ_REPRESENTATIONS:
                raise ValueError(
                    f"regulariser {reg.label}: a sequence-to-sequence model has the representations "
                    f"{list(SEQ2SEQ_REPRESENTATIONS)}, not {reg.representation!r}"
                )
            if reg.needs_reference:
                raise ValueError(f"regulariser {reg.label}: c0='data' is for classification tasks; use c0=identity")
        if self.task.data_dir is not None:
            raise ValueError(
                f"{TaskConfig.label('data_dir')} holds GLUE/STS releases; the sequence-to-sequence task {task} "
                "reads task.data_source (the Hub, or a local file or directory)"
            )

    @property
    def method_spec(self) -> Method:
        return self.method.spec

    @property
    def is_seq2seq(self) -> bool:
        """Whether the task is a sequence-to-sequence task (else a GLUE task)."""
        return self.task.name in SEQ2SEQ_TASK_NAMES

    def stages(self) -> tuple[Stage, ...]:
        """The run's stages: fine-tuning (``method.combine`` joins its task loss and regularisers), then, for
        isotropy_layer, the Isotropy Layer stage (combined ``"balanced"`` unless ``"weighted"`` is asked for; the
        fine-tuning stage then sums)."""
        spec, combine, optim = self.method_spec, self.method.combine, self.optim
        regs = spec.regularizers + self.method.regularizers
        if not spec.isotropy_layer:
            return (Stage("finetune", (), regs, combine, optim.epochs, optim.steps),)
        joint = "balanced" if combine == "sum" else combine
        return (
            Stage("finetune", ("isotropy_layer",), regs, "sum", optim.epochs, optim.steps),
            Stage(
                "isotropy_layer",
                ("encoder", "head"),
                (ISOTROPY_LAYER_TERM,),
                joint,
                optim.stage2_epochs,
                optim.stage2_steps,
            ),
        )

    def to_json(self) -> dict:
        """A JSON-ready nested dict: a key per section and ``seed`` (regularisers as their fields' dicts, schedules
        as their text)."""
        out: dict[str, Any] = {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}
        return {**out, "seed": self.seed}

    def flat_json(self) -> dict[str, Any]:
        """:meth:`to_json` keyed by dotted path (``{"optim.learning_rate": 2e-05, ...}``)."""
        return {f"{s}.{k}": v for s, values in self.to_json().items() if s != "seed" for k, v in values.items()} | {
            "seed": self.seed
        }

    @classmethod
    def from_json(cls, data: dict, overrides: dict | None = None) -> TrainConfig:
        """The configuration of a :meth:`to_json` dict (a section written as null is its defaults), with dotted
        ``overrides`` (``{"optim.learning_rate": 3e-5}``). ``ValueError`` naming an unknown key, and for a flat dict
        without sections naming each key's dotted spelling (``learning_rate -> optim.learning_rate``)."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object of settings, got {type(data).__name__}")
        if not isinstance(data.get("task", {}), dict):
            raise ValueError(_flat_refusal(data))
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in _SECTIONS and value is not None:
                if not isinstance(value, dict):
                    raise ValueError(f"{key}: expected an object of settings, got {value!r}")
                values.update({f"{key}.{name}": leaf for name, leaf in value.items()})
            elif key not in _SECTIONS:
                values[key] = value
        values.update(overrides or {})
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        top: dict[str, Any] = {}
        for path, value in values.items():
            section, dot, name = path.partition(".")
            if dot and section in _SECTIONS and name in _FIELDS[section]:
                sections[section][name] = value
            elif not dot and path in _FIELDS[""]:
                top[path] = value
            elif dot and section in _SECTIONS:
                raise ValueError(f"unknown setting {path!r}; the settings of {section} are {sorted(_FIELDS[section])}")
            else:
                raise ValueError(f"unknown setting {path!r}; the sections are {sorted(_SECTIONS)} and 'seed'")
        return cls(**{name: _SECTIONS[name](**fields) for name, fields in sections.items()}, **top)

    def override(self, overrides: dict) -> TrainConfig:
        """A copy with dotted ``overrides`` (:meth:`from_json`)."""
        return TrainConfig.from_json(self.to_json(), overrides)


_SECTIONS: dict[str, type] = {
    "task": TaskConfig,
    "model": ModelConfig,
    "method": MethodConfig,
    "optim": OptimConfig,
    "placement": PlacementConfig,
    "logging": LoggingConfig,
    "seq2seq": Seq2SeqConfig,
    "flow": FlowConfig,
}
_FIELDS = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()} | {"": {"seed"}}
RESUMABLE = frozenset(
    {
        "task.eval_limit",
        "optim.eval_batch_size",
        *(f"placement.{f}" for f in _FIELDS["placement"]),
        *(f"logging.{f}" for f in _FIELDS["logging"]),
        "seq2seq.num_beams",
        "seq2seq.length_penalty",
        "seq2seq.generation_max_length",
    }
)
"""The dotted paths that may differ when a run is resumed (where and how it runs, how often it reports, how it is
evaluated)."""


def _flat_refusal(data: dict) -> str:
    """The error for a flat configuration: each of its keys with the dotted path it is spelled as."""
    short = {"task": "task.name", "model": "model.name", "method": "method.name"}
    by_name = {name: f"{s}.{name}" for s, names in _FIELDS.items() if s for name in names}
    by_name |= {f"flow_{name}": f"flow.{name}" for name in _FIELDS["flow"]} | short | {"seed": "seed"}
    spelled = ", ".join(f"{k} -> {by_name.get(k, '(no such setting)')}" for k in data)
    return (
        "a flat configuration (without sections) is not read; write each setting in its section, as "
        f"TrainConfig.to_json() does ('optim': {{'learning_rate': ...}}): {spelled}"
    )


__all__ = [
    "COMBINATIONS",
    "METHODS",
    "PARALLEL_MODES",
    "RESUMABLE",
    "SCHEDULES",
    "FlowConfig",
    "LoggingConfig",
    "MethodConfig",
    "ModelConfig",
    "OptimConfig",
    "PlacementConfig",
    "Seq2SeqConfig",
    "Stage",
    "TaskConfig",
    "TrainConfig",
]
