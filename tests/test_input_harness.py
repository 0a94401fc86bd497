"""The bad-input rule, checked on every public function that takes point clouds or hidden states.

The functions are enumerated from the ``__all__`` of metrics, losses, topology, gradients, spectral, softdecay,
calibrate, eval and stats: each needs an entry in ``CASES`` (how to call it on a cloud ``x [6, 3]`` and a mask, and
what it promises) or in ``EXEMPT`` (why it takes no cloud), so a new function is covered by default. Every
function runs on every input of ``INPUTS``, each under a time limit (a hang fails the test):

* NaN, +inf, -inf in a counted row: ``ValueError`` naming the argument and the row for concrete input, NaN
  (every entry of the checked output) under ``jit``;
* the same in a masked row: the result, and the gradient, equal those with a finite padding row;
* a mask selecting fewer rows than the result is defined for (``min_real``: none, or one where a covariance or a
  pair is needed): ``ValueError`` naming the mask for concrete input, NaN under ``jit``; with at least that many
  (an empty cloud for transforms and barcodes), a finite value with a finite gradient;
* one row without a mask, a zero cloud, a constant cloud (exactly centred), identical random rows (whose centring
  leaves rounding residue): a finite value (with a finite gradient) or a ``ValueError``;
* float32 clouds scaled by 1e+20 and 1e-20: f(s·x) = s^k·f(x) for the functions homogeneous of degree k
  (k = 0: the scale-invariant ones), and an answer (no hang) for the others, whose docstrings give their range;
* bfloat16 and float16 input: finite and close to the float32 result on the same (rounded) values;
* clean input: eager and ``jit`` agree and the gradient is finite.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import isojax.eval
from isojax import calibrate, gradients, losses, metrics, softdecay, spectral, stats, topology

# Defining modules before the ones that re-export from them (a re-export is covered under its first name).
MODULES = {
    "metrics": metrics,
    "losses": losses,
    "topology": topology,
    "spectral": spectral,
    "softdecay": softdecay,
    "gradients": gradients,
    "calibrate": calibrate,
    "eval": isojax.eval,
    "stats": stats,
}
N, D = 6, 3
BAD_ROW, PAD_ROW = 2, 5
TIME_LIMIT = 120.0  # seconds per case, compilation included (the machine may be shared)
X = (np.random.default_rng(0).normal(size=(N, D)) @ np.diag([2.0, 1.0, 0.5]) + [0.3, 0, 0]).astype(np.float32)
PADDING_MASK = np.arange(N) != PAD_ROW


@dataclasses.dataclass(frozen=True)
class Case:
    """How to call a function on a cloud ``x [N, D]`` with a ``mask [N]`` (or None), and what it promises."""

    call: Callable
    masked: bool = True
    """Takes a mask (otherwise the masked-row inputs do not apply)."""
    degree: int | None = None
    """f(s·x) = s^degree·f(x) for s > 0 (0: scale-invariant); None: not homogeneous (range in its docstring)."""
    rowwise: bool = False
    """Output rows follow input rows (a transform): a masked row's own output row is left out of comparisons."""
    grad: bool = True
    """Differentiable in x (gradients are checked)."""
    out: Callable = staticmethod(lambda result: result)
    """The part of the result the rule is checked on (default: all of it)."""
    min_real: int = 0
    """The fewest real rows the result is defined for (0: an empty cloud has an empty or neutral answer)."""


def _flow_state():
    return calibrate.fit_flow(X, jax.random.key(0), levels=1, depth=1, hidden=4, steps=2, batch_size=4)


_FLOW = []


def flow_state():
    if not _FLOW:
        _FLOW.append(_flow_state())
    return _FLOW[0]


