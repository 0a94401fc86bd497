"""The fine-tuned model: an encoder, optional isotropy modules, and a classification or regression head.

    h_L, pooler = Encoder(input_ids)                      (optional SoftDecay on the last layer: the encoder's
                                                           ``last_layer_transform``; a causal LM serves as well)
    sentence    = pool(h_L, method)                       (cls, last, pooler, mean, first_last_avg, last2avg; a
                                                           causal LM's cls is its last real token)
    head_input  = IsotropyLayer(IsoBN(Flow(sentence)))    (each optional)
    logits      = Dense(Dropout(head_input))              ([B, num_labels]; num_labels = 1 is regression)

Parameters: ``params["encoder"]`` is the encoder's own tree (so pretrained weights drop in unchanged),
``params["flow"]``, ``params["isotropy_layer"]``, ``params["head"]``; IsoBN keeps its running statistics in
``batch_stats["isobn"]``, the flow its constants in ``constants["flow"]``.

Flow calibration (method ``flow``; isotropy-calibration-evaluation Table 1's +Flow row, BERT-flow during
fine-tuning): the head reads ``z = f(sentence)``, the pooled sentence embedding mapped by a Glow flow
(:class:`isojax.calibrate.Flow`, BERT-flow's 3 levels x depth 3, coupling width 32) towards a standard Gaussian,
and the output carries ``log p(sentence) / d`` of every example, whose negative mean the objective adds to the
task loss. The task loss reaches the encoder through ``f`` but not ``f``'s parameters; the likelihood reaches
only ``f``'s parameters (BERT-flow's fine-tuning code). The flow's ActNorm starts from the pretrained encoder's
sentence embeddings of the first training batch(es) (:func:`init_variables`).
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from isojax.calibrate import Flow, IsoBN, IsotropyLayer
from isojax.losses import balancer_factors
from isojax.models import registry
from isojax.models.encoder import TRANSFORM
from isojax.models.heads import ClassificationHead, pool
from isojax.softdecay import SoftDecay, alpha_from_param
from isojax.train.config import TrainConfig


@flax.struct.dataclass
class TaskOutput:
    """What :class:`TaskModel` returns: ``logits [B, num_labels]`` (float32) and the representations
    ``cls``, ``pooler`` (None without a pooler), ``sentence``, ``head_input`` (``[B, H]``), ``tokens [B, L, H]``
    with their ``mask [B, L]``; ``flow_log_likelihood [B]``: ``log p(sentence) / d`` under the flow (None
    without one)."""

    logits: jax.Array
    cls: jax.Array
    pooler: jax.Array | None
    sentence: jax.Array
    head_input: jax.Array
    tokens: jax.Array
    mask: jax.Array
    flow_log_likelihood: jax.Array | None = None

    @property
    def flow_mask(self) -> None:
        """Which rows of ``flow_log_likelihood`` are real: all of them (None)."""
        return None


class TaskModel(nn.Module):
    """Encoder + pooling + optional IsoBN / Isotropy Layer + :class:`ClassificationHead` (see module docstring).

    ``__call__(input_ids, attention_mask, token_type_ids=None, *, deterministic=True)`` returns a :class:`TaskOutput`.
    IsoBN updates its running statistics when ``deterministic=False`` (call with ``mutable=["batch_stats"]``).
    ``INPUTS``: the batch arrays ``__call__`` takes, in order.

    Attributes:
      encoder: an :class:`isojax.models.EncoderModel` (its SoftDecay, if any, is its ``last_layer_transform``).
      num_labels: the head's outputs; 1 is regression.
      pooling: the sentence representation the head reads: ``cls``, ``pooler``, ``mean``, ``first_last_avg`` or
        ``last2avg``.
      dropout_rate: the head's dropout.
      use_isobn: IsoBN on the sentence embedding.
      use_isotropy_layer: the Isotropy Layer on the sentence embedding.
      flow: a :class:`isojax.calibrate.Flow` to calibrate the sentence embedding with, or ``None``.
      axis_name: the ``pmap`` axis over which IsoBN averages its batch statistics (``None``: no ``pmap``).
    """

    encoder: nn.Module
    num_labels: int
    pooling: str = "cls"
    dropout_rate: float = 0.1
    use_isobn: bool = False
    use_isotropy_layer: bool = False
    flow: Flow | None = None
    axis_name: str | None = None

    INPUTS = ("input_ids", "attention_mask", "token_type_ids")

    def setup(self):
        self.isobn = IsoBN(axis_name=self.axis_name) if self.use_isobn else None
        self.isotropy_layer = IsotropyLayer() if self.use_isotropy_layer else None
        self.head = ClassificationHead(self.num_labels, self.dropout_rate)

    def heads(self, sentence, deterministic: bool = True):
        """``(head_input, logits)`` from pooled sentence embeddings ``[B, H]``: the part after the encoder."""
        h = sentence
        if self.flow is not None:
            h = self.flow(h)
        if self.isobn is not None:
            h = self.isobn(h, use_running_average=deterministic)
        if self.isotropy_layer is not None:
            h = self.isotropy_layer(h)
        return h, self.head(h, deterministic)

    def embed(self, input_ids, attention_mask, token_type_ids=None, *, deterministic: bool = True):
        """``(encoder output, mask [B, L] bool, pooled sentence [B, H])``: the part up to the heads (a causal LM's
        ``cls`` pooling reads its last real token)."""
        token_type_ids = registry.token_types(self.encoder.config, token_type_ids)
        out = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        mask = jnp.asarray(attention_mask).astype(bool)
        causal = registry.model_kind(self.encoder.config) == "causal_lm"
        return out, mask, pool(out, mask, "last" if causal and self.pooling == "cls" else self.pooling)

    def flow_features(self, input_ids, attention_mask, token_type_ids=None):
        """``(sentence [B, H], None)``: what the flow transforms, and its mask (every row is real)."""
        return self.embed(input_ids, attention_mask, token_type_ids)[2], None

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *, deterministic: bool = True) -> TaskOutput:
        out, mask, sentence = self.embed(input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        h, logits = self.heads(sentence, deterministic)
        log_likelihood = None if self.flow is None else self.flow.log_likelihood(sentence)
        causal = registry.model_kind(self.encoder.config) == "causal_lm"
        return TaskOutput(
            logits=logits,
            cls=pool(out, mask, "last") if causal else out.last_hidden_state[:, 0],
            pooler=getattr(out, "pooler_output", None),
            sentence=sentence,
            head_input=h,
            tokens=out.last_hidden_state,
            mask=mask,
            flow_log_likelihood=log_likelihood,
        )

    @property
    def has_pooler(self) -> bool:
        return registry.has_pooler(self.encoder)

    def partition_rules(self):
        """Partition rules of every parameter: the encoder's (:func:`isojax.models.registry.partition_rules`)
        and the task layers' (replicated: they are small)."""
        return registry.partition_rules(self.encoder.config) + HEAD_PARTITION_RULES


