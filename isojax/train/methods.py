"""The isotropy methods and their regularisers, defined once: names, default weights, representations, options
and the text forms of schedules. Plain data and checks (the standard library only): the configuration
(:mod:`isojax.train.config`) holds these values, :mod:`isojax.train.objective` binds each regulariser to its
function and :mod:`isojax.train.hyperparams` each schedule kind to its optax schedule.

Methods (:data:`METHODS`; extra regularisers can be added to any of them):

    baseline              task loss only (alias: none)
    softdecay             SoftDecay on the last layer's token states, alpha learned (softdecay §5.2, Table 2)
    cosine, spectrum_pol, spectrum_exp
                          + a regulariser of the word embedding matrix (calibration-evaluation Table 1)
    isoscore              + log(1/IsoScore) of the batch's [CLS] vectors
    istar                 + 1 - IsoScore* of the batch's [CLS] vectors (I-STAR)
    persistent_entropy    + class-wise persistent entropy of selected 0-dim bars of [CLS] (shrink-the-longest)
    persistent_entropy_all  the same over all bars (the paper's ablation)
    isobn                 IsoBN on the pooled representation before the head (Zhou et al. 2021)
    isotropy_layer        fine-tune, then train an Isotropy Layer before the frozen head on the balanced joint loss
                          of the task loss and log(1/IsoScore) of the head input (isotropy-layer-joint-loss §3)
    flow                  flow calibration: a Glow flow before the head, trained by maximum likelihood

Schedules of the step as text (``N`` > 0 and ``S`` >= 0 integers of steps, the others numbers)::

    constant:V   linear:A:B:N[:S]   warmup:V:N[:S]   cosine:A:N[:F]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

REPRESENTATIONS = {
    "cls": "last-layer [CLS] state (a causal LM's: its last real token, what its classification head reads), [B, H]",
    "pooler": "the encoder's pooler output tanh(W h_[CLS] + b), [B, H] (models with a pooler)",
    "sentence": "the pooled sentence embedding (--pooling), [B, H]",
    "head_input": "what the head reads: the sentence embedding after IsoBN / Isotropy Layer, [B, H]",
    "tokens": "all real last-layer token states of the batch as one cloud, [B*L, H] with the attention mask",
    "embedding": "the word (= tied output) embedding matrix W, [V, H]",
}
BATCH_REPRESENTATIONS = tuple(r for r in REPRESENTATIONS if r != "embedding")
SEQ2SEQ_REPRESENTATIONS = ("embedding", "tokens")

SCHEDULE_ARGUMENTS = {
    "constant": (("V",), 1),
    "linear": (("A", "B", "N", "S"), 3),
    "warmup": (("V", "N", "S"), 2),
    "cosine": (("A", "N", "F"), 2),
}
"""kind -> (its arguments in order, how many are required)."""
SCHEDULE_KINDS = tuple(SCHEDULE_ARGUMENTS)
_STEP_ARGUMENTS = {"N": "a positive integer", "S": "a non-negative integer"}


def is_schedule_text(text: object) -> bool:
    """Whether ``text`` is written as a schedule (``KIND:...`` with a kind of :data:`SCHEDULE_KINDS`).

    Args:
      text: a hyperparameter as written on the command line or in JSON (anything else is not schedule text).

    Returns:
      A bool.

    Examples:
      >>> is_schedule_text("warmup:0.1:500"), is_schedule_text("0.1"), is_schedule_text("step:1")
      (True, False, False)
    """
    return isinstance(text, str) and ":" in text and text.partition(":")[0].strip() in SCHEDULE_ARGUMENTS


def schedule_args(kind: str, args: tuple) -> tuple:
    """The arguments of a schedule ``kind`` checked and normalised (``N``, ``S`` as ints, the others as floats);
    ``ValueError`` naming the kind and argument."""
    if kind not in SCHEDULE_ARGUMENTS:
        raise ValueError(f"schedule kind must be one of {list(SCHEDULE_KINDS)}, got {kind!r}")
    names, required = SCHEDULE_ARGUMENTS[kind]
    if not required <= len(args) <= len(names):
        raise ValueError(
            f"schedule {kind} takes {kind}:{':'.join(names)} ({required} to {len(names)} numbers), got "
            f"{len(args)}: {args!r}"
        )
    out: list[float | int] = []
    for name, value in zip(names, args):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"schedule {kind}: {name} must be a finite number, got {value!r}")
        if name in _STEP_ARGUMENTS:
            if value != int(value) or value < (1 if name == "N" else 0):
                raise ValueError(f"schedule {kind}: {name} (steps) must be {_STEP_ARGUMENTS[name]}, got {value!r}")
            out.append(int(value))
        else:
            out.append(float(value))
    return tuple(out)


def parse_schedule(text: str) -> tuple[str, tuple]:
    """``"linear:0:1:500"`` -> ``("linear", (0.0, 1.0, 500))``; ``ValueError`` naming the text.

    Examples:
      >>> parse_schedule("warmup:0.1:500:100")
      ('warmup', (0.1, 500, 100))
    """
    kind, *fields = [f.strip() for f in text.split(":")]
    try:
        args = tuple(float(f) for f in fields)
    except ValueError:
        raise ValueError(f"schedule {text!r}: the fields after {kind!r} must be numbers") from None
    try:
        return kind, schedule_args(kind, args)
    except ValueError as e:
        raise ValueError(f"schedule {text!r}: {e}") from None


def check_number_or_schedule(value: Any, name: str) -> float | str:
    """A hyperparameter as configured: a finite number (returned as a float) or schedule text (checked, returned
    in its canonical form, ``"linear:0.0:1.0:500"``); ``ValueError`` / ``TypeError`` naming ``name``."""
    if isinstance(value, str):
        if is_schedule_text(value):
            kind, args = parse_schedule(value)
            return ":".join([kind, *map(repr, args)])
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} {value!r} is not a number or a schedule ({', '.join(SCHEDULE_KINDS)})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number or a schedule of the step, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class RegularizerDefaults:
    """What a regulariser is by default: the representation it acts on, one line of description, its options
    with their defaults, and the representations it accepts."""

    representation: str
    description: str
    options: tuple[tuple[str, Any], ...] = ()
    representations: tuple[str, ...] = tuple(REPRESENTATIONS)


REGULARIZERS: dict[str, RegularizerDefaults] = {
    "cosine": RegularizerDefaults("embedding", "mean pairwise cosine of the rows (Gao et al. 2019)"),
    "spectrum_pol": RegularizerDefaults(
        "embedding", "spectrum control, polynomial prior c1 k^gamma", (("c1", "auto"), ("gamma", -0.5))
    ),
    "spectrum_exp": RegularizerDefaults(
        "embedding",
        "spectrum control, exponential prior c1 exp(-c2 k^gamma)",
        (("c1", "auto"), ("c2", 0.005), ("gamma", 1.0)),
    ),
    "isoscore": RegularizerDefaults("cls", "log(1/IsoScore) of the batch", (), BATCH_REPRESENTATIONS),
    "istar": RegularizerDefaults(
        "cls",
        "1 - IsoScore* (I-STAR) of the batch; c0 = identity or data "
        "(covariance of the representation over the training set at the start)",
        (("zeta", 0.2), ("c0", "identity")),
        BATCH_REPRESENTATIONS,
    ),
    "persistent_entropy": RegularizerDefaults(
        "cls",
        "minus the persistent entropy of the 0-dim barcode, per class",
        (("bars", "selected"), ("classwise", True), ("in_cluster_weight", 0.0), ("bins", 5)),
        BATCH_REPRESENTATIONS,
    ),
}


def regularizer_fields(name: str, representation: str | None, options) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The representation (default filled) and every option (defaults filled, sorted by name) of regulariser
    ``name``; ``ValueError`` for an unknown name, option or representation."""
    defaults = REGULARIZERS.get(name)
    if defaults is None:
        raise ValueError(f"unknown regulariser {name!r}; expected one of {sorted(REGULARIZERS)}")
    representation = defaults.representation if representation is None else representation
    if representation not in defaults.representations:
        raise ValueError(
            f"regulariser {name}: unknown or unsupported representation {representation!r}; expected one of "
            f"{list(defaults.representations)}"
        )
    given = dict(options)
    unknown = sorted(set(given) - set(dict(defaults.options)))
    if unknown:
        raise ValueError(f"regulariser {name}: unknown option(s) {unknown}; it takes {dict(defaults.options)}")
    return representation, tuple(sorted({**dict(defaults.options), **given}.items()))