H = np.random.default_rng(1).normal(size=(4, D)).astype(np.float32)
TARGETS = np.array([0, 1, 5, 3])
G = np.random.default_rng(2).normal(size=(N, D)).astype(np.float32)
WHITENING = calibrate.fit_whitening(X)
CENTERING = calibrate.fit_centering(X)
TOP_DIRECTIONS = calibrate.fit_all_but_the_top(X, D=1)
ISOBN = calibrate.IsoBN(use_running_average=False)
ISOBN_STATS = ISOBN.init(jax.random.key(0), X)
ISOTROPY_LAYER = calibrate.IsotropyLayer()
ISOTROPY_PARAMS = ISOTROPY_LAYER.init(jax.random.key(0), X)
SOFTDECAY_MODULE = softdecay.SoftDecay()
SOFTDECAY_PARAMS = {"params": {"theta": jnp.zeros((), jnp.float32)}}
FLOW_MODULE = calibrate.Flow(levels=1, depth=1, hidden=4)
FLOW_VARIABLES = FLOW_MODULE.init(jax.random.key(0), X)


def _sqrt_curve(s):
    return jnp.sqrt(s)


CASES: dict[str, Case] = {
    "metrics.explained_variance": Case(lambda x, m: metrics.explained_variance(x, 2, mask=m), degree=0, min_real=1),
    "metrics.isoscore": Case(lambda x, m: metrics.isoscore(x, mask=m), degree=0, min_real=2),
    "metrics.isoscore_star": Case(lambda x, m: metrics.isoscore_star(x, mask=m), min_real=2),
    "metrics.partition_isotropy": Case(lambda x, m: metrics.partition_isotropy(x, mask=m), min_real=1),
    "metrics.token_uniformity": Case(lambda x, m: metrics.token_uniformity(x, mask=m), degree=0, min_real=2),
    "metrics.rbf_uniformity": Case(lambda x, m: metrics.rbf_uniformity(x, mask=m), degree=0, min_real=2),
    "metrics.lsds": Case(lambda x, m: metrics.lsds(x, 2 * x[..., ::-1] + 1, k=2, mask=m), min_real=2),
    "metrics.anisotropy": Case(lambda x, m: metrics.anisotropy(x, mask=m, center=True), degree=0, min_real=2),
    "metrics.singular_value_stats": Case(lambda x, m: metrics.singular_value_stats(x, mask=m), degree=0, min_real=1),
    "metrics.massive_activations": Case(lambda x, m: metrics.massive_activations(x, mask=m), min_real=1),
    "metrics.rogue_dimensions": Case(lambda x, m: metrics.rogue_dimensions(x, mask=m), degree=0, min_real=2),
    "metrics.twonn_dimension": Case(lambda x, m: metrics.twonn_dimension(x, mask=m), degree=0, min_real=3),
    "metrics.random_pair_cosine": Case(
        lambda x, m: metrics.random_pair_cosine(x, jax.random.key(0), num_pairs=64, mask=m), degree=0, min_real=2
    ),
    "metrics.alignment": Case(lambda x, m: metrics.alignment(x, 2 * x[..., ::-1], mask=m), degree=0, min_real=1),
    "stats.update": Case(  # max_abs is -inf (documented) while no token has been folded in
        lambda x, m: stats.update(stats.init(D), x, m),
        grad=False,
        out=lambda s: (s.mean, s.m2, jnp.where(s.tokens > 0, s.max_abs, 0), s.unit_sum),
    ),
    "losses.cosine_regularization": Case(lambda x, m: losses.cosine_regularization(x, mask=m), degree=0, min_real=2),
    "losses.spectrum_polynomial": Case(lambda x, m: losses.spectrum_polynomial(x, c1=1.0, gamma=-0.5), masked=False),
    "losses.spectrum_exponential": Case(
        lambda x, m: losses.spectrum_exponential(x, c1=1.0, c2=0.5, gamma=1.0), masked=False
    ),
    "losses.isoscore_loss": Case(lambda x, m: losses.isoscore_loss(x, mask=m), degree=0, min_real=2),
    "losses.istar_loss": Case(lambda x, m: losses.istar_loss(x, mask=m), min_real=2),
    "topology.zero_dim_barcode": Case(lambda x, m: topology.zero_dim_barcode(x, mask=m), degree=1),
    "topology.barcode_edges": Case(lambda x, m: topology.barcode_edges(x, mask=m), degree=1),
    "topology.persistent_entropy_loss": Case(lambda x, m: topology.persistent_entropy_loss(x, mask=m), degree=0),
    "topology.persistent_entropy_loss_grad": Case(
        lambda x, m: topology.persistent_entropy_loss_grad(x, mask=m), degree=-1, rowwise=True, grad=False
    ),
    "gradients.cosine_regularization_grad": Case(
        lambda x, m: gradients.cosine_regularization_grad(x, mask=m),
        degree=-1,
        rowwise=True,
        min_real=2,
    ),
    "gradients.spectrum_polynomial_grad": Case(
        lambda x, m: gradients.spectrum_polynomial_grad(x, c1=1.0, gamma=-0.5), masked=False, grad=False
    ),
    "gradients.spectrum_exponential_grad": Case(
        lambda x, m: gradients.spectrum_exponential_grad(x, c1=1.0, c2=0.5, gamma=1.0), masked=False, grad=False
    ),
    "gradients.isoscore_grad": Case(
        lambda x, m: gradients.isoscore_grad(x, mask=m), degree=-1, rowwise=True, min_real=2
    ),
    "gradients.isoscore_star_grad": Case(
        lambda x, m: gradients.isoscore_star_grad(x, mask=m), rowwise=True, min_real=2
    ),
    "gradients.isoscore_loss_grad": Case(
        lambda x, m: gradients.isoscore_loss_grad(x, mask=m), degree=-1, rowwise=True, min_real=2
    ),
    "gradients.istar_loss_grad": Case(lambda x, m: gradients.istar_loss_grad(x, mask=m), rowwise=True, min_real=2),
    "gradients.softmax_gradient_split": Case(
        lambda x, m: gradients.softmax_gradient_split(x, H, TARGETS), masked=False, rowwise=True
    ),
    "gradients.common_enemies_alignment": Case(
        lambda x, m: gradients.common_enemies_alignment(x, G, mask=m),
        grad=False,
        out=lambda r: (r.mean_cosine, r.principal_cosine),
        min_real=2,
    ),
    "spectral.thin_svd": Case(lambda x, m: spectral.thin_svd(x), masked=False, grad=False),
    "spectral.spectral_map": Case(lambda x, m: spectral.spectral_map(x, _sqrt_curve, mask=m), rowwise=True),
    "spectral.spectral_derivative": Case(
        lambda x, m: spectral.spectral_derivative(x, _sqrt_curve, mask=m),
        rowwise=True,
        grad=False,
        out=lambda op: (op.y, op.s),
    ),
    "softdecay.soft_decay": Case(lambda x, m: softdecay.soft_decay(x, -0.5, mask=m), rowwise=True),
    "softdecay.softdecay_derivative": Case(
        lambda x, m: softdecay.softdecay_derivative(x, -0.5, mask=m), rowwise=True, grad=False, out=lambda op: op.output
    ),
    "softdecay.SoftDecay": Case(lambda x, m: SOFTDECAY_MODULE.apply(SOFTDECAY_PARAMS, x, m), rowwise=True),
    "calibrate.center": Case(lambda x, m: calibrate.center(x, mask=m), degree=1, rowwise=True, min_real=1),
    "calibrate.fit_centering": Case(
        lambda x, m: calibrate.fit_centering(x, mask=m), degree=1, out=lambda s: s.mean, min_real=1
    ),
    "calibrate.apply_centering": Case(lambda x, m: calibrate.apply_centering(CENTERING, x), masked=False, rowwise=True),
    "calibrate.scaled_center": Case(
        lambda x, m: calibrate.scaled_center(x, mask=m), degree=1, rowwise=True, min_real=1
    ),
    "calibrate.fit_all_but_the_top": Case(
        lambda x, m: calibrate.fit_all_but_the_top(x, D=1, mask=m),
        grad=False,
        out=lambda state: state.mean,
        min_real=2,
    ),
    "calibrate.apply_all_but_the_top": Case(
        lambda x, m: calibrate.apply_all_but_the_top(TOP_DIRECTIONS, x), masked=False, rowwise=True
    ),
    "calibrate.all_but_the_top": Case(
        lambda x, m: calibrate.all_but_the_top(x, D=1, mask=m), degree=1, rowwise=True, min_real=2
    ),
    "calibrate.fit_whitening": Case(lambda x, m: calibrate.fit_whitening(x, mask=m), grad=False, min_real=2),
    "calibrate.apply_whitening": Case(lambda x, m: calibrate.apply_whitening(WHITENING, x), masked=False, rowwise=True),
    "calibrate.fit_flow": Case(
        lambda x, m: calibrate.fit_flow(
            x, jax.random.key(0), mask=m, levels=1, depth=1, hidden=4, steps=2, batch_size=4
        ),
        grad=False,
        out=lambda state: state.log_likelihood,
        min_real=2,
    ),
    "calibrate.apply_flow": Case(lambda x, m: calibrate.apply_flow(flow_state(), x), masked=False, rowwise=True),
    "calibrate.invert_flow": Case(lambda x, m: calibrate.invert_flow(flow_state(), x), masked=False, rowwise=True),
    "calibrate.Flow": Case(lambda x, m: FLOW_MODULE.apply(FLOW_VARIABLES, x, m), rowwise=True),
    "calibrate.IsoBN": Case(lambda x, m: ISOBN.apply(ISOBN_STATS, x, mask=m, mutable=["batch_stats"])[0], rowwise=True),
    "calibrate.IsotropyLayer": Case(lambda x, m: ISOTROPY_LAYER.apply(ISOTROPY_PARAMS, x), masked=False, rowwise=True),
}

