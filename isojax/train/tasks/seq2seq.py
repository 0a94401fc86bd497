"""Sequence-to-sequence fine-tuning of BART / mBART with the calibration methods of isotropy-calibration-evaluation
§3 (Tables 2, 3 and 5): the same loop, devices, checkpoints and logs as classification (:func:`isojax.train.fit`),
with what differs for an encoder-decoder here, behind :class:`Seq2SeqRecipe` (a
:class:`~isojax.train.tasks.base.TaskRecipe`).

**Batches.** Sources are tokenised to ``max_length`` tokens, targets (``text_target``) to ``max_target_length``;
``labels [B, T]`` are the target ids with padding set to ``-100`` (ignored), ``decoder_input_ids`` the labels
shifted right (:func:`shift_tokens_right`: behind ``decoder_start_token_id`` for BART, behind the last real label
token, the target language code, for mBART, as transformers' models shift them), ``decoder_attention_mask`` true at
the real target positions.

**Loss.** Teacher forcing: ``logits = Seq2SeqModel(input_ids, decoder_input_ids)``, and the task loss is the
label-smoothed cross-entropy (:func:`label_smoothed_cross_entropy`) averaged over the real target tokens of the
global batch. Regularisers act on the ``embedding`` representation (the shared input = output embedding matrix W,
cosine regularisation and spectrum control of §3) or on ``tokens`` (the decoder's last hidden states of the real
target tokens, the ``h`` of §3's softmax).

**Flow calibration** (§3 "Flow Model", Tables 2, 3, 5 +Flow). §3 writes the softmax ``P(y | h) ∝ exp(hᵀ W_y)`` and
calibrates the shared space through ``h``: a flow ``f`` maps the contextual embeddings ``h`` to an isotropic
Gaussian space. Here ``f`` (:class:`isojax.calibrate.Flow`, BERT-flow's Glow: 3 levels x depth 3, coupling width 32)
sits between the decoder's last hidden state and the tied LM head, so that
``logits = f(h) Wᵀ + final_logits_bias`` in training and in decoding. ``f`` is trained on the decoder states of
the real target tokens of every batch, by maximum likelihood: ``L_flow = -mean_t log p(h_t) / d`` is added to the
task loss (:mod:`isojax.train.objective`). As in BERT-flow's fine-tuning code, the task loss trains the model
*through* ``f`` (not ``f``'s parameters) and ``L_flow`` trains only ``f``'s parameters (not the model): one loss
whose terms' gradients reach disjoint parameters. ``f``'s ActNorm starts from the pretrained model's decoder
states of the first training batch(es) (``flow_init_batches``), so at the start ``f(h)`` standardises ``h``; the
pretrained ``W`` has to adapt to ``f``'s space during fine-tuning. W itself is not transformed, so I1/I2 of W
measure how fine-tuning moved W.

**Evaluation.** The dev sources are decoded (:func:`isojax.models.generate.generate`, greedy or beam search with
``num_beams``, ``length_penalty``, ``generation_max_length``) under ``jit`` on the mesh or under ``pmap``, the
outputs detokenised (special tokens dropped) and scored against the dev targets as read: BLEU (corpus, sacrebleu)
and ROUGE-1/2/L (rouge-score) as the task asks (:mod:`isojax.eval.generation_metrics`), with I1 and I2 of W
(:func:`isojax.metrics.partition_isotropy`). Time per epoch is the loop's (``timing`` in ``results.json``).
BART's ``final_logits_bias`` is a buffer in transformers and is frozen here (:mod:`isojax.train.optim`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from isojax import metrics
from isojax.calibrate import Flow
from isojax.data.batching import DEFAULT_BUCKETS
from isojax.data.seq2seq import Seq2SeqData, Seq2SeqTask, load_seq2seq, seq2seq_task
from isojax.eval.generation_metrics import generation_metrics
from isojax.models import from_pretrained, registry, require_kind, require_tokenizer
from isojax.models.generate import generate, generation_config
from isojax.train.config import Seq2SeqConfig, Stage, TrainConfig
from isojax.train.evaluation import predict_all
from isojax.train.feed import TokenGroup
from isojax.train.hyperparams import hyperparameter
from isojax.train.model import HEAD_PARTITION_RULES, make_flow, word_embeddings
from isojax.train.objective import ModelOutput, Objective, Regularizer, resolve_auto_options
from isojax.train.state import TrainState
from isojax.train.tasks.base import PredictStep, Runner, check_length, check_room

IGNORE_INDEX = -100
"""Label value of a padding position, left out of the loss (transformers' and PyTorch's ``ignore_index``)."""


def shift_tokens_right(labels, pad_token_id: int, decoder_start_token_id: int | None = None) -> np.ndarray:
    """Decoder inputs for teacher forcing: ``labels [B, T]`` (``-100`` = padding) shifted one position right.

    With ``decoder_start_token_id`` (BART): ``[start, y_0, ..., y_{T-2}]``. Without (mBART): the last real token of
    each row (the target language code) is moved to the front, ``[y_{n-1}, y_0, ..., y_{n-2}]``. ``-100`` becomes
    ``pad_token_id``. These are transformers' ``shift_tokens_right`` of BART and of mBART.

    Args:
      labels: ``[B, T]`` integer target ids, :data:`IGNORE_INDEX` at padding.
      pad_token_id: the id that replaces :data:`IGNORE_INDEX`.
      decoder_start_token_id: BART's start token; ``None``: mBART's shift.

    Returns:
      ``[B, T]`` NumPy array of ``labels``' dtype. Labels that are not an integer ``[B, T]`` array are a
      ``ValueError``.

    Examples:
      >>> labels = np.array([[5, 6, 2, 9, -100]])
      >>> shift_tokens_right(labels, pad_token_id=1, decoder_start_token_id=2)  # BART
      array([[2, 5, 6, 2, 9]])
      >>> shift_tokens_right(labels, pad_token_id=1)  # mBART: the last real token, 9, leads
      array([[9, 5, 6, 2, 9]])
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integer [batch, length], got {labels.dtype} {labels.shape}")
    ids = np.where(labels == IGNORE_INDEX, pad_token_id, labels)
    if decoder_start_token_id is None:
        last = np.maximum((ids != pad_token_id).sum(1) - 1, 0)
        start = ids[np.arange(len(ids)), last]
    else:
        start = np.full(len(ids), decoder_start_token_id)
    return np.concatenate([start[:, None], ids[:, :-1]], axis=1).astype(labels.dtype)


