"""What a fine-tuning run is: task, model, isotropy method, hyperparameters, devices. Checked on construction.

Each section is a frozen dataclass checked on construction; this module imports only the standard library and
:mod:`isojax.train.methods` (the methods and regularisers, defined there once), so reading or writing a
configuration loads no JAX, model or data.

Tasks: a GLUE task (:mod:`isojax.data.glue`; a classifier, :class:`~isojax.train.model.TaskModel`) or a
sequence-to-sequence task (:mod:`isojax.data.seq2seq`; an encoder-decoder, :mod:`isojax.train.tasks.seq2seq`), which
takes the methods of :data:`SEQ2SEQ_METHODS` and regularisers of the ``embedding`` or ``tokens`` representation.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import typing
from typing import Any, ClassVar

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
"""The keys of :data:`isojax.data.glue.GLUE_TASKS` (a test keeps the two equal)."""
SEQ2SEQ_TASK_NAMES = ("wmt16_en_ro", "wmt16_de_en", "cnn_dailymail", "seq2seq")
"""The keys of :data:`isojax.data.seq2seq.SEQ2SEQ_TASKS`."""
POOLINGS = ("cls", "last", "pooler", "mean", "first_last_avg", "last2avg")
""":data:`isojax.models.heads.POOLINGS`."""
TRANSFORM_PLACEMENTS = ("output", "block")
""":data:`isojax.models.encoder.TRANSFORM_PLACEMENTS`."""
DEFAULT_BUCKETS = (32, 64, 128, 256, 512)
""":data:`isojax.data.batching.DEFAULT_BUCKETS`."""
DTYPES = ("float32", "bfloat16")
REMATS = ("none", "full", "dots")
"""``"none"`` and the keys of :data:`isojax.models.stack.REMAT_POLICIES`."""
COMBINATIONS = ("sum", "balanced", "weighted")
"""How the task loss and the regularisers join (:class:`isojax.train.objective.Objective`)."""
SCHEDULES = ("linear", "cosine", "constant")
"""Learning-rate schedules after the warm-up (:func:`isojax.train.optim.make_optimizer`)."""
PARALLEL_MODES = ("mesh", "pmap")
FSDP_NEEDS_MESH = "fsdp=True needs parallel='mesh' (pmap keeps a whole copy of the state on every device)"
DATA_DIR_HELP = (
    "directory of the original data releases: sts/STS12..STS16, sick/, glue/<Task>/ (default $ISOJAX_DATA_DIR; "
    "without either, the Hugging Face Hub)"
)


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


def setting(default: Any = None, flag: str | None = None, help: str = "", **meta: Any) -> Any:
    """A configuration field: its default, its ``isojax finetune`` flag and help, and in ``meta`` its other
    properties.

    Args:
      default: the field's default.
      flag: its ``isojax finetune`` flag (``"--lr"``), or None.
      help: its help text.
      **meta: ``choices`` (taken from the module constants), ``resumable=True`` when it may change when a run is
        resumed, ``flat`` its name in the flat configurations written before the sections (default: the field's
        name; the refusal of such a configuration names each key's dotted path), ``factory`` for a default built per instance, ``metavar`` for the command line.

    Returns:
      A ``dataclasses.Field`` whose ``metadata`` holds ``flag``, ``help``, ``choices`` and ``meta``.

    Examples:
      >>> field = setting(3, "--levels", "Glow levels", flat="flow_levels")
      >>> field.default, field.metadata["flag"], field.metadata["flat"], field.metadata["choices"]
      (3, '--levels', 'flow_levels', ())
    """
    metadata = {"flag": flag, "help": help, "choices": tuple(meta.get("choices", ())), **meta}
    if "factory" in meta:
        return dataclasses.field(default_factory=meta["factory"], metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One leaf of :class:`TrainConfig`: its dotted ``path`` (``"optim.learning_rate"``), its section's class and
    field, and the field's type hint.

    Attributes:
      path: the dotted path.
      section: the section's class (:class:`TrainConfig` for ``seed``).
      field: the dataclass field (its ``metadata`` from :func:`setting`).
      kind: the field's type hint, which :meth:`parse` converts text to.
    """

    path: str
    section: type
    field: dataclasses.Field
    kind: Any

    @property
    def flag(self) -> str:
        return self.field.metadata["flag"]

    @property
    def label(self) -> str:
        """How errors name it: ``optim.learning_rate (--lr)``."""
        return f"{self.path} ({self.flag})"

    @property
    def resumable(self) -> bool:
        return self.field.metadata.get("resumable", False)

    @property
    def flat(self) -> str:
        return self.field.metadata.get("flat", self.field.name)

    def parse(self, value: Any) -> Any:
        """``value`` as the field's type: text (a command line, a dotted override) is converted; ``ValueError``
        naming the setting when it cannot be."""
        if self.field.name == "regularizers":
            items = [value] if isinstance(value, (str, RegularizerSpec, dict)) else list(value)
            try:
                return tuple(RegularizerSpec.from_json(item) for item in items)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{self.label}: {e}") from None
        if self.kind == tuple[int, ...]:
            widths = value.split(",") if isinstance(value, str) else value
            if not isinstance(widths, (list, tuple)):
                raise ValueError(f"{self.label} must be comma-separated integers or a list of them, got {value!r}")
            try:
                return tuple(int(v) if isinstance(v, str) else v for v in widths)
            except ValueError:
                raise ValueError(f"{self.label} must be comma-separated integers, got {value!r}") from None
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, str) or self.kind in (str, Any, float | str):
            return value
        text = value.strip()
        if self.kind == int | None and text.lower() in ("none", "null"):
            return None
        if self.kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"{self.label} must be true or false, got {value!r}")
            return text.lower() == "true"
        cast = float if self.kind is float else int
        try:
            return cast(text)
        except ValueError:
            raise ValueError(
                f"{self.label} must be {'a number' if cast is float else 'an integer'}, got {value!r}"
            ) from None