HEAD_PARTITION_RULES = ((r"(^|/)(head|isotropy_layer|flow)/", P()),)


def method_state(model: nn.Module, params, batch_stats, balancer=None) -> dict[str, jax.Array]:
    """Scalars of a method's learnt state, logged with every train record (``[]`` float32 arrays, cheap to compute;
    their keys start with one of :data:`isojax.train.logs.METHOD_STATE`):

    * ``softdecay@<placement>/alpha`` and ``/theta``: SoftDecay's α (:func:`isojax.softdecay.alpha_from_param`) and
      its parameter, where the encoder has a SoftDecay (placement ``output`` or ``block``);
    * ``isotropy_layer/kernel_deviation`` ``‖K − I‖_F / √d`` and ``isotropy_layer/bias_norm`` ``‖b‖``;
    * ``isobn/std_min``, ``isobn/std_max``: the range of IsoBN's running standard deviations;
    * ``balancer/weight_task``, ``balancer/weight_regularizers``: the joint-loss balancer's factors ``L̄ / L̄_i`` for the
      next step (:func:`isojax.losses.balancer_update`), where ``balancer`` (its state) is given.

    Args:
      model: the task model (any model: what it lacks is left out).
      params: its params.
      batch_stats: its ``batch_stats`` collection.
      balancer: the :class:`isojax.losses.BalancerState` of a run that balances its losses, else None.
    """
    state: dict[str, jax.Array] = {}
    encoder = getattr(model, "encoder", None)
    transform = getattr(encoder, "last_layer_transform", None)
    if isinstance(transform, SoftDecay):
        theta = params["encoder"][TRANSFORM]["theta"]
        key = f"softdecay@{getattr(encoder, 'transform_placement', 'output')}"
        state |= {f"{key}/alpha": alpha_from_param(theta, transform.alpha_init), f"{key}/theta": theta}
    if "isotropy_layer" in params:
        dense = params["isotropy_layer"]["dense"]
        d = dense["kernel"].shape[0]
        state["isotropy_layer/kernel_deviation"] = jnp.linalg.norm(dense["kernel"] - jnp.eye(d)) / d**0.5
        state["isotropy_layer/bias_norm"] = jnp.linalg.norm(dense["bias"])
    if "isobn" in batch_stats:
        std = batch_stats["isobn"]["std"]
        state |= {"isobn/std_min": std.min(), "isobn/std_max": std.max()}
    if balancer is not None:
        weights = balancer_factors(balancer.means)
        state |= {"balancer/weight_task": weights[0], "balancer/weight_regularizers": weights[1]}
    return {k: jnp.asarray(v, jnp.float32) for k, v in state.items()}