def label_smoothed_cross_entropy(logits, labels, *, label_smoothing: float = 0.0, ignore_index: int = IGNORE_INDEX):
    """Per-token cross-entropy with label smoothing, and the mask of the tokens it counts.

    ``loss_t = (1 - eps) (-log p(y_t)) + eps * mean_c (-log p(c))`` over the ``V`` classes (PyTorch's
    ``cross_entropy(label_smoothing=eps)``; transformers' label smoother), computed as
    ``logsumexp(z) - (1 - eps) z_y - eps mean_c z_c`` in float32.

    Args:
      logits: ``[B, T, V]`` (any float dtype).
      labels: ``[B, T]`` integer target ids; ``ignore_index`` at positions left out.
      label_smoothing: ``eps`` in [0, 1]; traced (a ``jit`` argument is fine).
      ignore_index: the label of positions that get loss 0 and mask False.

    Returns:
      ``(losses, mask)``: ``[B, T]`` float32 losses and ``[B, T]`` bool mask of the counted tokens. Labels whose shape
      is not ``logits.shape[:-1]`` are a ``ValueError``.

    Examples:
      Against the definition, with the log-probabilities computed by NumPy:

      >>> logits = np.array([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
      >>> losses, mask = label_smoothed_cross_entropy(logits, np.array([[0, -100]]), label_smoothing=0.1)
      >>> log_p = logits[0, 0] - np.log(np.exp(logits[0, 0]).sum())
      >>> bool(np.isclose(losses[0, 0], 0.9 * -log_p[0] + 0.1 * -log_p.mean())), float(losses[0, 1]), mask.tolist()
      (True, 0.0, [[True, False]])
    """
    logits = jnp.asarray(logits, jnp.float32)
    labels = jnp.asarray(labels)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"labels must have shape {logits.shape[:-1]} (logits.shape[:-1]), got {labels.shape}")
    mask = labels != ignore_index
    target = jnp.take_along_axis(logits, jnp.where(mask, labels, 0)[..., None], axis=-1)[..., 0]
    losses = (
        jax.nn.logsumexp(logits, axis=-1) - (1 - label_smoothing) * target - label_smoothing * jnp.mean(logits, axis=-1)
    )
    return jnp.where(mask, losses, 0.0), mask