EXEMPT: dict[str, str] = {
    "metrics.SingularValueStats": "result type",
    "metrics.empirical_cdf": "takes singular values and their validity mask, not a cloud",
    "metrics.MassiveActivation": "result type",
    "metrics.RogueDimensions": "result type",
    "metrics.AttentionSinks": "result type",
    "metrics.attention_sinks": "takes attention probabilities [B, ..., L, L] and a token mask (test_metrics_recent)",
    "stats.Stats": "state type",
    "stats.init": "takes a dimension; no cloud",
    "stats.merge": "takes states, not a cloud",
    "stats.merge_over_axis": "takes a state and a mesh axis",
    "stats.save": "takes a state and a path",
    "stats.load": "takes a path",
    **{  # the rest of isojax.stats: finalisers of a state (their reference tests: test_stats_streaming)
        f"stats.{name}": "a finaliser of a state"
        for name in stats.__all__
        if name not in {"Stats", "init", "update", "merge", "merge_over_axis", "save", "load"}
    },
    "losses.polynomial_decay": "a prior spectrum from hyperparameters; no cloud",
    "losses.exponential_decay": "a prior spectrum from hyperparameters; no cloud",
    "losses.BalancerState": "state type",
    "losses.balancer_init": "takes a count; no cloud",
    "losses.balancer_update": "takes loss values, not a cloud",
    "losses.balancer_factors": "takes the balancer's moving means, not a cloud",
    "topology.barcode_mask": "takes a point mask only (its 0/1 check is in test_bad_input)",
    "topology.persistent_entropy": "takes bar lengths, not a cloud",
    "topology.select_prominent": "takes bar lengths, not a cloud",
    "gradients.SoftmaxGradients": "result type",
    "gradients.CommonEnemiesAlignment": "result type",
    "spectral.METHODS": "a table of decompositions",
    "spectral.SpectralDerivative": "result type",
    "spectral.SpectralMap": "result type",
    "spectral.available_methods": "takes a platform name",
    "spectral.current_platform": "no argument",
    "spectral.select_method": "takes a method name and a shape",
    "spectral.working_dtype": "takes a dtype",
    "softdecay.decay_curve": "a scalar curve of singular values, no cloud",
    "softdecay.alpha_from_param": "maps a scalar parameter",
    "calibrate.FlowState": "state type",
    "calibrate.AllButTheTopState": "state type",
    "calibrate.CenteringState": "state type",
    "calibrate.WhiteningState": "state type",
    "calibrate.isobn_scale": "takes a covariance and standard deviations, not a cloud",
    "calibrate.scale_lu_updates": "an optax transformation",
    "eval.analyze_layers": "takes texts (the single-str TypeError is tested in test_bad_input)",
    "eval.encode": "takes texts (the single-str TypeError is tested in test_bad_input)",
    "eval.analyze_hidden_states": "takes batches of [B, layers, L, d] states (its checks: test_eval_analysis)",
    "eval.hidden_state_batches": "takes texts (a generator of analyze_layers)",
}


