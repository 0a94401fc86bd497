"""Flow calibration (BERT-flow, Li et al. 2020; isotropy-calibration-evaluation §2): a Glow-style normalizing
flow fitted by maximum likelihood on frozen embeddings, then used to map them to a standard Gaussian space.

The flow ``f: x -> z`` is a vector Glow (Kingma & Dhariwal 2018). Each of ``levels`` levels applies ``depth``
steps of

1. ActNorm ``h = (x - c) * exp(log_scale) + b`` (``log|det| = sum log_scale``), started from the data so that
   ``h`` has zero mean and unit variance per feature: ``c`` = the mean (a constant), ``b = 0``,
   ``log_scale = -log(max(std, 1e-4 * s))`` with ``s`` the root-mean-square std over features (the floor keeps a
   constant feature near zero; the shift ``b`` is trained in output units);
2. an invertible linear map ``h = W x`` with ``W = P L (U + diag(sign * exp(log_s)))`` (LU parameterisation:
   fixed permutation ``P`` and signs, unit lower-triangular ``L``, strictly upper ``U``;
   ``log|det| = sum log_s``), initialised at a random rotation; the optimiser steps on ``L`` and ``U`` are
   scaled by ``1/sqrt(m)`` (:func:`scale_lu_updates`);
3. an additive coupling ``(x_a, x_b) -> (x_a, x_b + t(x_a))`` with ``t`` a two-hidden-layer ReLU MLP of width
   ``hidden`` whose last layer starts at zero (``log|det| = 0``);

and then (except after the last level) factors out the first half of its features as standard Gaussian
dimensions; the remaining half goes to the next level. ``z`` concatenates the factored-out parts and the output of
the last level, so ``z`` and ``x`` both have ``d`` features and ``log p(x) = log N(z; 0, I) + log|det df/dx|``.

Two ways to use it: :func:`fit_flow` fits the flow post hoc on frozen embeddings (BERT-flow's unsupervised
setting) and :func:`apply_flow` / :func:`invert_flow` apply the fitted :class:`FlowState`; :class:`Flow` is the
same flow as a Linen layer trained *during* fine-tuning (BERT-flow's supervised setting; ``isojax finetune --method
flow``), whose parameters and constants are those of a :class:`FlowState`.

Why ActNorm and the LU steps differ from Glow's, with the measurements: ``docs/design/flow.md``.
"""

from __future__ import annotations

import math
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from isojax._numeric import HIGHEST, promote_float32
from isojax._stats import masked_mean
from isojax._validate import (
    check_cloud,
    check_finite_rows,
    check_float,
    check_hyperparameter,
    check_mask,
    check_positive_int,
    nan_unless,
)

# ActNorm's smallest start std, relative to the root-mean-square std of its input's features.
_STD_FLOOR = 1e-4


class _ActNorm(nn.Module):
    """``y = (x - center) * exp(log_scale) + bias``, started from the data (see the module docstring).

    ``center`` (the start's mean) is fixed in the ``constants`` collection; the trainable ``bias`` lives in the
    standardised output units, so an optimiser step moves ``y`` by the same amount whatever the scale of ``x``.
    """

    @nn.compact
    def __call__(self, x, reverse: bool, init_mask):
        def start():  # data-dependent init (Flax also evaluates it abstractly, for shapes, at apply time)
            mu = masked_mean(x, init_mask)
            var = masked_mean((x - mu) ** 2, init_mask)
            std = jnp.sqrt(jnp.maximum(var, _STD_FLOOR**2 * jnp.mean(var)))
            return mu, -jnp.log(jnp.where(std > 0, std, 1))  # all features constant: nothing to scale

        center = self.variable("constants", "center", lambda: start()[0]).value
        log_scale = self.param("log_scale", lambda _: start()[1])
        bias = self.param("bias", nn.initializers.zeros, log_scale.shape, log_scale.dtype)
        if reverse:
            return (x - bias) * jnp.exp(-log_scale) + center
        return (x - center) * jnp.exp(log_scale) + bias, jnp.sum(log_scale)