@flax.struct.dataclass
class Seq2SeqTaskOutput:
    """What :class:`Seq2SeqModel` returns (a pytree).

    Attributes:
      logits: ``[B, T, V]`` float32 next-token logits of the teacher-forced decoder.
      tokens: ``[B, T, H]`` the decoder's last hidden states (before the flow).
      mask: ``[B, T]`` bool, the real target positions.
      flow_log_likelihood: ``[B, T]`` ``log p(h_t) / d`` under the flow; ``None`` without one.
    """

    logits: jax.Array
    tokens: jax.Array
    mask: jax.Array
    flow_log_likelihood: jax.Array | None = None

    @property
    def flow_mask(self) -> jax.Array:
        """Which rows of ``flow_log_likelihood`` are real: the real target tokens."""
        return self.mask


class Seq2SeqModel(nn.Module):
    """An encoder-decoder with an optional flow between the decoder and the LM head (module docstring).

    ``__call__(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask)`` is the teacher-forced forward
    (a :class:`Seq2SeqTaskOutput`); :meth:`encode` / :meth:`decode` (with ``config`` and ``dtype``) make it a module
    that :func:`isojax.models.generate.generate` decodes with. ``INPUTS``: the batch arrays ``__call__`` takes.

    Attributes:
      encoder: the BART / mBART network (its params are ``params["encoder"]``, the train state's name for the
        pretrained network).
      flow: a :class:`isojax.calibrate.Flow` applied to the decoder's last hidden states before the tied LM head (its
        params ``params["flow"]``, its constants ``constants["flow"]``), or ``None``.
    """

    encoder: nn.Module
    flow: Flow | None = None

    INPUTS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")

    @property
    def config(self):
        return self.encoder.config

    @property
    def dtype(self):
        return self.encoder.dtype

    def encode(self, input_ids, attention_mask=None, *, deterministic: bool = True):
        return self.encoder.encode(input_ids, attention_mask, deterministic=deterministic)

    def decode(
        self,
        decoder_input_ids,
        encoder_hidden_states,
        encoder_attention_mask=None,
        decoder_attention_mask=None,
        *,
        cache=None,
        deterministic: bool = True,
    ):
        return self.encoder.decode(
            decoder_input_ids,
            encoder_hidden_states,
            encoder_attention_mask,
            decoder_attention_mask,
            cache=cache,
            deterministic=deterministic,
            head_transform=self.flow,
        )

    def flow_features(self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask):
        """``(h [B, T, H], mask [B, T])``: what the flow transforms (the decoder's last hidden states, teacher
        forced) and its real rows."""
        out = self.encoder(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask)
        return out.decoder.last_hidden_state, jnp.asarray(decoder_attention_mask).astype(bool)

    def init_flow(self, rows):
        """Initialise the flow on ``rows [N, H]`` (its ActNorm starts from them)."""
        if self.flow is None:
            raise ValueError("init_flow: this model has no flow")
        return self.flow(rows)

    def __call__(
        self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, *, deterministic: bool = True
    ) -> Seq2SeqTaskOutput:
        out = self.encoder(
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            deterministic=deterministic,
            head_transform=self.flow,
        )
        h, mask = out.decoder.last_hidden_state, jnp.asarray(decoder_attention_mask).astype(bool)
        log_likelihood = None if self.flow is None else self.flow.log_likelihood(h, mask)
        return Seq2SeqTaskOutput(out.logits, h, mask, log_likelihood)

    def partition_rules(self):
        """The encoder-decoder's partition rules, and the flow's (replicated)."""
        return registry.partition_rules(self.encoder.config) + HEAD_PARTITION_RULES