def _public():
    """``{name: object}`` for every name in the modules' ``__all__``, each object once (re-exports: first name)."""
    seen, names = {}, {}
    for module_name, module in MODULES.items():
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) not in seen:
                seen[id(obj)] = f"{module_name}.{name}"
                names[f"{module_name}.{name}"] = obj
    return names


PUBLIC = _public()


def test_every_public_function_is_covered_or_exempt():
    missing = sorted(set(PUBLIC) - set(CASES) - set(EXEMPT))
    assert not missing, f"add a Case (or an EXEMPT reason) for {missing}"
    assert not set(CASES) & set(EXEMPT)
    stale = sorted((set(CASES) | set(EXEMPT)) - set(PUBLIC))
    assert not stale, f"entries for names that are not public (or are re-exports): {stale}"


# ----------------------------------------------------------------------------------------------------------
# Running a case
# ----------------------------------------------------------------------------------------------------------
def limited(fn, *args):
    """``fn(*args)`` in a daemon thread; the test fails if it does not finish within TIME_LIMIT."""
    box = {}

    def target():
        try:
            box["value"] = jax.block_until_ready(fn(*args))
        except BaseException as error:  # re-raised in the test's thread
            box["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(TIME_LIMIT)
    if thread.is_alive():
        pytest.fail(f"no answer within {TIME_LIMIT} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]


_JITTED: dict[str, Callable] = {}


def jitted(name):
    if name not in _JITTED:
        case = CASES[name]
        _JITTED[name] = jax.jit(lambda x, m: case.out(case.call(x, m)))
    return _JITTED[name]


def leaves(tree, *, drop_row=None):
    """The leaves as numpy arrays (floating ones as float64), with row ``drop_row`` of row-shaped leaves removed."""
    out = []
    for leaf in jax.tree.leaves(tree):
        leaf = jnp.asarray(leaf)
        array = np.asarray(leaf.astype(jnp.float32) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf)
        array = array.astype(np.float64) if array.dtype == np.float32 else array
        if drop_row is not None and array.ndim >= 2 and array.shape[-2] == N:
            array = np.delete(array, drop_row, axis=-2)
        out.append(array)
    return out


def floats(tree, **kwargs):
    return [a for a in leaves(tree, **kwargs) if a.dtype == np.float64]


def scalar_loss(case, mask):
    """x -> Σ of the checked floating outputs (a masked row's own output row left out for transforms)."""

    def loss(x):
        total = 0.0
        for leaf in jax.tree.leaves(case.out(case.call(x, mask))):
            leaf = jnp.asarray(leaf)
            if not jnp.issubdtype(leaf.dtype, jnp.floating):
                continue
            if case.rowwise and mask is not None and leaf.ndim >= 2 and leaf.shape[-2] == N:
                leaf = jnp.where(mask[:, None], leaf, 0)
            total = total + jnp.sum(jnp.where(jnp.isfinite(leaf), leaf, 0).astype(jnp.float32) ** 2)
        return total

    return loss


def finite_or_value_error(case, x, mask, *, refuse_ok: bool = True):
    """The degenerate-input promise: a finite value with a finite gradient, or (``refuse_ok``) a ValueError."""
    try:
        result = limited(lambda: case.out(case.call(x, mask)))
    except ValueError:
        if refuse_ok:
            return
        raise
    for array in floats(result):
        assert np.isfinite(array).all(), f"non-finite result {array} on degenerate input"
    if case.grad:
        grad = limited(jax.grad(scalar_loss(case, mask)), x)
        assert np.isfinite(np.asarray(grad, np.float64)).all(), "non-finite gradient on degenerate input"


def assert_same(got, expected, *, rtol=1e-5, atol_factor=1e-6):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if g.dtype != np.float64:
            np.testing.assert_array_equal(g, e)
            continue
        scale = np.max(np.abs(e[np.isfinite(e)]), initial=0.0)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol_factor * scale + 1e-30)


# ----------------------------------------------------------------------------------------------------------
# The inputs
# ----------------------------------------------------------------------------------------------------------
def check_counted(name, case, bad):
    x = X.copy()
    x[BAD_ROW, 1] = bad
    with pytest.raises(ValueError, match=rf"non-finite value \(NaN or inf\) in row {BAD_ROW}"):
        limited(lambda: case.call(x, None))
    for array in floats(limited(jitted(name), x, None)):
        assert np.isnan(array).all(), f"a finite number under jit from a non-finite counted row: {array}"


def check_masked(name, case, bad):
    if not case.masked:
        pytest.skip("takes no mask")
    x_bad, x_pad = X.copy(), X.copy()
    x_bad[PAD_ROW, 1] = bad
    x_pad[PAD_ROW] = [7.0, -3.0, 0.25]
    mask = jnp.asarray(PADDING_MASK)
    drop = PAD_ROW if case.rowwise else None
    expected = leaves(limited(lambda: case.out(case.call(x_pad, mask))), drop_row=drop)
    assert_same(leaves(limited(lambda: case.out(case.call(x_bad, mask))), drop_row=drop), expected)
    assert_same(leaves(limited(jitted(name), x_bad, mask), drop_row=drop), expected, rtol=1e-4)
    if case.grad:
        loss = scalar_loss(case, mask)
        grad_bad, grad_pad = limited(jax.grad(loss), x_bad), limited(jax.grad(loss), x_pad)
        assert np.isfinite(np.asarray(grad_bad)).all(), "a masked non-finite row reached the gradient"
        np.testing.assert_allclose(
            np.delete(grad_bad, PAD_ROW, 0), np.delete(grad_pad, PAD_ROW, 0), rtol=1e-5, atol=1e-6
        )


def real_rows_rule(name, case, mask):
    """Fewer real rows than ``case.min_real``: a ValueError naming the mask, NaN under jit; else finite."""
    if int(mask.sum()) >= case.min_real:
        finite_or_value_error(case, X, mask, refuse_ok=False)
        return
    with pytest.raises(ValueError, match=rf"mask must select at least {case.min_real} row"):
        limited(lambda: case.call(X, np.asarray(mask)))
    for array in floats(limited(jitted(name), X, mask)):
        assert np.isnan(array).all(), f"a finite number under jit from {int(mask.sum())} real rows: {array}"


def check_all_masked(name, case):
    if not case.masked:
        pytest.skip("takes no mask")
    real_rows_rule(name, case, jnp.zeros(N, bool))


def check_one_real_row(name, case):
    if case.masked:
        real_rows_rule(name, case, jnp.arange(N) == 0)
    else:
        finite_or_value_error(case, X[:1], None)


def check_scale(name, case, scale):
    x = (X.astype(np.float64) * scale).astype(np.float32)
    try:
        got = limited(lambda: case.out(case.call(x, None)))
    except ValueError:
        assert case.degree is None, "a homogeneous function must handle any finite scale"
        return
    if case.degree is not None:
        reference = leaves(limited(lambda: case.out(case.call(X, None))))
        expected = [r * scale**case.degree if r.dtype == np.float64 else r for r in reference]
        assert_same(leaves(got), expected, rtol=1e-4, atol_factor=1e-4)


def check_low_precision(name, case, dtype):
    x = X.astype(dtype)
    got = floats(limited(lambda: case.out(case.call(x, None))))
    for array in got:
        assert np.isfinite(array).all()
    expected = floats(limited(lambda: case.out(case.call(np.asarray(x, np.float32), None))))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=2e-2, atol=2e-2 * np.max(np.abs(e), initial=1.0))


