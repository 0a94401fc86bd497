"""The training objective: task loss plus weighted isotropy regularisers, or the two balanced as a joint loss.

    task loss   L1 = mean_i CE(logits_i, y_i)            (classification)
                     mean_i (logit_i - y_i)^2             (regression, STS-B)
    sum         L  = L1 + sum_k lambda_k R_k(representation_k)
    balanced    L  = (L1 * Lbar/Lbar_1 + L2 * Lbar/Lbar_2) / 2,   L2 = sum_k lambda_k R_k
                     (moving-average balancing, isotropy-layer-joint-loss §3.3 eq. 3; isojax.losses.balancer_update)
    weighted    L  = alpha L1 + (1 - alpha) L2                     (isotropy-layer-joint-loss eq. 2)
    flow        L  = (any of the above) + L_flow,  L_flow = -mean_i log p(x_i) / d   (a model with a flow)

The flow's maximum-likelihood loss ``L_flow`` (mean over the rows the flow transformed: the batch's sentence
embeddings, or the real target tokens of a sequence-to-sequence batch) is added with weight 1 whatever
``combine`` says: its gradient reaches only the flow's parameters, and no other term's gradient reaches them
(:class:`isojax.calibrate.Flow`), so a weight would only rescale the flow's own gradient, which its optimiser
normalises (:mod:`isojax.train.optim`). It is logged as ``flow``.

Regularisers (:data:`~isojax.train.methods.REGULARIZERS`, their functions :data:`REGULARIZER_FUNCTIONS`; each is minimised, options in brackets with their defaults):

    cosine              Gao et al. cosine regularisation (losses.cosine_regularization)        [embedding]
    spectrum_pol        sum_k (s_k - c1 k^gamma)^2 (losses.spectrum_polynomial)                [embedding]
    spectrum_exp        sum_k (s_k - c1 exp(-c2 k^gamma))^2 (losses.spectrum_exponential)      [embedding]
    isoscore            log(1 / IsoScore) (losses.isoscore_loss)                               [cls]
    istar               1 - IsoScore*, zeta shrinkage (losses.istar_loss)                      [cls]
    persistent_entropy  -H(selected or all 0-dim bars), per class (topology.persistent_entropy_loss) [cls]

``c1 = "auto"`` (spectrum control) is the largest singular value of the representation at the start of
training (:func:`resolve_auto_options`), so the prior starts at the matrix's own top singular value. The
papers give no values for lambda, c1, c2, gamma; the defaults here are this library's.

I-STAR's reference covariance ``c0`` is ``"identity"`` (the I-STAR authors' fallback when no larger sample of
points is at hand) or ``"data"``: the covariance (ddof 1) of the representation computed by the model at the
start of training over the training set (:func:`data_references`), which the objective holds in
``references`` under the term's label.

Weights ``lambda_k``, the regularisers' float options and the joint loss's ``alpha`` and ``smoothing`` are each a
number or a schedule of the step (:mod:`isojax.train.hyperparams`: an optax schedule, or text such as
``linear:0:1:500``), evaluated in the train step on the traced step count, so one compilation serves the whole run.
A scheduled value is logged beside the terms: ``<label>/weight``, ``<label>/<option>``, ``joint/alpha``,
``joint/smoothing``.

Class-wise persistent entropy (shrink-the-longest §4) splits the cloud by label; for the regression task
(STS-B, scores in [0, 5]) the classes are ``bins`` equal-width score bins. Every batch-level regulariser is
computed on the batch the objective is given, the *global* batch (:mod:`isojax.train.parallel`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Protocol

import jax
import jax.numpy as jnp
import optax

from isojax import losses, topology
from isojax._stats import select_rows
from isojax.train.config import COMBINATIONS
from isojax.train.hyperparams import Hyperparameter, hyperparameter, is_schedule_text, is_scheduled, value_at
from isojax.train.methods import RegularizerSpec, regularizer_fields
from isojax.train.model import word_embeddings

REGRESSION_RANGE = (0.0, 5.0)  # STS-B scores, GLUE's only regression task


def _cosine(x, mask, labels, num_classes):
    return losses.cosine_regularization(x, mask=mask)


def _spectrum_pol(x, mask, labels, num_classes, *, c1, gamma):
    return losses.spectrum_polynomial(select_rows(x, mask), c1=c1, gamma=gamma)


def _spectrum_exp(x, mask, labels, num_classes, *, c1, c2, gamma):
    return losses.spectrum_exponential(select_rows(x, mask), c1=c1, c2=c2, gamma=gamma)


def _isoscore(x, mask, labels, num_classes):
    return losses.isoscore_loss(x, mask=mask)


def _istar(x, mask, labels, num_classes, *, zeta, c0="identity", reference=None):
    return losses.istar_loss(x, zeta=zeta, mask=mask, c0=reference)


def _persistent_entropy(x, mask, labels, num_classes, *, bars, classwise, in_cluster_weight):
    return topology.persistent_entropy_loss(
        x,
        labels if classwise else None,
        mask=mask,
        num_classes=num_classes if classwise else None,
        bars=bars,
        in_cluster_weight=in_cluster_weight,
    )


REGULARIZER_FUNCTIONS: dict[str, Callable[..., jax.Array]] = {
    "cosine": _cosine,
    "spectrum_pol": _spectrum_pol,
    "spectrum_exp": _spectrum_exp,
    "isoscore": _isoscore,
    "istar": _istar,
    "persistent_entropy": _persistent_entropy,
}
"""Each regulariser of :data:`~isojax.train.methods.REGULARIZERS` as ``fn(x [n, d], mask [n] | None, labels [n],
num_classes, **options) -> scalar``."""


@dataclasses.dataclass(frozen=True)
class Regularizer(RegularizerSpec):
    """One weighted regulariser term: ``weight(step) * REGULARIZERS[name](representation, **options(step))``.

    Unknown names, options or representations, a weight that is not a float scalar or a schedule, and an option
    value the regulariser refuses (:meth:`check`) raise ``ValueError`` here, at construction. The dataclass is frozen and hashable, so objectives can be static under
    ``jit``.

    Attributes:
      name: a key of :data:`~isojax.train.methods.REGULARIZERS` (``"cosine"``, ``"spectrum_pol"``, ``"spectrum_exp"``, ``"isoscore"``,
        ``"istar"``, ``"persistent_entropy"``).
      weight: ``lambda``: a number, a 0-d float NumPy / JAX scalar (kept as a Python float) or a schedule of the step
        (:mod:`isojax.train.hyperparams`; text such as ``"linear:0:1:500"`` is read as one).
      representation: what the term acts on, a key of :data:`~isojax.train.methods.REPRESENTATIONS` that the
        regulariser accepts; ``None``: its default (``embedding`` or ``cls``).
      options: ``(name, value)`` pairs overriding the regulariser's defaults; after construction, every option with
        its value, sorted by name. Float options may be schedules too.

    Examples:
      >>> reg = Regularizer("istar", "linear:0:1:500", options=(("zeta", 0.5),))
      >>> reg.label, reg.options
      ('istar@cls', (('c0', 'identity'), ('zeta', 0.5)))
      >>> reg.scheduled_values(250)["istar@cls/weight"]  # halfway up the linear schedule
      Array(0.5, dtype=float32, weak_type=True)
      >>> Regularizer("istar", representation="embedding")
      Traceback (most recent call last):
      ValueError: regulariser istar: unknown or unsupported representation 'embedding'; expected one of [...]
    """

    weight: Hyperparameter = 1.0

    def __post_init__(self):
        representation, options = regularizer_fields(self.name, self.representation, self.options)
        object.__setattr__(self, "representation", representation)
        object.__setattr__(self, "weight", hyperparameter(self.weight, f"regulariser {self.name}: weight"))
        options = tuple((k, _option_value(v, f"regulariser {self.name}: option {k}")) for k, v in options)
        object.__setattr__(self, "options", options)
        self.check()

    @classmethod
    def of(cls, spec: RegularizerSpec) -> Regularizer:
        """The term of a configured :class:`~isojax.train.methods.RegularizerSpec` (schedule text read)."""
        return spec if isinstance(spec, Regularizer) else cls(spec.name, spec.weight, spec.representation, spec.options)

    @property
    def kwargs(self) -> dict:
        """Options passed to the regulariser function (``bins`` is used to build class labels instead)."""
        return {k: v for k, v in self.options if k != "bins"}

    def fn(self, step=None) -> Callable:
        """``fn(x, mask, labels, num_classes)`` with the options bound (scheduled ones at ``step``)."""
        return functools.partial(
            REGULARIZER_FUNCTIONS[self.name], **{k: value_at(v, step) for k, v in self.kwargs.items()}
        )

    def scheduled_values(self, step) -> dict:
        """``{"<label>/weight" | "<label>/<option>": value at step}`` of the scheduled weight and options."""
        values = (("weight", self.weight), *self.options)
        return {f"{self.label}/{k}": value_at(v, step) for k, v in values if is_scheduled(v)}

    @functools.cache  # noqa: B019 - a frozen, hashable value: its check never changes
    def check(self) -> None:
        """Evaluate the term abstractly on a small cloud, so that a bad option value raises ``ValueError`` now
        (naming the term) rather than when the training step is compiled."""
        if self.name == "istar" and dict(self.options)["c0"] not in ("identity", "data"):
            raise ValueError(
                f"regulariser {self.label}: c0 must be 'identity' or 'data', got {dict(self.options)['c0']!r}"
            )
        kwargs = {k: (1.0 if v == "auto" else value_at(v, 0)) for k, v in self.kwargs.items()}
        fn = functools.partial(REGULARIZER_FUNCTIONS[self.name], **kwargs)
        try:
            jax.eval_shape(
                lambda x, y: fn(x, None, y, 2),
                jax.ShapeDtypeStruct((8, 4), jnp.float32),
                jax.ShapeDtypeStruct((8,), jnp.int32),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"regulariser {self.label}: {e}") from e


def parse_regularizer(text: str) -> Regularizer:
    """The term of ``NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...]`` (``isojax finetune --reg``;
    :meth:`~isojax.train.methods.RegularizerSpec.parse`), its schedule text read as schedules.

    Args:
      text: the specification, e.g. ``"istar=linear:0:1:500@cls,zeta=0.3"``.

    Returns:
      The :class:`Regularizer`; ``ValueError`` naming ``text`` for a malformed or unknown one.

    Examples:
      >>> reg = parse_regularizer("persistent_entropy=0.1@cls,bars=all,classwise=false")
      >>> reg.name, reg.weight, reg.representation, reg.options
      ('persistent_entropy', 0.1, 'cls',
       (('bars', 'all'), ('bins', 5), ('classwise', False), ('in_cluster_weight', 0.0)))
      >>> parse_regularizer("istar=linear:0:1:500").weight
      StepSchedule(kind='linear', args=(0.0, 1.0, 500))
    """
    return Regularizer.of(RegularizerSpec.parse(text))


def _option_value(value, name: str):
    """A regulariser option as given (a bool, an int, a string) or, for a float, a scalar or schedule checked and
    normalised by :func:`isojax.train.hyperparams.hyperparameter`."""
    if isinstance(value, (bool, int)) or (isinstance(value, str) and not is_schedule_text(value)):
        return value
    return hyperparameter(value, name)


def resolve_auto_options(regularizers, params) -> tuple[Regularizer, ...]:
    """Replace ``c1="auto"`` by the largest singular value of the word embedding matrix in ``params``.

    Only the ``embedding`` representation can be resolved before training (a batch representation changes
    with every batch): ``"auto"`` elsewhere raises ``ValueError``.
    """
    out = []
    for reg in map(Regularizer.of, regularizers):
        opts = dict(reg.options)
        if opts.get("c1") == "auto":
            if reg.representation != "embedding":
                raise ValueError(
                    f"regulariser {reg.label}: c1='auto' needs representation 'embedding'; "
                    "give c1=<number> for a batch representation"
                )
            w = jnp.asarray(word_embeddings(params), jnp.float32)
            opts["c1"] = float(jnp.linalg.svd(w, compute_uv=False)[0])
            reg = dataclasses.replace(reg, options=tuple(opts.items()))
        out.append(reg)
    return tuple(out)


def data_references(regularizers, covariance) -> dict[str, jax.Array]:
    """Reference covariances of the terms that need one (:attr:`Regularizer.needs_reference`).

    ``covariance(name) -> C0 [d, d]``: the covariance (ddof 1, over real rows) of representation ``name``
    computed over the training set by the model at the start of training (``isojax.train.loop`` streams it
    batch by batch). Returns ``{term label: C0}``, as :func:`isojax.metrics.isoscore_star` takes it.
    """
    return {
        reg.label: jnp.asarray(covariance(reg.representation), jnp.float32)
        for reg in regularizers
        if reg.needs_reference
    }


def task_losses(logits, labels, num_labels: int):
    """Per-example task loss ``[B]``: cross-entropy over ``num_labels`` classes, or squared error when 1."""
    if num_labels == 1:
        return (logits[:, 0] - labels.astype(logits.dtype)) ** 2
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def flow_loss(log_likelihood, mask):
    """``-mean log p / d`` over the global batch's rows that the flow transformed: ``log_likelihood [...]`` of
    each row, ``mask [...]`` true for the real ones (None: all)."""
    weights = jnp.ones_like(log_likelihood) if mask is None else mask.astype(log_likelihood.dtype)
    return -jnp.sum(weights * log_likelihood) / jnp.sum(weights)


def class_ids(labels, num_labels: int, bins: int):
    """Class of each example for class-wise regularisers: the label, or its score bin for regression."""
    if num_labels > 1:
        return labels, num_labels
    low, high = REGRESSION_RANGE
    ids = jnp.floor((labels - low) / (high - low) * bins).astype(jnp.int32)
    return jnp.clip(ids, 0, bins - 1), bins


class ModelOutput(Protocol):
    """What an :class:`Objective` reads of a model's output (:class:`~isojax.train.model.TaskOutput`,
    :class:`~isojax.train.tasks.seq2seq.Seq2SeqTaskOutput`): the ``logits``, the ``tokens`` with their ``mask``, the
    flow's ``flow_log_likelihood`` (None without a flow) with its ``flow_mask`` (None: every row is real), and the
    other representations a regulariser names, read by name."""

    @property
    def logits(self) -> jax.Array: ...

    @property
    def tokens(self) -> jax.Array: ...

    @property
    def mask(self) -> jax.Array: ...

    @property
    def flow_log_likelihood(self) -> jax.Array | None: ...

    @property
    def flow_mask(self) -> jax.Array | None: ...


@dataclasses.dataclass(frozen=True)
class Objective:
    """Task loss and regularisers combined by ``combine`` (see the module docstring).

    Calling it, ``objective(output, params, labels, balancer, step=...)`` gives ``(loss, terms,
    balancer)``: the scalar objective, its parts (``task``, each regulariser's unweighted value under its
    :attr:`Regularizer.label`, ``flow``, scheduled values) and the updated balancer state.

    Attributes:
      num_labels: the number of classes; 1 is regression (squared error on ``logits[:, 0]``).
      regularizers: the :class:`Regularizer` terms (options resolved: :func:`resolve_auto_options`).
      combine: ``"sum"``, ``"balanced"`` or ``"weighted"``; the last two need regularisers.
      alpha: the task loss's weight for ``"weighted"``, in [0, 1]; a number or a schedule of the step.
      smoothing: ``s`` of the joint-loss balancer (``"balanced"``); a number or a schedule of the step.
      references: term label -> reference statistic (:func:`data_references`; I-STAR with ``c0="data"`` needs one).

    Examples:
      Without regularisers the loss is the mean cross-entropy, here checked against the log-softmax by hand:

      >>> import types, numpy as np
      >>> logits = np.array([[2.0, 0.0], [0.0, 1.0]], np.float32)
      >>> output = types.SimpleNamespace(logits=logits, flow_log_likelihood=None)
      >>> loss, terms, _ = Objective(num_labels=2)(output, {}, np.array([0, 1]), None)
      >>> want = np.mean([np.log1p(np.exp(-2.0)), np.log1p(np.exp(-1.0))])
      >>> bool(np.isclose(loss, want)), sorted(terms)
      (True, ['task'])
    """

    num_labels: int
    regularizers: tuple[Regularizer, ...] = ()
    combine: str = "sum"
    alpha: Hyperparameter = 0.5
    smoothing: Hyperparameter = 0.15
    references: Mapping[str, jax.Array] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.combine not in COMBINATIONS:
            raise ValueError(f"combine must be one of {COMBINATIONS}, got {self.combine!r}")
        if self.combine != "sum" and not self.regularizers:
            raise ValueError(f"combine={self.combine!r} joins the task loss with regularisers; none were given")
        object.__setattr__(self, "regularizers", tuple(map(Regularizer.of, self.regularizers)))
        for name in ("alpha", "smoothing"):
            object.__setattr__(self, name, hyperparameter(getattr(self, name), name))
        if not is_scheduled(self.alpha) and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")
        missing = [r.label for r in self.regularizers if r.needs_reference and r.label not in self.references]
        if missing:
            raise ValueError(
                f"regulariser(s) {missing} need a reference statistic (c0='data'): pass references "
                "from data_references()"
            )

    def cloud(self, reg: Regularizer, output: ModelOutput, params, labels):
        """``(x [n, d], mask [n] | None, labels [n] | None)`` of a regulariser's representation (global batch);
        ``labels`` None: no per-row classes."""
        if reg.representation == "embedding":
            return word_embeddings(params), None, None
        if reg.representation == "tokens":
            tokens, mask = output.tokens, output.mask
            per_token = None if labels is None else jnp.broadcast_to(labels[:, None], mask.shape).reshape(-1)
            return tokens.reshape(-1, tokens.shape[-1]), mask.reshape(-1), per_token
        return getattr(output, str(reg.representation)), None, labels

    def regularizer_value(self, reg: Regularizer, output: ModelOutput, params, labels, *, step=None):
        """Unweighted value of one regulariser on the global batch (or on the parameters); scheduled options
        at ``step``."""
        x, mask, per_row = self.cloud(reg, output, params, labels)
        classes = num_classes = None
        if per_row is not None:
            classes, num_classes = class_ids(per_row, self.num_labels, dict(reg.options).get("bins", 1))
        extra = {"reference": self.references[reg.label]} if reg.needs_reference else {}
        return reg.fn(step)(x, mask, classes, num_classes, **extra)

    def task_loss(self, output: ModelOutput, labels):
        """The task loss of the batch: the mean of :func:`~isojax.train.objective.task_losses` over its examples."""
        return jnp.mean(task_losses(output.logits, labels, self.num_labels))

    @property
    def scheduled(self) -> bool:
        """Whether a weight, an option, ``alpha`` or ``smoothing`` is a schedule of the step."""
        return (
            is_scheduled(self.alpha)
            or is_scheduled(self.smoothing)
            or any(is_scheduled(v) for reg in self.regularizers for v in (reg.weight, *dict(reg.options).values()))
        )

    def __call__(
        self,
        output: ModelOutput,
        params,
        labels,
        balancer: losses.BalancerState,
        *,
        step=None,
    ):
        """``(loss, terms, balancer)``: the scalar objective, a dict of its parts (``task``, each regulariser's
        unweighted value under its :attr:`Regularizer.label`, ``flow`` with a flow, the scheduled values at
        ``step``), and the updated balancer state. ``step`` (``[]`` int, traced in the train step: batches trained
        so far) is needed when something is scheduled."""
        if step is None and self.scheduled:
            raise ValueError("the objective has scheduled hyperparameters: pass step (TrainState.step)")
        task = self.task_loss(output, labels)
        terms = {"task": task}
        reg_total = jnp.zeros((), task.dtype)
        for reg in self.regularizers:
            terms[reg.label] = self.regularizer_value(reg, output, params, labels, step=step)
            scheduled = {k: jnp.asarray(v, task.dtype) for k, v in reg.scheduled_values(step).items()}
            terms.update(scheduled)
            reg_total = reg_total + scheduled.get(f"{reg.label}/weight", reg.weight) * terms[reg.label]
        joint = {
            f"joint/{name}": jnp.asarray(value_at(v, step), task.dtype)
            for name, v in (("alpha", self.alpha), ("smoothing", self.smoothing))
            if is_scheduled(v)
        }
        terms.update(joint)
        if self.combine == "sum":
            loss = task + reg_total
        elif self.combine == "weighted":
            alpha = joint["joint/alpha"] if is_scheduled(self.alpha) else self.alpha
            loss = alpha * task + (1 - alpha) * reg_total
        else:
            loss, balancer = losses.balancer_update(
                balancer, jnp.stack([task, reg_total]), smoothing=joint.get("joint/smoothing", self.smoothing)
            )
        if output.flow_log_likelihood is not None:
            terms["flow"] = flow_loss(output.flow_log_likelihood, output.flow_mask)
            loss = loss + terms["flow"]
        return loss, terms, balancer