def init_variables(model: Seq2SeqModel, params, key, flow_rows=None) -> dict:
    """The variables of ``model``: the pretrained ``params`` under ``encoder``, and the flow's when it has one.

    Args:
      model: the :class:`Seq2SeqModel`.
      params: the pretrained encoder-decoder's params (placed unchanged).
      key: a ``jax.random`` key for the flow.
      flow_rows: ``[N, H]`` pretrained decoder states of the first training batches, from which the flow's ActNorm
        starts; needed with a flow (else ``ValueError``), unused without.

    Returns:
      ``{"params": {"encoder": params, ["flow": ...]}, "constants": {...}}``.

    Examples:
      >>> init_variables(Seq2SeqModel(encoder=None), {"pretrained": "weights"}, jax.random.key(0))
      {'params': {'encoder': {'pretrained': 'weights'}}, 'constants': {}}
      >>> init_variables(Seq2SeqModel(encoder=None, flow=Flow()), {}, jax.random.key(0))
      Traceback (most recent call last):
      ValueError: flow_rows is needed to start the flow's ActNorm (the pretrained decoder states)
    """
    if model.flow is None:
        return {"params": {"encoder": params}, "constants": {}}
    if flow_rows is None:
        raise ValueError("flow_rows is needed to start the flow's ActNorm (the pretrained decoder states)")
    variables = model.init(key, flow_rows, method=Seq2SeqModel.init_flow)
    return {"params": dict(variables["params"], encoder=params), "constants": variables["constants"]}


@dataclasses.dataclass(frozen=True)
class Seq2SeqObjective(Objective):
    """:class:`~isojax.train.objective.Objective` of a sequence-to-sequence batch.

    The task loss is the label-smoothed token cross-entropy (:func:`label_smoothed_cross_entropy`) averaged over the
    global batch's real target tokens; regularisers see the ``embedding`` matrix or the decoder ``tokens`` (without
    per-row classes: the labels are token ids).

    Attributes:
      label_smoothing: ``eps`` of the cross-entropy, in [0, 1].
      num_labels: the vocabulary size (the other fields are :class:`~isojax.train.objective.Objective`'s).

    Examples:
      The mean over the counted tokens, with ``log 3`` per token under uniform logits:

      >>> import types
      >>> output = types.SimpleNamespace(logits=np.zeros((1, 3, 3)), flow_log_likelihood=None)
      >>> loss, terms, _ = Seq2SeqObjective(num_labels=3)(output, {}, np.array([[0, 2, -100]]), None)
      >>> bool(np.isclose(loss, np.log(3)))
      True
    """

    label_smoothing: float = 0.0

    def task_loss(self, output: ModelOutput, labels):
        losses, mask = label_smoothed_cross_entropy(output.logits, labels, label_smoothing=self.label_smoothing)
        return jnp.sum(losses) / jnp.sum(mask)

    def cloud(self, reg: Regularizer, output: ModelOutput, params, labels):
        """The embedding matrix, or the real decoder states of the global batch, without per-row classes (the
        labels are token ids: a class-wise regulariser sees one class)."""
        return super().cloud(reg, output, params, None)