def _option_text(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if is_schedule_text(value):
        return value
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


@dataclasses.dataclass(frozen=True)
class RegularizerSpec:
    """A configured regulariser term: ``weight * REGULARIZERS[name](representation, **options)``, weight and float
    options numbers or schedule text. Checked on construction; options hold every option, defaults filled.

    Attributes:
      name: a key of :data:`REGULARIZERS`.
      weight: ``lambda``, a number or schedule text (``"linear:0:1:500"``).
      representation: a key of :data:`REPRESENTATIONS` the regulariser accepts; None: its default.
      options: ``(name, value)`` pairs overriding its defaults.

    Examples:
      >>> spec = RegularizerSpec.parse("persistent_entropy=0.1@cls,bars=all,classwise=false")
      >>> spec.label, spec.weight, spec.options
      ('persistent_entropy@cls', 0.1, (('bars', 'all'), ('bins', 5), ('classwise', False), ('in_cluster_weight', 0.0)))
      >>> RegularizerSpec.parse("istar=linear:0:1:500").weight
      'linear:0.0:1.0:500'
    """

    name: str
    weight: Any = 1.0
    representation: str | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        representation, options = regularizer_fields(self.name, self.representation, self.options)
        object.__setattr__(self, "representation", representation)
        object.__setattr__(self, "weight", check_number_or_schedule(self.weight, f"regulariser {self.name}: weight"))
        options = tuple(
            (key, check_number_or_schedule(value, f"regulariser {self.name}: option {key}"))
            if is_schedule_text(value)
            else (key, value)
            for key, value in options
        )
        object.__setattr__(self, "options", options)

    @property
    def label(self) -> str:
        """``name@representation``, the key of this term in the logged metrics."""
        return f"{self.name}@{self.representation}"

    @property
    def needs_reference(self) -> bool:
        """Whether the term needs a reference statistic of the training data (I-STAR with ``c0="data"``)."""
        return dict(self.options).get("c0") == "data"

    @classmethod
    def parse(cls, text: str) -> RegularizerSpec:
        """Parse ``NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...]`` (``isojax finetune --reg``); option values read
        as bool, int, float, schedule or string. ``ValueError`` naming ``text``."""
        head, *opts = [p.strip() for p in text.split(",")]
        head, _, rep = head.partition("@")
        name, _, weight = head.partition("=")
        options = []
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep:
                raise ValueError(f"regulariser {text!r}: option {opt!r} is not KEY=VALUE")
            options.append((key.strip(), _option_text(value.strip())))
        try:
            return cls(name.strip(), weight.strip() or 1.0, rep.strip() or None, tuple(options))
        except (TypeError, ValueError) as e:
            raise ValueError(f"regulariser {text!r}: {e}") from None

    @property
    def text(self) -> str:
        """The ``NAME=WEIGHT@REPRESENTATION[,KEY=VALUE...]`` form that :meth:`parse` reads back."""
        options = "".join(f",{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.options)
        return f"{self.name}={self.weight}@{self.representation}{options}"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "weight": self.weight,
            "representation": self.representation,
            "options": self.options,
        }

    @classmethod
    def from_json(cls, data: Any) -> RegularizerSpec:
        """A spec of its :meth:`to_json` dict, its text (:meth:`parse`) or itself."""
        if isinstance(data, RegularizerSpec):
            return data
        if isinstance(data, str):
            return cls.parse(data)
        if not isinstance(data, dict):
            raise TypeError(f"a regulariser is a dict, its text or a RegularizerSpec, got {type(data).__name__}")
        return cls(**{**data, "options": tuple(tuple(o) for o in data.get("options", ()))})


@dataclasses.dataclass(frozen=True)
class Method:
    """An isotropy method: the regularisers it adds to the task loss and the model changes it makes.

    Attributes:
      description: one line, shown by ``isojax finetune --help``.
      regularizers: the terms it adds to the task loss.
      softdecay: whether SoftDecay acts on the encoder's last layer.
      isobn: whether IsoBN normalises the pooled representation.
      isotropy_layer: whether an Isotropy Layer stage follows fine-tuning.
      flow: whether a Glow flow sits before the head.
    """

    description: str
    regularizers: tuple[RegularizerSpec, ...] = ()
    softdecay: bool = False
    isobn: bool = False
    isotropy_layer: bool = False
    flow: bool = False


METHODS: dict[str, Method] = {
    "baseline": Method("task loss only"),
    "softdecay": Method("SoftDecay on the last layer, learnable alpha", softdecay=True),
    "cosine": Method("cosine regularisation of the word embeddings", (RegularizerSpec("cosine", 1.0),)),
    "spectrum_pol": Method(
        "polynomial spectrum control of the word embeddings", (RegularizerSpec("spectrum_pol", 1e-3),)
    ),
    "spectrum_exp": Method(
        "exponential spectrum control of the word embeddings", (RegularizerSpec("spectrum_exp", 1e-3),)
    ),
    "isoscore": Method("log(1/IsoScore) of the batch's [CLS] vectors", (RegularizerSpec("isoscore", 0.1),)),
    "istar": Method("I-STAR: 1 - IsoScore* of the batch's [CLS] vectors", (RegularizerSpec("istar", 1.0),)),
    "persistent_entropy": Method(
        "class-wise persistent entropy of the selected bars of [CLS]", (RegularizerSpec("persistent_entropy", 0.1),)
    ),
    "persistent_entropy_all": Method(
        "class-wise persistent entropy of all bars of [CLS]",
        (RegularizerSpec("persistent_entropy", 0.1, options=(("bars", "all"),)),),
    ),
    "isobn": Method("IsoBN on the pooled representation", isobn=True),
    "isotropy_layer": Method("two-stage Isotropy Layer with the balanced joint loss", isotropy_layer=True),
    "flow": Method("flow calibration: a Glow flow before the head, trained by maximum likelihood", flow=True),
}
METHOD_ALIASES = {"none": "baseline"}
SEQ2SEQ_METHODS = ("baseline", "cosine", "spectrum_pol", "spectrum_exp", "flow")
"""The methods of isotropy-calibration-evaluation §3 that act on a sequence-to-sequence model (Tables 2, 3)."""
ISOTROPY_LAYER_TERM = RegularizerSpec("isoscore", 1.0, "head_input")
"""The regulariser of the Isotropy Layer stage: log(1/IsoScore) of what the head reads."""


def method(name: str) -> Method:
    """Look a method up by name (or alias); ``ValueError`` listing the choices for an unknown one.

    Examples:
      >>> [(reg.name, reg.weight, reg.representation) for reg in method("istar").regularizers]
      [('istar', 1.0, 'cls')]
      >>> method("none") == method("baseline"), method("softdecay").softdecay
      (True, True)
    """
    key = METHOD_ALIASES.get(name, name)
    if key not in METHODS:
        raise ValueError(f"method: unknown method {name!r}; expected one of {sorted(METHODS) + sorted(METHOD_ALIASES)}")
    return METHODS[key]
