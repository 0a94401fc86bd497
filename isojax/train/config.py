"""What a fine-tuning run is: task, model, isotropy method, hyperparameters, devices. Checked on construction.

Methods (:data:`METHODS`; extra regularisers can be added to any of them with ``regularizers``):

    baseline              task loss only (alias: none)
    softdecay             SoftDecay on the last layer's token states, alpha learned (softdecay §5.2, Table 2);
                          softdecay_placement "output" (the paper) or "block" (the authors' code: inside the last
                          block before its LayerNorm, residual added twice)
    cosine                + cosine regularisation of the word embedding matrix (calibration-evaluation Table 1)
    spectrum_pol          + polynomial spectrum control of the word embedding matrix (Table 1)
    spectrum_exp          + exponential spectrum control of the word embedding matrix (Table 1)
    isoscore              + log(1/IsoScore) of the batch's [CLS] vectors
    istar                 + 1 - IsoScore* of the batch's [CLS] vectors (I-STAR)
    persistent_entropy    + class-wise persistent entropy of selected 0-dim bars of [CLS] (shrink-the-longest)
    persistent_entropy_all  the same over all bars (the paper's ablation)
    isobn                 IsoBN on the pooled representation before the head (Zhou et al. 2021)
    isotropy_layer        two stages (isotropy-layer-joint-loss §3): fine-tune encoder + head; then freeze
                          both and train an Isotropy Layer before the head on the balanced joint loss
                          L1 = task loss, L2 = log(1/IsoScore) of the head input
    flow                  flow calibration (calibration-evaluation Tables 1, 2, 3): a Glow flow between the
                          representation and the head, trained by maximum likelihood alongside the task
                          (:mod:`isojax.train.model`; sequence-to-sequence: :mod:`isojax.train.seq2seq`)

Tasks: a GLUE task (:mod:`isojax.data.glue`; a classifier, :class:`~isojax.train.model.TaskModel`) or a
sequence-to-sequence task (:mod:`isojax.data.seq2seq`; an encoder-decoder, :mod:`isojax.train.seq2seq`), which
takes the methods of :data:`SEQ2SEQ_METHODS` and regularisers of the ``embedding`` or ``tokens`` representation.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from isojax.calibrate import Flow
from isojax.data.glue import glue_task
from isojax.data.seq2seq import SEQ2SEQ_TASKS, seq2seq_task
from isojax.models.encoder import TRANSFORM_PLACEMENTS
from isojax.models.heads import POOLINGS
from isojax.models.stack import REMAT_POLICIES
from isojax.train.hyperparams import (
    Hyperparameter,
    StepSchedule,
    hyperparameter,
    is_schedule_text,
    is_scheduled,
    to_json,
)
from isojax.train.objective import COMBINATIONS, Regularizer
from isojax.train.optim import SCHEDULES
from isojax.train.parallel import FSDP_NEEDS_MESH, PARALLEL_MODES


@dataclasses.dataclass(frozen=True)
class Method:
    """An isotropy method: model changes and the regularisers it adds to the task loss."""

    description: str
    regularizers: tuple[Regularizer, ...] = ()
    softdecay: bool = False
    isobn: bool = False
    isotropy_layer: bool = False
    flow: bool = False


METHODS: dict[str, Method] = {
    "baseline": Method("task loss only"),
    "softdecay": Method("SoftDecay on the last layer, learnable alpha", softdecay=True),
    "cosine": Method("cosine regularisation of the word embeddings", (Regularizer("cosine", 1.0),)),
    "spectrum_pol": Method("polynomial spectrum control of the word embeddings", (Regularizer("spectrum_pol", 1e-3),)),
    "spectrum_exp": Method("exponential spectrum control of the word embeddings", (Regularizer("spectrum_exp", 1e-3),)),
    "isoscore": Method("log(1/IsoScore) of the batch's [CLS] vectors", (Regularizer("isoscore", 0.1),)),
    "istar": Method("I-STAR: 1 - IsoScore* of the batch's [CLS] vectors", (Regularizer("istar", 1.0),)),
    "persistent_entropy": Method(
        "class-wise persistent entropy of the selected bars of [CLS]", (Regularizer("persistent_entropy", 0.1),)
    ),
    "persistent_entropy_all": Method(
        "class-wise persistent entropy of all bars of [CLS]",
        (Regularizer("persistent_entropy", 0.1, options=(("bars", "all"),)),),
    ),
    "isobn": Method("IsoBN on the pooled representation", isobn=True),
    "isotropy_layer": Method("two-stage Isotropy Layer with the balanced joint loss", isotropy_layer=True),
    "flow": Method("flow calibration: a Glow flow before the head, trained by maximum likelihood", flow=True),
}
METHOD_ALIASES = {"none": "baseline"}
SEQ2SEQ_METHODS = ("baseline", "cosine", "spectrum_pol", "spectrum_exp", "flow")
"""The methods of isotropy-calibration-evaluation §3 that act on a sequence-to-sequence model (Tables 2, 3)."""
SEQ2SEQ_REPRESENTATIONS = ("embedding", "tokens")


def method(name: str) -> Method:
    """Look a method up by name (or alias); ``ValueError`` listing the choices for an unknown one."""
    key = METHOD_ALIASES.get(name, name)
    if key not in METHODS:
        raise ValueError(f"method: unknown method {name!r}; expected one of {sorted(METHODS) + sorted(METHOD_ALIASES)}")
    return METHODS[key]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a run: its name, the top-level parameter groups it freezes, its objective's regularisers
    and how they combine with the task loss, and its length in epochs or steps."""

    name: str
    frozen: tuple[str, ...]
    regularizers: tuple[Regularizer, ...]
    combine: str
    epochs: float
    steps: int | None