@dataclasses.dataclass(frozen=True)
class Seq2SeqSplit:
    """The rows of a split as read and how they are tokenised (module docstring): a split of :mod:`isojax.train.feed`.

    ``arrays(rows)`` gives ``input_ids``, ``attention_mask`` ``[n, S]`` and ``decoder_input_ids``,
    ``decoder_attention_mask``, ``labels`` ``[n, T]`` (int32, right-padded to the longest row; labels
    :data:`IGNORE_INDEX` at padding).

    Attributes:
      data: the sources and targets (a :class:`~isojax.data.seq2seq.Seq2SeqData`).
      tokenizer: a Hugging Face tokenizer (sources as text, targets as ``text_target``).
      max_length: source tokens per row (longer sources are truncated).
      max_target_length: target tokens per row.
      decoder_start_token_id: BART's decoder start token; ``None``: mBART's shift (:func:`shift_tokens_right`).
      buckets: the batch widths of the source and of the target tokens (:class:`~isojax.train.feed.TokenGroup`).
    """

    data: Seq2SeqData
    tokenizer: Any
    max_length: int
    max_target_length: int
    decoder_start_token_id: int | None
    buckets: tuple[int, ...] = DEFAULT_BUCKETS

    def __len__(self) -> int:
        return len(self.data)

    @property
    def references(self) -> list[str]:
        return self.data.targets

    def arrays(self, rows) -> dict[str, np.ndarray]:
        """``input_ids``, ``attention_mask`` ``[n, S]`` and ``decoder_input_ids``, ``decoder_attention_mask``,
        ``labels`` ``[n, T]`` (int32, right-padded to the longest row) of ``rows``."""
        rows = list(rows)
        pad = self.tokenizer.pad_token_id

        def encode(texts, length, **target):
            enc = self.tokenizer(
                texts,
                truncation=True,
                max_length=length,
                padding="longest",
                padding_side="right",
                return_tensors="np",
                **target,
            )
            return np.asarray(enc["input_ids"], np.int32), np.asarray(enc["attention_mask"], np.int32)

        ids, mask = encode([self.data.sources[i] for i in rows], self.max_length)
        target_ids, target_mask = encode(None, self.max_target_length, text_target=[self.data.targets[i] for i in rows])
        labels = np.where(target_mask == 1, target_ids, IGNORE_INDEX).astype(np.int32)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "decoder_input_ids": shift_tokens_right(labels, pad, self.decoder_start_token_id),
            "decoder_attention_mask": target_mask,
            "labels": labels,
        }

    @property
    def groups(self) -> tuple[TokenGroup, ...]:
        pad = self.tokenizer.pad_token_id
        return (
            TokenGroup(
                "attention_mask", ("input_ids", "attention_mask"), self.max_length, {"input_ids": pad}, self.buckets
            ),
            TokenGroup(
                "decoder_attention_mask",
                ("decoder_input_ids", "decoder_attention_mask", "labels"),
                self.max_target_length,
                {"decoder_input_ids": pad, "labels": IGNORE_INDEX},
                self.buckets,
            ),
        )


def make_generate_step(model: Seq2SeqModel, **settings):
    """``predict(state, batch) -> {"sequences": [B, max_length]}``: the decoded dev batch.

    Args:
      model: a :class:`Seq2SeqModel` (or any module :func:`isojax.models.generate.generate` decodes with).
      settings: :class:`isojax.models.generate.GenerationConfig` fields (``num_beams``, ``max_length``, ...).

    Returns:
      ``predict(state, batch)``, pure and not jitted: ``state`` with ``params`` and ``constants`` (a
      :class:`~isojax.train.state.TrainState`), ``batch`` with ``input_ids`` and ``attention_mask``; ``sequences``
      ``[B, max_length]`` int32.

    Examples:
      The step decodes as :func:`~isojax.models.generate.generate` does; shown on a tiny random GPT-2 (weights scaled
      up so that its choices vary):

      >>> import types
      >>> from isojax.models import TransformerConfig, build_model, init_params
      >>> config = TransformerConfig(model_type="gpt2", vocab_size=10, hidden_size=8, num_hidden_layers=1,
      ...                            num_attention_heads=2, intermediate_size=16, max_position_embeddings=16,
      ...                            type_vocab_size=0, pre_norm=True, embedding_norm=False)
      >>> module = build_model(config)
      >>> state = types.SimpleNamespace(params=jax.tree.map(lambda w: 8 * w, init_params(module, jax.random.key(1))),
      ...                               constants={})
      >>> batch = {"input_ids": jnp.array([[1, 2], [3, 4]]), "attention_mask": jnp.ones((2, 2), bool)}
      >>> predict = make_generate_step(module, max_length=6)
      >>> predict(state, batch)["sequences"].tolist() == generate(module, state.params, batch["input_ids"],
      ...                                                          max_length=6).sequences.tolist()
      True
    """

    def predict(state, batch: dict):
        collections = {"constants": state.constants} if state.constants else None
        out = generate(
            model, state.params, batch["input_ids"], batch["attention_mask"], collections=collections, **settings
        )
        return {"sequences": out.sequences}

    return predict