class Section:
    """A part of :class:`TrainConfig`. Checks its fields on construction.

    Attributes:
      SECTION: its field name in :class:`TrainConfig` (a class attribute).
    """

    SECTION: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field]]  # every section is a dataclass

    @classmethod
    def label(cls, name: str) -> str:
        return setting_of(f"{cls.SECTION}.{name}").label

    def _check_choices(self) -> None:
        for f in dataclasses.fields(self):
            allowed = f.metadata["choices"]
            if allowed and getattr(self, f.name) not in allowed:
                raise ValueError(f"{self.label(f.name)} must be one of {list(allowed)}, got {getattr(self, f.name)!r}")

    def _positive(self, names: tuple[str, ...], *, integer: bool = False, allow_zero: bool = False) -> None:
        for name in names:
            value = getattr(self, name)
            if value is None and self.__dataclass_fields__[name].default is None:
                continue
            ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
            if (
                isinstance(value, bool)
                or not ok_type
                or not (value >= 0 if allow_zero else value > 0)
                or (not integer and not math.isfinite(value))
            ):
                kind = f"{'non-negative' if allow_zero else 'positive'} {'integer' if integer else 'number'}"
                raise ValueError(f"{self.label(name)} must be a {kind}, got {value!r}")

    def _finite(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{self.label(name)} must be a finite number, got {value!r}")

    def _within(self, name: str, low: float, high: float, *, closed: str = "[)") -> None:
        value = getattr(self, name)
        low_ok = value >= low if closed[0] == "[" else value > low
        high_ok = value <= high if closed[1] == "]" else value < high
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and high_ok):
            raise ValueError(f"{self.label(name)} must be in {closed[0]}{low:g}, {high:g}{closed[1]}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
    """The task and its data."""

    SECTION: ClassVar[str] = "task"
    name: str = setting(
        "stsb",
        "--task",
        f"GLUE task: {', '.join(GLUE_TASK_NAMES)}; or sequence-to-sequence task (an encoder-decoder model): "
        f"{', '.join(SEQ2SEQ_TASK_NAMES)}",
        flat="task",
    )
    max_length: int = setting(
        128, "--max-length", "tokens per example, at most the model's positions (sequence-to-sequence: of the source)"
    )
    buckets: tuple[int, ...] = setting(
        DEFAULT_BUCKETS,
        "--buckets",
        "batch widths in tokens, comma-separated: each batch is cut to the smallest that holds its longest row "
        "(capped at --max-length); finer buckets pad short texts less and compile more batch shapes",
        metavar="W,W,...",
    )
    train_limit: int = setting(0, "--train-limit", "use the first N training rows (0 = all)")
    eval_limit: int = setting(0, "--eval-limit", "evaluate on the first N >= 2 dev rows (0 = all)", resumable=True)
    data_source: Any = setting(
        "auto",
        "--data-source",
        "GLUE source: auto (--data-dir, else $ISOJAX_DATA_DIR, else the Hub; STS-B falls back to the offline "
        "package), hub, package, or a local directory/file in the Hub's layout; sequence-to-sequence: auto (the "
        "Hub) or a local directory/file (task seq2seq: columns source, target)",
    )
    data_dir: Any = setting(None, "--data-dir", DATA_DIR_HELP, metavar="DIR")

    def __post_init__(self):
        try:
            object.__setattr__(self, "name", _task_name(self.name))
        except ValueError as e:
            raise ValueError(f"{self.label('name')}: {str(e).removeprefix('task: ')}") from None
        for name in ("data_source", "data_dir"):
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        if self.data_dir is not None and self.data_source != "auto":
            raise ValueError(
                f"{self.label('data_dir')} is read with {self.label('data_source')} 'auto', got "
                f"{self.data_source!r}; pass one of the two"
            )
        self._positive(("max_length",), integer=True)
        buckets = self.buckets
        if (
            not isinstance(buckets, (tuple, list))
            or not buckets
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets)
        ):
            raise ValueError(f"{self.label('buckets')} must be one or more positive integers, got {buckets!r}")
        object.__setattr__(self, "buckets", tuple(sorted(set(buckets))))
        self._positive(("train_limit", "eval_limit"), integer=True, allow_zero=True)
        if self.eval_limit == 1:  # else the first evaluation, after training, fails in IsoScore / the correlations
            raise ValueError(
                f"{self.label('eval_limit')} must be 0 (all rows) or at least 2: the dev isotropy measures and "
                "correlations need two rows, got 1"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The pretrained model and how it runs."""

    SECTION: ClassVar[str] = "model"
    name: str = setting("default", "--model", "model directory, Hub id, or 'default' (all-MiniLM-L6-v2)", flat="model")
    pooling: str = setting("cls", "--pooling", "sentence representation fed to the head", choices=POOLINGS)
    dtype: str = setting("float32", "--dtype", "compute dtype", choices=DTYPES)
    scan_layers: bool = setting(
        False, "--scan-layers", "run the encoder's blocks as one nn.scan loop (compile time flat in depth)"
    )
    remat: str = setting(
        "none", "--remat", "recompute each block's forward in the backward pass (encoders only)", choices=REMATS
    )
    dropout: bool = setting(True, "--no-dropout", "turn dropout off")

    def __post_init__(self):
        self._check_choices()


@dataclasses.dataclass(frozen=True)
class MethodConfig(Section):
    """The isotropy method, extra regularisers and how they join the task loss."""

    SECTION: ClassVar[str] = "method"
    name: str = setting(
        "baseline", "--method", "isotropy method (list below)", choices=(*METHODS, *METHOD_ALIASES), flat="method"
    )
    regularizers: tuple[RegularizerSpec, ...] = setting(
        (),
        "--reg",
        "extra regulariser NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...] (repeatable); WEIGHT and float VALUEs are "
        "numbers or schedules of the step, e.g. istar=linear:0:1:500@cls (list below)",
        metavar="SPEC",
    )
    combine: str = setting(
        "sum",
        "--combine",
        "task loss + regularisers: sum, balanced (moving-average balancer), weighted (alpha L1 + (1-alpha) L2); "
        "isotropy_layer's second stage is balanced unless 'weighted'",
        choices=COMBINATIONS,
    )
    joint_alpha: float | str = setting(
        0.5, "--joint-alpha", "alpha of --combine weighted, in [0, 1]: a number or a schedule of the step (below)"
    )
    balancer_smoothing: float | str = setting(
        0.15,
        "--balancer-smoothing",
        "smoothing of --combine balanced's moving averages, in (0, 1]: a number or a schedule of the step",
    )
    softdecay_alpha: float = setting(-0.2, "--softdecay-alpha", "initial SoftDecay alpha in (-1, 0)")
    softdecay_placement: str = setting(
        "output",
        "--softdecay-placement",
        "SoftDecay on the last layer's output (the paper) or inside the last block before its LayerNorm with the "
        "residual added twice (the authors' code)",
        choices=TRANSFORM_PLACEMENTS,
    )

    def __post_init__(self):
        self._check_choices()
        object.__setattr__(self, "regularizers", tuple(self.regularizers))
        for reg in self.regularizers:
            if type(reg) is not RegularizerSpec:
                raise TypeError(
                    f"{self.label('regularizers')} must hold RegularizerSpec settings (an objective's Regularizer is "
                    f"built from them), got {type(reg).__name__}"
                )
        for name in ("joint_alpha", "balancer_smoothing"):
            try:
                object.__setattr__(self, name, check_number_or_schedule(getattr(self, name), name))
            except ValueError as e:
                raise ValueError(f"{self.label(name)}: {e}") from None
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
    learning_rate: float = setting(2e-5, "--lr", "peak learning rate")
    transform_learning_rate: float = setting(
        1e-3,
        "--transform-lr",
        "learning rate of SoftDecay alpha, the Isotropy Layer and the flow (constant for the flow)",
    )
    weight_decay: float = setting(0.01, "--weight-decay", "AdamW weight decay")
    warmup_ratio: float = setting(0.1, "--warmup-ratio", "fraction of the updates warming up, in [0, 1)")
    schedule: str = setting("linear", "--schedule", "learning-rate schedule after the warm-up", choices=SCHEDULES)
    max_grad_norm: float = setting(1.0, "--max-grad-norm", "clip (0 = off)")
    grad_accumulation: int = setting(1, "--grad-accumulation", "batches per update")
    batch_size: int = setting(32, "--batch-size", "global batch")
    eval_batch_size: int = setting(64, "--eval-batch-size", "global batch of the evaluation", resumable=True)
    epochs: float = setting(3.0, "--epochs", "training epochs")
    steps: int | None = setting(None, "--steps", "train this many batches instead of --epochs")
    stage2_epochs: float = setting(1.0, "--stage2-epochs", "Isotropy Layer stage length")
    stage2_steps: int | None = setting(None, "--stage2-steps", "Isotropy Layer stage length in batches")

    def __post_init__(self):
        self._check_choices()
        self._positive(("grad_accumulation", "batch_size", "eval_batch_size", "steps", "stage2_steps"), integer=True)
        self._positive(("learning_rate", "transform_learning_rate", "epochs", "stage2_epochs"))
        self._positive(("weight_decay", "max_grad_norm"), allow_zero=True)
        self._within("warmup_ratio", 0, 1)


@dataclasses.dataclass(frozen=True)
class PlacementConfig(Section):
    """Devices and parallelism (the same run can be repeated on 1 or N devices, under the mesh or pmap)."""

    SECTION: ClassVar[str] = "placement"
    devices: int | None = setting(None, "--devices", "use the first N devices (default all)", resumable=True)
    parallel: str = setting("mesh", "--parallel", "jit on a mesh, or pmap", choices=PARALLEL_MODES, resumable=True)
    model_parallel: int = setting(1, "--model-parallel", "size of the mesh's model axis", resumable=True)
    fsdp: bool = setting(
        False,
        "--fsdp",
        "FSDP: split the parameters and Adam moments over the mesh's data axis (parallel mesh only)",
        resumable=True,
    )

    def __post_init__(self):
        self._check_choices()
        self._positive(("devices", "model_parallel"), integer=True)
        if self.parallel == "pmap" and self.model_parallel != 1:
            raise ValueError(
                f"{self.label('model_parallel')} > 1 needs parallel='mesh' (pmap is data-parallel only), got "
                f"{self.model_parallel}"
            )
        if not isinstance(self.fsdp, bool):
            raise TypeError(f"{self.label('fsdp')} must be True or False, got {self.fsdp!r}")
        if self.fsdp and self.parallel == "pmap":
            raise ValueError(f"{self.label('fsdp')}: {FSDP_NEEDS_MESH}")


@dataclasses.dataclass(frozen=True)
class LoggingConfig(Section):
    """Outputs: ``save_every``/``eval_every``/``log_every`` count steps (0 = only at the end of each stage); a step
    with a non-finite loss or gradient is skipped and ``max_nonfinite_steps`` of them in a row stop the run."""

    SECTION: ClassVar[str] = "logging"
    output_dir: str = setting("runs/finetune", "--out", "output directory", resumable=True)
    save_every: int = setting(0, "--save-every", "checkpoint every N steps (0 = stage ends)", resumable=True)
    keep_checkpoints: int = setting(3, "--keep-checkpoints", "checkpoints kept", resumable=True)
    eval_every: int = setting(0, "--eval-every", "evaluate every N steps (0 = stage ends)", resumable=True)
    log_every: int = setting(
        10, "--log-every", "log the train records every N steps (and at stage ends)", resumable=True
    )
    log_gradients: bool = setting(
        False,
        "--log-gradients",
        "log per-layer gradient norms and the word-embedding gradient's alignment with the mean embedding direction "
        "(common enemies) every --log-every steps, with a curve in curves.png",
        resumable=True,
    )
    max_nonfinite_steps: int = setting(
        10,
        "--max-nonfinite-steps",
        "stop after this many steps in a row with a non-finite loss or gradient (each is skipped); rerunning "
        "resumes from the last good checkpoint",
        resumable=True,
    )
    progress: bool = setting(True, "--quiet", "no progress bar", resumable=True)

    def __post_init__(self):
        self._positive(("keep_checkpoints", "max_nonfinite_steps"), integer=True)
        self._positive(("save_every", "eval_every", "log_every"), integer=True, allow_zero=True)
        if self.log_gradients and not self.log_every:
            raise ValueError(
                f"{self.label('log_gradients')} needs {self.label('log_every')} > 0 (the statistics go into the "
                "logged train records)"
            )


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig(Section):
    """Sequence-to-sequence tasks: target length, label smoothing of the token cross-entropy, and the decoding of
    the dev set (``num_beams`` 1 = greedy; ``generation_max_length`` counts the decoder start token, default
    ``max_target_length`` + 1)."""

    SECTION: ClassVar[str] = "seq2seq"
    max_target_length: int = setting(128, "--max-target-length", "target tokens per example")
    label_smoothing: float = setting(0.1, "--label-smoothing", "label smoothing of the token cross-entropy")
    num_beams: int = setting(1, "--num-beams", "beams of the dev decoding (1 = greedy)", resumable=True)
    length_penalty: float = setting(1.0, "--length-penalty", "beam search length penalty", resumable=True)
    generation_max_length: int | None = setting(
        None,
        "--generation-max-length",
        "longest decoded sequence, start token included (default max-target-length + 1)",
        resumable=True,
    )

    def __post_init__(self):
        self._positive(("max_target_length", "num_beams", "generation_max_length"), integer=True)
        self._within("label_smoothing", 0, 1)
        self._finite("length_penalty")


@dataclasses.dataclass(frozen=True)
class FlowConfig(Section):
    """The flow of method ``flow``: a Glow of ``levels`` x ``depth`` steps with couplings ``hidden`` wide
    (BERT-flow's 3, 3, 32), its ActNorm started from the pretrained model's representations of the first
    ``init_batches`` training batches."""

    SECTION: ClassVar[str] = "flow"
    levels: int = setting(3, "--flow-levels", "Glow levels", flat="flow_levels")
    depth: int = setting(3, "--flow-depth", "steps per level", flat="flow_depth")
    hidden: int = setting(32, "--flow-hidden", "coupling network width", flat="flow_hidden")
    init_batches: int = setting(
        1,
        "--flow-init-batches",
        "training batches whose pretrained representations start the flow's ActNorm",
        flat="flow_init_batches",
    )

    def __post_init__(self):
        self._positive(("levels", "depth", "hidden", "init_batches"), integer=True)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A fine-tuning run: typed sections, each checked on construction, and the ``seed``.

    ``seq2seq`` (:class:`Seq2SeqConfig`) is filled with its defaults for a sequence-to-sequence task and ``flow``
    (:class:`FlowConfig`) for method ``flow`` when left None; set for another task or method they are unused.
    Every leaf has a dotted path (``optim.learning_rate``), an ``isojax finetune`` flag (``--lr``) and says whether
    it may change when a run resumes (:data:`SETTINGS`). ``to_json`` / ``from_json`` round-trip;
    ``from_json(data, overrides)`` and :meth:`override` take dotted overrides::

        TrainConfig(task=TaskConfig("rte"), optim=OptimConfig(learning_rate=3e-5, steps=100))
        TrainConfig().override({"task.name": "rte", "optim.learning_rate": "3e-5"})

    Attributes:
      task: the :class:`TaskConfig`.
      model: the :class:`ModelConfig`.
      method: the :class:`MethodConfig`.
      optim: the :class:`OptimConfig`.
      placement: the :class:`PlacementConfig`.
      logging: the :class:`LoggingConfig`.
      seq2seq: a :class:`Seq2SeqConfig`, or None.
      flow: a :class:`FlowConfig`, or None.
      seed: the seed of the initialisation, dropout and batch order (``--seed``).

    Examples:
      The two forms above give the same run (the task's name is read in any case), and method ``flow`` fills its
      section:

      >>> a = TrainConfig(task=TaskConfig("RTE"), optim=OptimConfig(learning_rate=3e-5))
      >>> b = TrainConfig().override({"task.name": "rte", "optim.learning_rate": "3e-5"})
      >>> a == b, a.task.name, a.flow
      (True, 'rte', None)
      >>> TrainConfig(method=MethodConfig("flow")).flow
      FlowConfig(levels=3, depth=3, hidden=32, init_batches=1)
      >>> TrainConfig.from_json(a.to_json()) == a
      True
    """

    task: TaskConfig = setting(factory=TaskConfig)
    model: ModelConfig = setting(factory=ModelConfig)
    method: MethodConfig = setting(factory=MethodConfig)
    optim: OptimConfig = setting(factory=OptimConfig)
    placement: PlacementConfig = setting(factory=PlacementConfig)
    logging: LoggingConfig = setting(factory=LoggingConfig)
    seq2seq: Seq2SeqConfig | None = None
    flow: FlowConfig | None = None
    seed: int = setting(0, "--seed", "seed of the initialisation, dropout and batch order")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            cls = _SECTIONS.get(f.name)
            value = getattr(self, f.name)
            if cls is not None and not isinstance(value, cls) and (value is not None or f.default is not None):
                raise TypeError(f"TrainConfig.{f.name} must be a {cls.__name__}, got {type(value).__name__}")
        if self.seq2seq is None and self.is_seq2seq:
            object.__setattr__(self, "seq2seq", Seq2SeqConfig())
        if self.flow is None and self.method_spec.flow:
            object.__setattr__(self, "flow", FlowConfig())
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"{setting_of('seed').label} must be a non-negative integer, got {self.seed!r}")
        if self.is_seq2seq:
            self._check_seq2seq()

    def _check_seq2seq(self) -> None:
        task = self.task.name
        if METHOD_ALIASES.get(self.method.name, self.method.name) not in SEQ2SEQ_METHODS:
            raise ValueError(
                f"{setting_of('method.name').label} {self.method.name!r} does not apply to the sequence-to-sequence "
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
                f"{setting_of('task.data_dir').label} holds GLUE/STS releases; the sequence-to-sequence task {task} "
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
        """A JSON-ready nested dict, a key per section (None for an unset optional one) and ``seed``: a scheduled
        ``joint_alpha`` / ``balancer_smoothing`` as the text of its :class:`~isojax.train.hyperparams.StepSchedule`,
        regularisers as dicts whose scheduled weight or options are such text (:meth:`from_json` reads it back)."""
        out: dict[str, Any] = {"seed": self.seed}
        for name in _SECTIONS:
            section = getattr(self, name)
            out[name] = None if section is None else {k: _json_value(v) for k, v in vars(section).items()}
        return out

    def flat_json(self) -> dict[str, Any]:
        """:meth:`to_json` keyed by dotted path (``{"optim.learning_rate": 2e-05, ...}``; an unset optional
        section as its name -> None)."""
        out: dict[str, Any] = {}
        for name, value in self.to_json().items():
            if isinstance(value, dict):
                out.update({f"{name}.{k}": v for k, v in value.items()})
            else:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: dict, overrides: dict | None = None) -> TrainConfig:
        """The configuration of a :meth:`to_json` dict, with dotted ``overrides`` (``{"optim.learning_rate":
        "3e-5"}``; text is converted to the field's type). ``ValueError`` naming an unknown key, and for the flat
        dict that runs wrote before the sections (``{"task": "rte", "learning_rate": 2e-05, ...}``), which is not
        read, naming each key's dotted spelling (``learning_rate -> optim.learning_rate``)."""
        if _is_flat(data):
            raise ValueError(_flat_refusal(data))
        values = _dotted(data)
        for path, value in (overrides or {}).items():
            values[path] = setting_of(path).parse(value)
        return _build(values)

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
OPTIONAL_SECTIONS = ("seq2seq", "flow")


def _document_settings(section: type) -> None:
    """Append to a section's docstring an ``Attributes:`` entry per field, written from its :func:`setting` (flag,
    help, default, choices), so that the API reference lists the fields without a second copy of their help text."""
    entries = []
    for f in dataclasses.fields(section):
        choices = ", ".join(f"``{c}``" for c in f.metadata["choices"])
        default = f"default ``{f.default!r}``" + (f"; one of {choices}" if choices else "")
        entries.append(f"  {f.name}: ``{f.metadata['flag']}``: {f.metadata['help']} ({default}).")
    section.__doc__ = inspect.cleandoc(section.__doc__ or "") + "\n\nAttributes:\n" + "\n".join(entries) + "\n"


for _section in _SECTIONS.values():
    _document_settings(_section)


def _settings() -> tuple[Setting, ...]:
    out = []
    for name, cls in [*_SECTIONS.items(), ("", TrainConfig)]:
        hints = typing.get_type_hints(cls)
        out += [
            Setting(f"{name}.{f.name}" if name else f.name, cls, f, hints[f.name])
            for f in dataclasses.fields(cls)
            if f.name not in _SECTIONS
        ]
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _settings()
"""Every leaf of :class:`TrainConfig` with its path, flag, help, choices and whether it may change on resume."""
_BY_PATH = {s.path: s for s in SETTINGS}
RESUMABLE = frozenset(s.path for s in SETTINGS if s.resumable)
"""The dotted paths that may differ when a run is resumed: where and how it runs, how often it reports."""


def setting_of(path: str) -> Setting:
    """The :class:`Setting` at a dotted path; ``ValueError`` listing the paths for an unknown one.

    Args:
      path: a dotted path (``"optim.learning_rate"``; ``"seed"``).

    Returns:
      The :class:`Setting`.

    Examples:
      >>> setting_of("optim.learning_rate").label, setting_of("optim.learning_rate").parse("3e-5")
      ('optim.learning_rate (--lr)', 3e-05)
    """
    if path not in _BY_PATH:
        raise ValueError(f"unknown setting {path!r}; expected one of {sorted(_BY_PATH)}")
    return _BY_PATH[path]


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple) and value and all(isinstance(r, RegularizerSpec) for r in value):
        return [r.to_json() for r in value]
    return value