def _positive(value, name: str, *, integer: bool = False, allow_zero: bool = False) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if (
        isinstance(value, bool)
        or not ok_type
        or not (value >= 0 if allow_zero else value > 0)
        or (not integer and not math.isfinite(value))
    ):
        kind = "integer" if integer else "number"
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} {kind}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A fine-tuning run. Every field has a default; see ``isojax finetune --help`` for each one's meaning.

    Lengths: ``steps`` (batches) when given, else ``epochs`` over the training set. With grad_accumulation k a
    step is one batch and the optimiser updates every k steps. ``stage2_epochs``/``stage2_steps`` size the
    Isotropy Layer stage. ``save_every``/``eval_every``/``log_every`` count steps (0 = only at the end of each
    stage). ``log_gradients`` adds per-layer gradient norms and the word-embedding gradient's alignment with the
    mean embedding direction (:mod:`isojax.train.gradient_stats`) to the logged train records. A step with a
    non-finite loss or gradient is skipped; ``max_nonfinite_steps`` of them in a row stop the run
    (:mod:`isojax.train.loop`).
    ``train_limit``/``eval_limit`` keep the first N examples (0 = all). ``scan_layers`` runs the encoder's blocks as
    one ``nn.scan`` loop (compile time flat in depth; checkpoints hold the stacked layout) and ``remat`` ("none",
    "full", "dots") recomputes each block's forward in the backward pass (encoders only; see
    :func:`isojax.models.from_pretrained`); ``log_gradients`` then reports the scanned stack as one group.
    ``fsdp`` splits the parameters and optimiser state over the mesh's data axis (FSDP, :mod:`isojax.train.parallel`;
    ``parallel="mesh"`` only, combinable with ``model_parallel``).

    ``joint_alpha`` and ``balancer_smoothing`` (and the regularisers' weights and float options) are numbers or
    schedules of the step (:mod:`isojax.train.hyperparams`; text such as ``"linear:1:0.5:300"`` is read as one).

    Sequence-to-sequence tasks: ``max_length`` / ``max_target_length`` tokens of source / target,
    ``label_smoothing`` of the token cross-entropy, and the decoding of the dev set: ``num_beams`` (1 = greedy),
    ``length_penalty``, ``generation_max_length`` (decoder start token included; default max_target_length + 1).
    The flow (method ``flow``): ``flow_levels``, ``flow_depth``, ``flow_hidden`` (BERT-flow's 3, 3, 32), its
    ActNorm started from the pretrained model's representations of the first ``flow_init_batches`` training batches.
    """

    task: str = "stsb"
    model: str = "default"
    method: str = "baseline"
    regularizers: tuple[Regularizer, ...] = ()
    pooling: str = "cls"
    combine: str = "sum"
    joint_alpha: Hyperparameter = 0.5
    balancer_smoothing: Hyperparameter = 0.15
    softdecay_alpha: float = -0.2
    softdecay_placement: str = "output"
    max_length: int = 128
    batch_size: int = 32
    eval_batch_size: int = 64
    learning_rate: float = 2e-5
    transform_learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    schedule: str = "linear"
    max_grad_norm: float = 1.0
    grad_accumulation: int = 1
    epochs: float = 3.0
    steps: int | None = None
    stage2_epochs: float = 1.0
    stage2_steps: int | None = None
    dropout: bool = True
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    seed: int = 0
    devices: int | None = None
    parallel: str = "mesh"
    model_parallel: int = 1
    fsdp: bool = False
    output_dir: str = "runs/finetune"
    save_every: int = 0
    keep_checkpoints: int = 3
    eval_every: int = 0
    log_every: int = 10
    log_gradients: bool = False
    max_nonfinite_steps: int = 10
    train_limit: int = 0
    eval_limit: int = 0
    data_source: Any = "auto"
    data_dir: Any = None
    progress: bool = True
    max_target_length: int = 128
    label_smoothing: float = 0.1
    num_beams: int = 1
    length_penalty: float = 1.0
    generation_max_length: int | None = None
    flow_levels: int = 3
    flow_depth: int = 3
    flow_hidden: int = 32
    flow_init_batches: int = 1

    def __post_init__(self):
        object.__setattr__(self, "task", _task_name(self.task))
        for name in ("data_source", "data_dir"):
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        if self.data_dir is not None and self.data_source != "auto":
            raise ValueError(
                f"data_dir is read with data_source='auto', got data_source={self.data_source!r}; pass one of the two"
            )
        method(self.method)
        object.__setattr__(self, "regularizers", tuple(self.regularizers))
        for reg in self.regularizers:
            if not isinstance(reg, Regularizer):
                raise TypeError(f"regularizers must hold Regularizer objects, got {type(reg).__name__}")
            reg.check()
        for reg in self.method_spec.regularizers:
            reg.check()
        choices = {
            "pooling": POOLINGS,
            "combine": COMBINATIONS,
            "schedule": SCHEDULES,
            "parallel": PARALLEL_MODES,
            "dtype": ("float32", "bfloat16"),
            "softdecay_placement": TRANSFORM_PLACEMENTS,
            "remat": ("none", *REMAT_POLICIES),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name in (
            "max_length",
            "batch_size",
            "eval_batch_size",
            "grad_accumulation",
            "model_parallel",
            "keep_checkpoints",
            "max_target_length",
            "num_beams",
            "flow_levels",
            "flow_depth",
            "flow_hidden",
            "flow_init_batches",
            "max_nonfinite_steps",
        ):
            _positive(getattr(self, name), name, integer=True)
        for name in ("save_every", "eval_every", "log_every", "train_limit", "eval_limit", "seed"):
            _positive(getattr(self, name), name, integer=True, allow_zero=True)
        for name in ("learning_rate", "transform_learning_rate", "epochs", "stage2_epochs"):
            _positive(getattr(self, name), name)
        for name in ("weight_decay", "max_grad_norm"):
            _positive(getattr(self, name), name, allow_zero=True)
        for name in ("steps", "stage2_steps", "devices", "generation_max_length"):
            if getattr(self, name) is not None:
                _positive(getattr(self, name), name, integer=True)
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        for name in ("joint_alpha", "balancer_smoothing"):
            object.__setattr__(self, name, hyperparameter(getattr(self, name), name))
        if not is_scheduled(self.joint_alpha) and not 0 <= self.joint_alpha <= 1:
            raise ValueError(f"joint_alpha must be in [0, 1], got {self.joint_alpha!r}")
        if not is_scheduled(self.balancer_smoothing) and not 0 < self.balancer_smoothing <= 1:
            raise ValueError(f"balancer_smoothing must be in (0, 1], got {self.balancer_smoothing!r}")
        if not -1 < self.softdecay_alpha < 0:
            raise ValueError(f"softdecay_alpha must be in (-1, 0), got {self.softdecay_alpha!r}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if self.is_seq2seq:
            self._check_seq2seq()
        spec = self.method_spec
        if self.combine != "sum" and not (self.regularizers or spec.regularizers or spec.isotropy_layer):
            raise ValueError(f"combine={self.combine!r} needs at least one regulariser")
        if self.log_gradients and not self.log_every:
            raise ValueError("log_gradients needs log_every > 0 (the statistics go into the logged train records)")
        if self.parallel == "pmap" and self.model_parallel != 1:
            raise ValueError("model_parallel > 1 needs parallel='mesh' (pmap is data-parallel only)")
        if not isinstance(self.fsdp, bool):
            raise TypeError(f"fsdp must be True or False, got {self.fsdp!r}")
        if self.fsdp and self.parallel == "pmap":
            raise ValueError(FSDP_NEEDS_MESH)

    def _check_seq2seq(self) -> None:
        key = METHOD_ALIASES.get(self.method, self.method)
        if key not in SEQ2SEQ_METHODS:
            raise ValueError(
                f"method {self.method!r} does not apply to the sequence-to-sequence task {self.task}; "
                f"expected one of {list(SEQ2SEQ_METHODS)}"
            )
        if self.scan_layers or self.remat != "none":
            raise ValueError(
                f"scan_layers and remat are for encoders; the sequence-to-sequence task {self.task} "
                "runs its encoder-decoder unrolled"
            )
        for reg in self.method_spec.regularizers + self.regularizers:
            if reg.representation not in SEQ2SEQ_REPRESENTATIONS:
                raise ValueError(
                    f"regulariser {reg.label}: a sequence-to-sequence model has the representations "
                    f"{list(SEQ2SEQ_REPRESENTATIONS)}, not {reg.representation!r}"
                )
            if reg.needs_reference:
                raise ValueError(f"regulariser {reg.label}: c0='data' is for classification tasks; use c0=identity")
        if self.data_dir is not None:
            raise ValueError(
                f"data_dir holds GLUE/STS releases; the sequence-to-sequence task {self.task} reads "
                "data_source (the Hub, or a local file or directory)"
            )

    @property
    def method_spec(self) -> Method:
        return method(self.method)

    def make_flow(self) -> Flow | None:
        """The flow of method ``flow`` (:class:`isojax.calibrate.Flow` of ``flow_levels``, ``flow_depth``,
        ``flow_hidden``), else None."""
        if not self.method_spec.flow:
            return None
        return Flow(levels=self.flow_levels, depth=self.flow_depth, hidden=self.flow_hidden)

    @property
    def is_seq2seq(self) -> bool:
        """Whether the task is a sequence-to-sequence task (else a GLUE task)."""
        return self.task in SEQ2SEQ_TASKS

    @property
    def num_labels(self) -> int:
        return glue_task(self.task).num_labels

    def stages(self) -> tuple[Stage, ...]:
        """The run's stages: fine-tuning (``combine`` joins its task loss and regularisers), then, for
        isotropy_layer, the Isotropy Layer stage (``combine``: ``"balanced"`` unless ``"weighted"`` is asked
        for; the fine-tuning stage then sums)."""
        spec = self.method_spec
        regs = spec.regularizers + self.regularizers
        if not spec.isotropy_layer:
            return (Stage("finetune", (), regs, self.combine, self.epochs, self.steps),)
        joint = "balanced" if self.combine == "sum" else self.combine
        return (
            Stage("finetune", ("isotropy_layer",), regs, "sum", self.epochs, self.steps),
            Stage(
                "isotropy_layer",
                ("encoder", "head"),
                (Regularizer("isoscore", 1.0, "head_input"),),
                joint,
                self.stage2_epochs,
                self.stage2_steps,
            ),
        )

    def to_json(self) -> dict:
        """A JSON-ready dict of the fields: a scheduled ``joint_alpha`` / ``balancer_smoothing`` as the text of its
        :class:`~isojax.train.hyperparams.StepSchedule`, regularisers as dicts whose scheduled weight or options are
        such text (``Regularizer(**d)`` reads such a dict back)."""
        out = dataclasses.asdict(self)
        out.update(joint_alpha=to_json(self.joint_alpha), balancer_smoothing=to_json(self.balancer_smoothing))
        out["regularizers"] = [
            {
                "name": r.name,
                "weight": to_json(r.weight),
                "representation": r.representation,
                "options": tuple((k, to_json(v)) for k, v in r.options),
            }
            for r in self.regularizers
        ]
        return out


def _task_name(task: str) -> str:
    """The canonical name of a GLUE or sequence-to-sequence task; ``ValueError`` listing both kinds."""
    try:
        return glue_task(task).name
    except ValueError as e:
        try:
            return seq2seq_task(task).name
        except ValueError:
            raise ValueError(f"{e}; or a sequence-to-sequence task: {sorted(SEQ2SEQ_TASKS)}") from None


def parse_regularizer(text: str) -> Regularizer:
    """Parse ``NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...]``, e.g. ``isoscore=0.5@cls``,
    ``persistent_entropy=0.1@cls,bars=all,classwise=false`` or ``istar=linear:0:1:500@cls``. WEIGHT is a number or
    a schedule of the step (:mod:`isojax.train.hyperparams`: ``constant:V``, ``linear:A:B:N[:S]``,
    ``warmup:V:N[:S]``, ``cosine:A:N[:F]``); option values parse as bool, int, float, schedule or string."""
    head, *opts = [p.strip() for p in text.split(",")]
    head, _, rep = head.partition("@")
    name, _, weight = head.partition("=")
    options = []
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ValueError(f"regulariser {text!r}: option {opt!r} is not KEY=VALUE")
        options.append((key.strip(), _parse_value(value.strip())))
    try:
        weight_value = hyperparameter(weight.strip() or 1.0, "weight")
    except ValueError as e:
        raise ValueError(f"regulariser {text!r}: {e}") from None
    return Regularizer(name.strip(), weight_value, rep.strip() or None, tuple(options))


def _parse_value(value: str):
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if is_schedule_text(value):
        return StepSchedule.parse(value)
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