def check_clean(name, case):
    eager = leaves(limited(lambda: case.out(case.call(X, None))))
    assert_same(leaves(limited(jitted(name), X, None)), eager, rtol=1e-4, atol_factor=1e-5)
    if case.grad:
        assert np.isfinite(np.asarray(limited(jax.grad(scalar_loss(case, None)), X))).all()


INPUTS = {
    "counted-nan": lambda n, c: check_counted(n, c, np.nan),
    "counted-inf": lambda n, c: check_counted(n, c, np.inf),
    "counted--inf": lambda n, c: check_counted(n, c, -np.inf),
    "masked-nan": lambda n, c: check_masked(n, c, np.nan),
    "masked-inf": lambda n, c: check_masked(n, c, np.inf),
    "masked--inf": lambda n, c: check_masked(n, c, -np.inf),
    "all-masked": check_all_masked,
    "one-real-row": check_one_real_row,
    "zero": lambda n, c: finite_or_value_error(c, np.zeros((N, D), np.float32), None),
    "constant": lambda n, c: finite_or_value_error(c, np.tile(np.float32([1.0, -2.0, 0.5]), (N, 1)), None),
    "identical": lambda n, c: finite_or_value_error(c, np.tile(X[0], (N, 1)), None),  # centering leaves rounding
    "scale-1e+20": lambda n, c: check_scale(n, c, 1e20),
    "scale-1e-20": lambda n, c: check_scale(n, c, 1e-20),
    "bfloat16": lambda n, c: check_low_precision(n, c, jnp.bfloat16),
    "float16": lambda n, c: check_low_precision(n, c, np.float16),
    "clean": check_clean,
}