def word_embeddings(params) -> jax.Array:
    """The word (input = tied output) embedding matrix ``W [V, E]`` of a :class:`TaskModel`'s params."""
    return registry.word_embeddings(params["encoder"])


def init_variables(model: TaskModel, encoder_params, key, flow_rows=None) -> dict:
    """Variables of ``model``: the pretrained ``encoder_params`` and freshly initialised heads.

    The flow, IsoBN statistics, Isotropy Layer and head are initialised on their own, without running the encoder.

    Args:
      model: the :class:`TaskModel`.
      encoder_params: the pretrained encoder's params (placed unchanged under ``params["encoder"]``).
      key: a ``jax.random`` key for the heads.
      flow_rows: ``[N, H]`` sentence embeddings that the flow's ActNorm starts from (:meth:`TaskModel.flow_features`
        of the pretrained encoder on the first training batches); needed with a flow (else ``ValueError``), unused
        without.

    Returns:
      ``{"params": ..., "batch_stats": ..., "constants": ...}`` (``{}`` without IsoBN / a flow); the head's kernel
      is ``[H, num_labels]``.

    Examples:
      >>> from isojax.models import TransformerConfig, build_encoder
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> model = TaskModel(build_encoder(config), num_labels=3, use_isobn=True)
      >>> variables = init_variables(model, {"pretrained": "weights"}, jax.random.key(0))
      >>> sorted(variables["params"]), variables["params"]["encoder"], sorted(variables["batch_stats"])
      (['encoder', 'head'], {'pretrained': 'weights'}, ['isobn'])
      >>> jax.tree.map(jnp.shape, variables["params"]["head"])
      {'classifier': {'bias': (3,), 'kernel': (8, 3)}}
    """
    if model.flow is None:
        sentence = jnp.zeros((1, model.encoder.config.hidden_size), jnp.float32)
    elif flow_rows is None:
        raise ValueError("flow_rows is needed to start the flow's ActNorm (the pretrained sentence embeddings)")
    else:
        sentence = flow_rows
    variables = model.init(key, sentence, method=TaskModel.heads)
    return {
        "params": dict(variables["params"], encoder=encoder_params),
        "batch_stats": variables.get("batch_stats", {}),
        "constants": variables.get("constants", {}),
    }


def make_flow(config: TrainConfig) -> Flow | None:
    """The flow of method ``flow`` (:class:`isojax.calibrate.Flow` of the configuration's ``flow`` section), else
    None."""
    if not config.method_spec.flow:
        return None
    assert config.flow is not None  # TrainConfig fills the section for method flow
    return Flow(levels=config.flow.levels, depth=config.flow.depth, hidden=config.flow.hidden)