def _embedding_isotropy(w):
    i1, i2 = metrics.partition_isotropy(w)
    return {"I1": i1, "I2": i2}


def evaluate(runner, placed_state, data: Seq2SeqSplit, task: Seq2SeqTask, batch_size: int) -> dict[str, float]:
    """The task's generation metrics of the decoded ``data`` (``batch_size`` rows per decoded batch) and I1 / I2 of
    the model's word embedding matrix ``W [V, H]``."""
    sequences = predict_all(runner, placed_state, data, batch_size)["sequences"]
    embeddings = runner.host(word_embeddings(placed_state.params))
    hypotheses = [t.strip() for t in data.tokenizer.batch_decode(sequences, skip_special_tokens=True)]
    out = generation_metrics(task.metrics, hypotheses, data.references)
    return {**out, **{k: float(v) for k, v in jax.jit(_embedding_isotropy)(np.asarray(embeddings, np.float32)).items()}}


class Seq2SeqRecipe:
    """The :class:`~isojax.train.tasks.base.TaskRecipe` of a sequence-to-sequence task (module docstring).

    It knows the model once :meth:`build` has loaded it (``model_config``, ``tokenizer``).

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`) of a sequence-to-sequence task (its ``seq2seq``
        section filled).

    Attributes:
      config: as given.
      task: the :class:`~isojax.data.seq2seq.Seq2SeqTask`.
      metrics: the task's generation metrics (BLEU, ROUGE-1/2/L).
      settings: the configuration's :class:`~isojax.train.config.Seq2SeqConfig`.
      curves: ``("I1", "I2")``: the isotropy of the word embedding matrix.
      eval_split: ``"validation"``.

    Examples:
      >>> from isojax.train.config import TaskConfig
      >>> recipe = Seq2SeqRecipe(TrainConfig(task=TaskConfig("wmt16_en_ro")))
      >>> recipe.metrics, recipe.curves, recipe.settings.label_smoothing
      (('bleu',), ('I1', 'I2'), 0.1)
    """

    curves: tuple[str, ...] = ("I1", "I2")
    eval_split = "validation"

    def __init__(self, config: TrainConfig):
        self.config, self.task = config, seq2seq_task(config.task.name)
        self.metrics: tuple[str, ...] = self.task.metrics
        assert config.seq2seq is not None  # TrainConfig fills the section for a sequence-to-sequence task
        self.settings: Seq2SeqConfig = config.seq2seq

    def build(self) -> tuple[Seq2SeqModel, dict, Any]:
        """``(Seq2SeqModel, pretrained params, tokenizer)``: an encoder-decoder (dtype, dropout off when asked),
        with the configuration's flow; an mBART tokenizer is set to the task's languages."""
        c = self.config
        dtype = jnp.bfloat16 if c.model.dtype == "bfloat16" else jnp.float32
        network, params, tokenizer = from_pretrained(c.model.name, dtype=dtype)
        require_kind(network.config, ("encoder_decoder",), f"sequence-to-sequence fine-tuning ({c.task.name})")
        require_tokenizer(tokenizer, c.model.name, "fine-tuning (isojax finetune)")
        if not c.model.dropout:
            network = registry.build_model(
                dataclasses.replace(
                    network.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, activation_dropout=0.0
                ),
                dtype=dtype,
            )
        if self.task.source_lang and hasattr(tokenizer, "src_lang"):
            tokenizer.src_lang, tokenizer.tgt_lang = self.task.source_lang, self.task.target_lang
        self.model_config, self.tokenizer = network.config, tokenizer
        return Seq2SeqModel(network, flow=make_flow(c)), params, tokenizer

    @property
    def mbart(self) -> bool:
        return self.model_config.model_type == "mbart"

    @property
    def generation(self) -> dict:
        """Decoding settings of the dev set, the configuration's (mBART starts from the target language code, as
        its teacher forcing does)."""
        settings = dict(
            num_beams=self.settings.num_beams,
            length_penalty=self.settings.length_penalty,
            max_length=self.settings.generation_max_length or self.settings.max_target_length + 1,
        )
        if self.mbart and self.task.target_lang:
            settings["decoder_start_token_id"] = self.tokenizer.convert_tokens_to_ids(self.task.target_lang)
        return settings

    def check(self, model: Seq2SeqModel) -> None:
        """The source and target lengths against the positions of the encoder and decoder; the decoding settings."""
        cfg, c = model.config, self.config
        for name, length, stack, which in (
            ("max_length", c.task.max_length, cfg, "encoder"),
            ("max_target_length", self.settings.max_target_length, cfg.decoder_config(), "decoder"),
        ):
            check_length(name, length, stack, f"'s {which}")
        generation_config(cfg, **self.generation)

    def load(self, split: str, tokenizer: Any, limit: int) -> Seq2SeqSplit:
        """The first ``limit`` rows (0 = all) of a split, as read."""
        c = self.config
        check_room(c.task, "max_length", tokenizer)
        check_room(self.settings, "max_target_length", tokenizer)
        data = load_seq2seq(c.task.name, split, source=c.task.data_source)
        n = min(limit, len(data)) if limit else len(data)
        data = dataclasses.replace(data, sources=data.sources[:n], targets=data.targets[:n])
        start = None if self.mbart else self.model_config.decoder_start_token_id
        return Seq2SeqSplit(data, tokenizer, c.task.max_length, self.settings.max_target_length, start, c.task.buckets)

    def init_variables(self, model: Seq2SeqModel, params: dict, key: jax.Array, flow_rows: np.ndarray | None) -> dict:
        return init_variables(model, params, key, flow_rows)

    def references(self, model: Seq2SeqModel, variables: dict, train: Seq2SeqSplit) -> dict[str, jax.Array]:
        return {}  # I-STAR's data covariance is refused for these tasks (TrainConfig)

    def objective(self, stage: Stage, params: dict, references: Mapping[str, jax.Array]) -> Seq2SeqObjective:
        c = self.config
        return Seq2SeqObjective(
            num_labels=self.model_config.vocab_size,
            regularizers=resolve_auto_options(stage.regularizers, params),
            combine=stage.combine,
            alpha=hyperparameter(c.method.joint_alpha, "method.joint_alpha"),
            smoothing=hyperparameter(c.method.balancer_smoothing, "method.balancer_smoothing"),
            references=references,
            label_smoothing=self.settings.label_smoothing,
        )

    def predict_step(self, model: Seq2SeqModel) -> PredictStep:
        return make_generate_step(model, **self.generation)

    def evaluate(self, runner: Runner, placed: TrainState, dev: Seq2SeqSplit) -> dict[str, float]:
        return evaluate(runner, placed, dev, self.task, self.config.optim.eval_batch_size)


__all__ = [
    "IGNORE_INDEX",
    "Seq2SeqModel",
    "Seq2SeqObjective",
    "Seq2SeqRecipe",
    "Seq2SeqSplit",
    "Seq2SeqTaskOutput",
    "init_variables",
    "label_smoothed_cross_entropy",
    "make_generate_step",
    "shift_tokens_right",
]