@pytest.mark.parametrize("input_name", list(INPUTS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_rule(name, input_name):
    INPUTS[input_name](name, CASES[name])


# ----------------------------------------------------------------------------------------------------------
# Random clouds (hypothesis): masked rows and scale never matter to the scale-invariant measures
# ----------------------------------------------------------------------------------------------------------
INVARIANT = sorted(name for name, case in CASES.items() if case.degree == 0 and case.masked)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(3, 7),
    seed=st.integers(0, 2**16),
    exponent=st.integers(-30, 30),
    padding=st.sampled_from([np.nan, np.inf, -np.inf, 1e30]),
    name=st.sampled_from(INVARIANT),
)
def test_random_clouds_padding_and_scale(n, seed, exponent, padding, name):
    """f(2^e·10^(e/3)·x with a bad padding row, mask) = f(x[real]) for a random cloud x [n + 1, 3]."""
    case = CASES[name]
    rng = np.random.default_rng(seed)
    real = rng.normal(size=(n, D)) * rng.uniform(0.1, 3, size=D)
    scale = 10.0 ** (exponent * 2 / 3)
    x = np.concatenate([real * scale, np.full((1, D), padding)]).astype(np.float32)
    mask = np.arange(n + 1) < n
    got = leaves(limited(lambda: case.out(case.call(x, mask))))
    expected = leaves(limited(lambda: case.out(case.call(real.astype(np.float32), None))))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