def _lu_rotation(key, m: int) -> dict:
    """LU pieces of a random rotation ``W0 = P L U``: the start of :class:`_InvertibleLinear`."""
    w0 = nn.initializers.orthogonal()(key, (m, m), jnp.float32)
    p, lower, upper = jax.scipy.linalg.lu(w0)
    diag = jnp.diagonal(upper)
    return dict(
        perm=jnp.argmax(p, axis=-1),
        sign=jnp.sign(diag),
        log_s=jnp.log(jnp.abs(diag)),
        lower=jnp.tril(lower, -1),
        upper=jnp.triu(upper, 1),
    )


class _InvertibleLinear(nn.Module):
    """``y = x W^T`` with ``W = P L (U + diag(sign * exp(log_s)))``, initialised at a random rotation.

    ``P`` (as ``perm``) and ``sign`` are fixed and live in the ``constants`` collection.
    """

    @nn.compact
    def __call__(self, x, reverse: bool):
        m = x.shape[-1]
        # One key for all five pieces so that they describe the same rotation.
        key = self.make_rng("params") if self.is_initializing() else jax.random.key(0)
        perm = self.variable("constants", "perm", lambda: _lu_rotation(key, m)["perm"]).value
        sign = self.variable("constants", "sign", lambda: _lu_rotation(key, m)["sign"]).value
        log_s = self.param("log_s", lambda _: _lu_rotation(key, m)["log_s"])
        lower = self.param("lower", lambda _: _lu_rotation(key, m)["lower"])
        upper = self.param("upper", lambda _: _lu_rotation(key, m)["upper"])
        lower = jnp.tril(lower, -1) + jnp.eye(m, dtype=lower.dtype)
        upper = jnp.triu(upper, 1) + jnp.diag(sign * jnp.exp(log_s))
        # Exact float32 products: the inverse solves against these factors (TF32 would break invertibility).
        if reverse:
            h = x[..., jnp.argsort(perm)]
            h = jax.scipy.linalg.solve_triangular(lower, h.T, lower=True, unit_diagonal=True)
            return jax.scipy.linalg.solve_triangular(upper, h, lower=False).T
        y = jnp.matmul(jnp.matmul(x, upper.T, precision=HIGHEST), lower.T, precision=HIGHEST)[..., perm]
        return y, jnp.sum(log_s)