def _is_flat(data: dict) -> bool:
    return not isinstance(data.get("task", {}), dict)


def _dotted(data: dict) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS and value is None:
            values[key] = None
        elif key in _SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"{key}: expected an object of settings, got {value!r}")
            for name, leaf in value.items():
                values[f"{key}.{name}"] = setting_of(f"{key}.{name}").parse(leaf)
        else:
            values[key] = setting_of(key).parse(value)
    return values


def _flat_refusal(data: dict) -> str:
    """The error for a flat configuration: each of its keys with the dotted path it is spelled as now."""
    by_flat = {s.flat: s.path for s in SETTINGS}
    spelled = ", ".join(f"{k} -> {by_flat.get(k, '(no such setting)')}" for k in data)
    return (
        "a flat configuration (the form runs wrote before the settings had sections) is no longer read; write each "
        f"setting in its section, as TrainConfig.to_json() does ('optim': {{'learning_rate': ...}}): {spelled}"
    )


def _build(values: dict[str, Any]) -> TrainConfig:
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for path, value in values.items():
        section, dot, name = path.partition(".")
        if dot:
            sections.setdefault(section, {})[name] = value
        elif path in _SECTIONS:
            top[path] = value  # an unset optional section
        else:
            top[path] = value
    for name, fields in sections.items():
        top[name] = _SECTIONS[name](**fields)
    return TrainConfig(**top)


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