def scale_lu_updates() -> optax.GradientTransformation:
    """Scale the updates of every invertible linear map's triangular factors (``lower``, ``upper`` ``[m, m]``) by
    ``1 / sqrt(m)``; other updates pass unchanged. Chain it after the optimiser of a flow's parameters.

    Why: Adam (and AdamW) moves every coordinate by about its learning rate ``lr`` per step, so one step changes a
    triangular factor by ``Delta`` with ``|Delta_ij| ~ lr``: spectral norm ``~ lr sqrt(m)`` for independent signs,
    up to ``lr m`` for coherent ones. At ``m = 768`` and BERT-flow's ``lr = 1e-3`` that is a change of order one
    in ``W`` per step; the measurements are in ``docs/design/flow.md``.

    Returns:
      An ``optax.GradientTransformation`` (stateless) that divides each update leaf named ``lower`` or ``upper``
      (a dict key) by ``sqrt`` of its last dimension.

    Examples:
      >>> import numpy as np
      >>> import optax
      >>> from isojax import calibrate
      >>> optimizer = optax.chain(optax.sgd(1.0), calibrate.scale_lu_updates())
      >>> grads = {"lower": np.ones((4, 4), np.float32), "bias": np.ones(4, np.float32)}
      >>> updates, _ = optimizer.update(grads, optimizer.init(grads))
      >>> float(updates["lower"][0, 0]), float(updates["bias"][0])
      (-0.5, -1.0)
    """

    def scale(path, update):
        name = getattr(path[-1], "key", None)
        return update / math.sqrt(update.shape[-1]) if name in ("lower", "upper") else update

    def update_fn(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(scale, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


class _AdditiveCoupling(nn.Module):
    """``(x_a, x_b) -> (x_a, x_b + t(x_a))``, ``x_a`` the first ``m // 2`` features; zero-initialised output."""

    hidden: int

    @nn.compact
    def __call__(self, x, reverse: bool):
        a = x.shape[-1] // 2
        xa, xb = x[..., :a], x[..., a:]
        h = nn.relu(nn.Dense(self.hidden, name="dense_0")(xa))
        h = nn.relu(nn.Dense(self.hidden, name="dense_1")(h))
        shift = nn.Dense(xb.shape[-1], kernel_init=nn.initializers.zeros, name="dense_out")(h)
        yb = xb - shift if reverse else xb + shift
        return jnp.concatenate([xa, yb], axis=-1)


class _Step(nn.Module):
    """One Glow step: ActNorm -> invertible linear -> additive coupling (inverse in the reverse order)."""

    hidden: int

    @nn.compact
    def __call__(self, x, reverse: bool, init_mask):
        actnorm, linear = _ActNorm(name="actnorm"), _InvertibleLinear(name="linear")
        coupling = _AdditiveCoupling(self.hidden, name="coupling")
        if reverse:
            return actnorm(linear(coupling(x, True), True), True, None)
        x, logdet_a = actnorm(x, False, init_mask)
        x, logdet_w = linear(x, False)
        return coupling(x, False), logdet_a + logdet_w


class _Glow(nn.Module):
    """Multi-scale vector Glow on ``[N, d]`` rows: ``__call__(x) -> (z, logdet)``, ``reverse=True``: ``z -> x``."""

    levels: int
    depth: int
    hidden: int

    @nn.compact
    def __call__(self, x, reverse: bool = False, init_mask=None):
        steps = [
            [_Step(self.hidden, name=f"level{lv}_step{s}") for s in range(self.depth)] for lv in range(self.levels)
        ]
        if reverse:
            sizes = _level_sizes(x.shape[-1], self.levels)
            ends = [sum(sizes[: lv + 1]) for lv in range(self.levels - 1)]
            parts = jnp.split(x, ends, axis=-1)
            h = parts[-1]
            for lv in reversed(range(self.levels)):
                if lv < self.levels - 1:
                    h = jnp.concatenate([parts[lv], h], axis=-1)
                for step in reversed(steps[lv]):
                    h = step(h, True, None)
            return h
        logdet = jnp.zeros((), x.dtype)
        out = []
        h = x
        for lv in range(self.levels):
            for step in steps[lv]:
                h, ld = step(h, False, init_mask)
                logdet = logdet + ld
            if lv < self.levels - 1:
                half = h.shape[-1] // 2
                out.append(h[..., :half])
                h = h[..., half:]
        return jnp.concatenate(out + [h], axis=-1), logdet


def _level_sizes(d: int, levels: int) -> list[int]:
    """Features factored out after each level (the last entry: what the last level outputs)."""
    sizes, m = [], d
    for _ in range(levels - 1):
        sizes.append(m // 2)
        m -= m // 2
    return sizes + [m]


@struct.dataclass
class FlowState:
    """A fitted flow: its Linen variables, its configuration and its training curve.

    Built by :func:`fit_flow`, applied by :func:`apply_flow` and inverted by :func:`invert_flow`; a pytree whose
    ``levels``, ``depth`` and ``hidden`` (ints) are static.

    Attributes:
      params: the Glow's Linen ``params``.
      constants: its ``constants`` collection (permutations, signs, ActNorm centres).
      log_likelihood: ``[steps]`` float32, the mean log-likelihood per dimension (nats) of each training batch
        before its update.
      levels: the number of multi-scale levels.
      depth: flow steps (ActNorm, invertible linear map, additive coupling) per level.
      hidden: the width of the coupling networks.
    """

    params: dict
    constants: dict
    log_likelihood: jax.Array
    levels: int = struct.field(pytree_node=False)
    depth: int = struct.field(pytree_node=False)
    hidden: int = struct.field(pytree_node=False)

    @property
    def variables(self):
        return {"params": self.params, "constants": self.constants}

    @property
    def module(self) -> _Glow:
        return _Glow(self.levels, self.depth, self.hidden)


def _gaussian_log_density(z):
    return -0.5 * jnp.sum(z * z, axis=-1) - 0.5 * z.shape[-1] * math.log(2 * math.pi)


class Flow(nn.Module):
    """The flow as a layer trained during fine-tuning (BERT-flow, Li et al. 2020, as its fine-tuning code does it).

    Two methods, on ``x [..., d]`` with an optional ``mask [...]`` (true = real row; padding rows are transformed
    but left out of the data-dependent start):

    * ``__call__(x, mask) -> z [..., d]``: the calibrated representation ``z = f(x)`` that the model reads on,
      with the flow's parameters held fixed (``stop_gradient``): the task loss trains the network below the
      flow *through* the flow, never the flow itself;
    * ``log_likelihood(x, mask) -> [...]``: ``log p(x) / d`` of each row with ``x`` held fixed, so that its
      negative mean (the maximum-likelihood loss) trains only the flow's parameters.

    This is the split of BERT-flow's fine-tuning (``optimization_bert_flow.py``: the model's parameters get the
    gradient of the task loss alone, the flow's the gradient of the flow loss alone), written as one loss whose
    terms' gradients reach disjoint parameters. Variables: ``params`` and ``constants`` (permutations, signs and
    ActNorm centres) under ``glow``, the trees of a :class:`FlowState` with the same ``levels``, ``depth``,
    ``hidden``. ActNorm starts from the rows the layer is *initialised* with (``init`` with real data: e.g. the
    pretrained model's representations of the first training batch). Computation in float32; ``z`` is returned
    in ``x``'s dtype.

    Attributes:
      levels: the number of multi-scale levels (BERT-flow: 3); ``d`` must exceed ``2**(levels - 1)``.
      depth: flow steps per level (BERT-flow: 3).
      hidden: the width of the coupling networks (BERT-flow: 32).
    """

    levels: int = 3
    depth: int = 3
    hidden: int = 32

    def setup(self):
        self.glow = _Glow(self.levels, self.depth, self.hidden)

    def _rows(self, x, mask):
        x = check_float(x, "x")
        mask = None if mask is None else check_mask(mask, x).reshape(-1)
        if x.ndim < 1 or _level_sizes(x.shape[-1], self.levels)[-1] < 2:
            raise ValueError(
                f"x has shape {x.shape}: needs [..., d] with d > 2**(levels-1) = {2 ** (self.levels - 1)} features"
            )
        rows = x.reshape(-1, x.shape[-1])
        return promote_float32(rows), mask, check_finite_rows(rows, mask, "x")

    def __call__(self, x, mask=None):
        rows, mask, ok = self._rows(x, mask)
        if self.is_initializing():
            z, _ = self.glow(rows, init_mask=mask)
        else:
            fixed = jax.tree.map(jax.lax.stop_gradient, self.glow.variables)
            z, _ = _Glow(self.levels, self.depth, self.hidden, parent=None).apply(fixed, rows)
        return nan_unless(ok, z.reshape(x.shape).astype(jnp.result_type(x)))  # x.dtype as jax holds it

    def log_likelihood(self, x, mask=None):
        rows, mask, ok = self._rows(x, mask)
        z, logdet = self.glow(jax.lax.stop_gradient(rows), init_mask=mask)
        return nan_unless(ok, ((_gaussian_log_density(z) + logdet) / rows.shape[-1]).reshape(x.shape[:-1]))


def fit_flow(
    x,
    key,
    *,
    mask=None,
    levels: int = 3,
    depth: int = 3,
    hidden: int = 32,
    steps: int = 300,
    learning_rate: float = 1e-3,
    batch_size: int = 128,
) -> FlowState:
    """Fit the flow by maximum likelihood on the rows of ``x [..., n, d]`` (frozen embeddings).

    Minimises ``-mean_i log p(x_i) / d`` with ``log p(x) = log N(f(x); 0, I) + log|det df/dx|`` by optax Adam
    (``learning_rate``; the LU factors' steps scaled by :func:`scale_lu_updates`) for ``steps`` steps on
    mini-batches of ``batch_size`` rows drawn with replacement from the rows where ``mask [..., n]`` is true (all
    rows when ``mask=None``; leading axes are pooled). ActNorm layers are initialised from the statistics of all
    real rows; ``key`` seeds the rotations that start the invertible linear maps and the batch draws. Defaults
    follow BERT-flow (3 levels, depth 3, coupling width 32, Adam 1e-3); every level needs at least 2 features, i.e.
    ``d > 2**(levels-1)``. ``learning_rate`` is traced (no recompile for a new value); the integer settings are
    static.

    Args:
      x: float array ``[..., n, d]`` with ``d > 2**(levels-1)`` and at least 2 real rows.
      key: a ``jax.random`` key (the rotations that start the invertible maps, and the batch draws).
      mask: optional bool ``[..., n]``, true = a row that is drawn and enters ActNorm's start.
      levels: static int, the number of levels (each but the last factors out half its features).
      depth: static int, Glow steps per level.
      hidden: static int, width of the coupling MLPs.
      steps: static int, Adam steps.
      learning_rate: float ``> 0`` (traced), Adam's learning rate.
      batch_size: static int, rows per step (drawn with replacement).

    Returns:
      A :class:`FlowState` for :func:`apply_flow` / :func:`invert_flow`; its ``log_likelihood [steps]``
      (float32) is the mean log-likelihood per dimension of each batch before its update.

    Examples:
      A flow fitted for two steps is still invertible, and its log-likelihood curve has one entry per step.

      >>> import jax
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
      >>> state = calibrate.fit_flow(x, jax.random.key(0), levels=1, depth=1, hidden=4, steps=2, batch_size=8)
      >>> state.log_likelihood.shape
      (2,)
      >>> z, _ = calibrate.apply_flow(state, x)
      >>> np.allclose(calibrate.invert_flow(state, z), x, atol=1e-4)
      True
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    for name, value in (
        ("levels", levels),
        ("depth", depth),
        ("hidden", hidden),
        ("steps", steps),
        ("batch_size", batch_size),
    ):
        check_positive_int(value, name)
    learning_rate, learning_rate_ok = check_hyperparameter(learning_rate, "learning_rate", low=0.0, low_open=True)
    d = x.shape[-1]
    if _level_sizes(d, levels)[-1] < 2:  # level inputs shrink, so the last one is the smallest
        raise ValueError(f"x has d={d} features, too few for levels={levels}: need d > 2**(levels-1)")
    rows = promote_float32(x.reshape(-1, d))
    row_mask = jnp.ones(rows.shape[:1], bool) if mask is None else mask.reshape(-1)
    module = _Glow(levels, depth, hidden)
    # A traced learning rate <= 0 or a non-finite real row (traced) makes the learning rate NaN, so the fitted
    # parameters are NaN (loud) rather than fitted uphill or on garbage. Padding rows are never drawn.
    fit = jax.jit(_fit, static_argnames=("module", "steps", "batch_size"))  # one compiled call per shape
    variables, log_likelihood = fit(
        module,
        key,
        rows,
        row_mask,
        nan_unless(ok & learning_rate_ok, learning_rate),
        steps=steps,
        batch_size=batch_size,
    )
    return nan_unless(
        ok,
        FlowState(
            params=variables["params"],
            constants=variables["constants"],
            log_likelihood=log_likelihood,
            levels=levels,
            depth=depth,
            hidden=hidden,
        ),
    )


def _fit(module: _Glow, key, rows, row_mask, learning_rate, *, steps: int, batch_size: int):
    """Data-dependent init, then ``steps`` Adam steps (``lax.scan``) on ``-mean log p / d``; one compiled call."""
    init_key, train_key = jax.random.split(key)
    variables = module.init(init_key, rows, init_mask=row_mask)
    constants = variables["constants"]
    optimizer = optax.chain(optax.adam(learning_rate), scale_lu_updates())
    p = row_mask / jnp.sum(row_mask)

    def negative_log_likelihood(params, batch):
        z, logdet = module.apply({"params": params, "constants": constants}, batch)
        return -jnp.mean(_gaussian_log_density(z) + logdet) / rows.shape[-1]

    def step(carry, step_key):
        params, opt_state = carry
        idx = jax.random.choice(step_key, rows.shape[0], (batch_size,), p=p)
        loss, grads = jax.value_and_grad(negative_log_likelihood)(params, rows[idx])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), -loss

    params = variables["params"]
    (params, _), history = jax.lax.scan(step, (params, optimizer.init(params)), jax.random.split(train_key, steps))
    return {"params": params, "constants": constants}, history


def apply_flow(state: FlowState, x):
    """Apply a fitted flow: map embeddings to its Gaussian space, ``z = f(x)``.

    ``z`` is the calibrated (BERT-flow) embedding; ``logdet = log|det df/dx|`` per row, so
    ``log p(x) = -||z||^2 / 2 - d log(2 pi) / 2 + logdet``.

    Args:
      state: a :class:`FlowState` from :func:`fit_flow`.
      x: float array ``[..., d]`` with the fitted ``d``; every row is mapped independently.

    Returns:
      ``(z [..., d], logdet [...])``, float32.

    Examples:
      Before any real training (two steps at a tiny learning rate) the flow is ActNorm's standardisation
      followed by volume-preserving maps: ``logdet = -sum_j log std_j`` (``std`` with ``ddof=0``).

      >>> import jax
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32) * [1.0, 2.0, 3.0, 4.0]
      >>> state = calibrate.fit_flow(
      ...     x, jax.random.key(0), levels=1, depth=1, hidden=4, steps=2, learning_rate=1e-9, batch_size=8
      ... )
      >>> z, logdet = jax.jit(calibrate.apply_flow)(state, x)  # jit: one compilation, not one per operation
      >>> z.shape, logdet.shape
      ((32, 4), (32,))
      >>> bool(np.isclose(logdet[0], -np.log(x.std(0)).sum(), atol=1e-4))
      True
    """
    x, ok = _check_rows(x, state, "x")
    # apply without mutable= returns the output alone (flax declares the (output, variables) case too)
    z, logdet = cast(
        tuple[jax.Array, jax.Array], state.module.apply(state.variables, x.reshape(-1, x.shape[-1]), reverse=False)
    )
    return nan_unless(ok, (z.reshape(x.shape), jnp.broadcast_to(logdet, x.shape[:-1])))


def invert_flow(state: FlowState, z):
    """Invert a fitted flow: ``x = f^{-1}(z)`` (triangular solves, exact up to rounding).

    Args:
      state: a :class:`FlowState` from :func:`fit_flow`.
      z: float array ``[..., d]`` with the fitted ``d``.

    Returns:
      ``x [..., d]`` float32, with ``apply_flow(state, x)[0] == z`` up to rounding.

    Examples:
      >>> import jax
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
      >>> state = calibrate.fit_flow(x, jax.random.key(0), levels=1, depth=1, hidden=4, steps=2, batch_size=8)
      >>> np.allclose(calibrate.apply_flow(state, calibrate.invert_flow(state, x))[0], x, atol=1e-4)
      True
    """
    z, ok = _check_rows(z, state, "z")
    x = cast(jax.Array, state.module.apply(state.variables, z.reshape(-1, z.shape[-1]), reverse=True))
    return nan_unless(ok, x.reshape(z.shape))


def _check_rows(x, state: FlowState, name: str):
    x = check_float(x, name)
    d = state.params["level0_step0"]["actnorm"]["bias"].shape[-1]
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"{name} must have shape [..., d] with d={d} (the fitted flow's), got shape {x.shape}")
    return promote_float32(x), check_finite_rows(x.reshape(-1, d), None, name)
