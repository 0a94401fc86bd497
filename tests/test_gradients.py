"""Tests of isojax.gradients.

Closed forms against ``jax.grad`` of the losses (float64, 1e-6 relative) on random and degenerate input
(repeated rows, zero rows, padding masks, repeated eigenvalues / singular values, tied bar lengths), and the
IsoScore gradient also against ``jax.grad`` of an eigenvalue-based IsoScore written here. The common-enemies
split against ``jax.grad`` of optax's softmax cross-entropy and against an explicit per-row sum in numpy, and
its alignment measure on a synthetic softmax layer with a planted common direction and on an isotropic control.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from isojax import gradients, losses, metrics, topology


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def assert_same_gradient(closed, automatic, name=""):
    closed, automatic = np.asarray(closed), np.asarray(automatic)
    assert closed.shape == automatic.shape, name
    assert np.all(np.isfinite(closed)), name
    # 1e-6 relative; entries that cancel to ~0 are compared against the gradient's scale, and an exactly-zero
    # gradient (e.g. identical points) against float64 rounding of O(1) inputs.
    atol = 1e-9 * np.abs(automatic).max() + 1e-12
    np.testing.assert_allclose(closed, automatic, rtol=1e-6, atol=atol, err_msg=name)


def clouds():
    """``(name, x [n, d] or [b, n, d], mask or None)``: random, repeated rows, a zero row, padding, points
    whose covariance is a multiple of I (all eigenvalues repeated), identical points, and a masked batch."""
    rng = np.random.default_rng(0)
    random = rng.normal(size=(9, 4)) @ rng.normal(size=(4, 4)) + 0.5
    repeated = np.repeat(rng.normal(size=(4, 4)), [3, 2, 2, 1], axis=0)
    zero_row = np.concatenate([random[:6], np.zeros((1, 4))])
    padded = np.concatenate([random[:6], 50 * np.ones((3, 4))])
    isotropic = np.concatenate([np.eye(4), -np.eye(4)]) * 1.7 + 0.3  # covariance ∝ I: eigenvalues 4x repeated
    identical = np.tile(rng.normal(size=(1, 4)), (5, 1))
    batch = rng.normal(size=(2, 7, 4))
    batch_mask = np.arange(7) < np.array([7, 4])[:, None]
    return [
        ("random", random, None),
        ("repeated rows", repeated, None),
        ("zero row", zero_row, None),
        ("padding", padded, np.arange(9) < 6),
        ("repeated eigenvalues", isotropic, None),
        ("identical", identical, None),
        ("batch", batch, batch_mask),
    ]


CLOUDS = clouds()
CLOUD_IDS = [name for name, _, _ in CLOUDS]


def check(loss, closed_form, x, mask, name):
    """``closed_form(x, mask)`` against ``jax.grad`` of ``sum(loss(x, mask))``, each jitted whole (op by op, the
    gradient of a barcode or an SVD compiles hundreds of small programs)."""
    automatic = jax.jit(jax.grad(lambda x: jnp.sum(loss(x, mask))))(jnp.asarray(x))
    assert_same_gradient(jax.jit(lambda x: closed_form(x, mask))(jnp.asarray(x)), automatic, name)


@pytest.mark.parametrize("name,x,mask", CLOUDS, ids=CLOUD_IDS)
def test_cosine_regularization_grad(name, x, mask):
    check(
        lambda x, m: losses.cosine_regularization(x, mask=m, weight=0.7),
        lambda x, m: gradients.cosine_regularization_grad(x, mask=m, weight=0.7),
        x,
        mask,
        name,
    )


@pytest.mark.parametrize("name,x,mask", CLOUDS, ids=CLOUD_IDS)
def test_isoscore_grads(name, x, mask):
    rng = np.random.default_rng(1)
    c0 = np.cov(rng.normal(size=(30, 4)).T)
    cases = {
        "isoscore": (lambda x, m: metrics.isoscore(x, mask=m), lambda x, m: gradients.isoscore_grad(x, mask=m)),
        "isoscore_star": (
            lambda x, m: metrics.isoscore_star(x, zeta=0.3, mask=m),
            lambda x, m: gradients.isoscore_star_grad(x, zeta=0.3, mask=m),
        ),
        "isoscore_star c0": (
            lambda x, m: metrics.isoscore_star(x, c0=c0, zeta=0.6, mask=m),
            lambda x, m: gradients.isoscore_star_grad(x, c0=c0, zeta=0.6, mask=m),
        ),
        "isoscore_loss": (
            lambda x, m: losses.isoscore_loss(x, mask=m, eps=1e-3),
            lambda x, m: gradients.isoscore_loss_grad(x, mask=m, eps=1e-3),
        ),
        "istar_loss": (
            lambda x, m: losses.istar_loss(x, zeta=0.2, mask=m, weight=1.5),
            lambda x, m: gradients.istar_loss_grad(x, zeta=0.2, mask=m, weight=1.5),
        ),
    }
    for case, (loss, closed_form) in cases.items():
        check(loss, closed_form, x, mask, f"{case} on {name}")


def eigenvalue_isoscore(x):
    """IsoScore of one cloud as the ``isoscore`` package computes it: eigenvalues of np.cov-style covariance,
    normalised to norm √d, isotropy defect, score (Rudman et al. 2022, Alg. 1)."""
    d = x.shape[-1]
    variances = jnp.linalg.eigvalsh(jnp.cov(x.T))
    v = variances * jnp.sqrt(d) / jnp.linalg.norm(variances)
    defect_sq = jnp.sum((v - 1) ** 2) / (2 * (d - jnp.sqrt(d)))
    return ((d - defect_sq * (d - jnp.sqrt(d))) ** 2 - d) / (d * (d - 1))


@pytest.mark.parametrize("name", ["random", "repeated rows", "repeated eigenvalues"])
def test_isoscore_grad_matches_autodiff_of_the_eigenvalue_formula(name):
    x = jnp.asarray(dict((n, x) for n, x, _ in CLOUDS)[name])
    np.testing.assert_allclose(float(metrics.isoscore(x)), float(eigenvalue_isoscore(x)), rtol=1e-10, atol=1e-12)
    assert_same_gradient(gradients.isoscore_grad(x), jax.grad(eigenvalue_isoscore)(x), name)


def spectra():
    """``(name, w)``: tall and wide random matrices, rank-deficient (repeated rows: repeated zero singular
    values), and a matrix with a repeated non-zero singular value."""
    rng = np.random.default_rng(2)
    q1, _ = np.linalg.qr(rng.normal(size=(7, 4)))
    q2, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    return [
        ("tall", rng.normal(size=(9, 4))),
        ("wide", rng.normal(size=(3, 6))),
        ("repeated rows", np.repeat(rng.normal(size=(2, 5)), 4, axis=0)),
        ("repeated singular value", q1 @ np.diag([3.0, 2.0, 2.0, 0.5]) @ q2.T),
        ("batch", rng.normal(size=(2, 6, 3))),
    ]


@pytest.mark.parametrize("name,w", spectra(), ids=[name for name, _ in spectra()])
def test_spectrum_control_grads(name, w):
    cases = {
        "polynomial": (
            lambda w, m: losses.spectrum_polynomial(w, c1=2.5, gamma=-0.6, weight=0.4),
            lambda w, m: gradients.spectrum_polynomial_grad(w, c1=2.5, gamma=-0.6, weight=0.4),
        ),
        "exponential": (
            lambda w, m: losses.spectrum_exponential(w, c1=2.5, c2=0.3, gamma=1.1),
            lambda w, m: gradients.spectrum_exponential_grad(w, c1=2.5, c2=0.3, gamma=1.1),
        ),
    }
    for case, (loss, closed_form) in cases.items():
        check(loss, closed_form, w, None, f"{case} on {name}")


def test_spectrum_grad_is_the_singular_vector_formula():
    """∂σ_k/∂W = u_k v_kᵀ, checked term by term against numpy's SVD on a matrix with distinct values."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 5))
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    prior = 2.0 * np.arange(1, 6) ** -1.0
    expected = sum(2 * 0.5 * (s[k] - prior[k]) * np.outer(u[:, k], vt[k]) for k in range(5))
    np.testing.assert_allclose(
        gradients.spectrum_polynomial_grad(w, c1=2.0, gamma=-1.0, weight=0.5), expected, rtol=1e-10, atol=1e-12
    )


def entropy_clouds():
    """Three clusters (with labels), padding, repeated points (zero bars) and a regular grid (tied bars)."""
    rng = np.random.default_rng(4)
    centers = 5.0 * rng.normal(size=(3, 3))
    clustered = centers[np.arange(15) % 3] + 0.4 * rng.normal(size=(15, 3))
    labels = np.arange(15) % 2
    square = np.stack(np.meshgrid(np.arange(3.0), np.arange(3.0)), -1).reshape(-1, 2)
    grid = np.concatenate([square, np.zeros((9, 1))], axis=1)  # a unit 3 x 3 grid in R^3: all 8 bars are 1
    repeated = np.repeat(clustered[:5], 2, axis=0)
    padded = np.concatenate([clustered, 9 * np.ones((4, 3))])
    return [
        ("clusters", clustered, None, None),
        ("clusters labels", clustered, labels, None),
        ("padding labels", padded, np.concatenate([labels, np.zeros(4, int)]), np.arange(19) < 15),
        ("repeated points", repeated, None, None),
        ("tied bars", grid, None, None),
        ("batch", np.stack([clustered, clustered[::-1] * 1.3]), np.tile(labels, (2, 1)), None),
    ]


@pytest.mark.parametrize("name,x,labels,mask", entropy_clouds(), ids=[c[0] for c in entropy_clouds()])
@pytest.mark.parametrize(
    "options", [dict(bars="selected", in_cluster_weight=0.4), dict(bars="all")], ids=["selected", "all"]
)
@pytest.mark.slow
def test_persistent_entropy_loss_grad(name, x, labels, mask, options):
    num_classes = None if labels is None else 2
    check(
        lambda x, m: topology.persistent_entropy_loss(x, labels, mask=m, num_classes=num_classes, **options),
        lambda x, m: gradients.persistent_entropy_loss_grad(x, labels, mask=m, num_classes=num_classes, **options),
        x,
        mask,
        name,
    )


def test_closed_forms_jit_and_keep_the_dtype():
    with jax.enable_x64(False):
        x = jnp.asarray(np.random.default_rng(5).normal(size=(12, 6)), jnp.float32)
        for fn in (
            gradients.cosine_regularization_grad,
            gradients.isoscore_grad,
            gradients.isoscore_loss_grad,
            gradients.persistent_entropy_loss_grad,
            lambda x: gradients.spectrum_polynomial_grad(x, c1=1.0, gamma=-1.0),
        ):
            g = jax.jit(fn)(x)
            assert g.dtype == jnp.float32 and g.shape == x.shape and np.all(np.isfinite(g))


# ---------------------------------------------------------------------------------------------- common enemies
def softmax_layer(rng, vocab=40, d=6, n=25):
    w = rng.normal(size=(vocab, d))
    h = rng.normal(size=(n, d))
    targets = rng.integers(0, vocab, size=n)
    targets[:3] = 7  # a repeated target
    return w, h, targets, rng.normal(size=vocab)


def test_split_sums_to_the_cross_entropy_gradient():
    rng = np.random.default_rng(6)
    w, h, targets, bias = softmax_layer(rng)
    mask = rng.uniform(size=len(h)) < 0.7

    def mean_ce(w):
        ce = optax.softmax_cross_entropy_with_integer_labels(h @ w.T + bias, targets)
        return jnp.sum(jnp.where(mask, ce, 0)) / mask.sum()

    split = gradients.softmax_gradient_split(w, h, targets, bias=bias, weights=mask)
    np.testing.assert_allclose(float(split.loss), float(mean_ce(w)), rtol=1e-12)
    assert_same_gradient(split.full, jax.grad(mean_ce)(jnp.asarray(w)), "full gradient")
    # Each part against its definition, written out per prediction in numpy.
    p = np.exp(h @ w.T + bias)
    p /= p.sum(1, keepdims=True)
    omega = mask / mask.sum()
    target, non_target = np.zeros_like(w), np.zeros_like(w)
    for n in range(len(h)):
        target[targets[n]] -= omega[n] * (1 - p[n, targets[n]]) * h[n]
        for j in range(len(w)):
            if j != targets[n]:
                non_target[j] += omega[n] * p[n, j] * h[n]
    np.testing.assert_allclose(split.target, target, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(split.non_target, non_target, rtol=1e-10, atol=1e-14)
    # Unweighted: the plain mean over predictions.
    plain = gradients.softmax_gradient_split(w, h, targets)
    expected = jax.grad(lambda w: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(h @ w.T, targets)))(w)
    assert_same_gradient(plain.full, expected, "unweighted")


def test_split_is_accurate_for_confident_predictions():
    """p_t → 1: the target part is −(1 − p_t) h with 1 − p_t far below float rounding of p_t."""
    w = np.array([[40.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    h = np.array([[1.0, 0.0]])
    split = gradients.softmax_gradient_split(w, h, np.array([0]))
    one_minus_pt = np.exp(-40.0) * 2  # p_j = exp(-40) for j = 1, 2
    np.testing.assert_allclose(split.target[0], -one_minus_pt * h[0], rtol=1e-12)
    np.testing.assert_allclose(split.non_target.sum(0), one_minus_pt * h[0], rtol=1e-12)


def planted_layer(rng, vocab=300, d=32, n=200, common=True):
    """W with rows w_j = 0.3 ε_j + s_j u (s_j ~ 3 + 2 N(0, 1): u is both W's mean direction and its top principal
    direction) and outputs h_n = 0.5 ε'_n − 2u; with ``common=False``, isotropic W and h."""
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    w = 0.3 * rng.normal(size=(vocab, d))
    h = 0.5 * rng.normal(size=(n, d))
    if common:
        w += (3 + 2 * rng.normal(size=(vocab, 1))) * u
        h -= 2 * u
    return w, h, rng.integers(0, vocab, size=n), u


def test_alignment_finds_a_planted_common_direction_and_not_an_isotropic_one():
    rng = np.random.default_rng(7)
    w, h, targets, _ = planted_layer(rng)
    split = gradients.softmax_gradient_split(w, h, targets)
    planted = gradients.common_enemies_alignment(w, split.non_target)
    assert planted.mean_cosine > 0.95 and planted.principal_cosine > 0.95, planted
    assert np.median(planted.row_mean_cosines) > 0.7 and np.median(planted.row_principal_cosines) > 0.7, planted
    assert planted.coherence > 0.6

    w, h, targets, _ = planted_layer(rng, common=False)
    control = gradients.common_enemies_alignment(w, gradients.softmax_gradient_split(w, h, targets).non_target)
    # Random directions in R^32: cosines of order 1/sqrt(32) = 0.18. (The rows' gradients may still agree with
    # each other -- the common enemies -- but not with a direction of W.)
    assert abs(control.mean_cosine) < 0.5 and control.principal_cosine < 0.5, control
    assert np.median(np.abs(control.row_mean_cosines)) < 0.3 and np.median(control.row_principal_cosines) < 0.3


def test_mean_cosine_sign_follows_the_side_of_w_the_states_lie_on():
    """The README's "both cosines exceed 0.95" holds for states along −u, against W's mean direction (the setup
    above). With the same W and states along +u the non-target descent step points against mean(W): the mean
    cosine is close to −1, while the principal cosine (an absolute value) and the coherence stay high. Reference:
    the non-target rows sum to Σ_n ω_n (1 − p_n,t) h_n (each prediction's p_j, j ≠ t, sum to 1 − p_t), in numpy."""
    rng = np.random.default_rng(7)
    w, h, targets, u = planted_layer(rng)
    cosines = {}
    for side, states in (("-u", h), ("+u", h + 4 * u)):  # h = 0.5 ε' − 2u, then 0.5 ε' + 2u
        split = gradients.softmax_gradient_split(w, states, targets)
        result = gradients.common_enemies_alignment(w, split.non_target)
        logits = states @ w.T
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        descent = -((1 - p[np.arange(len(states)), targets])[:, None] * states).mean(0)
        mean_w = w.mean(0)
        expected = descent @ mean_w / np.linalg.norm(descent) / np.linalg.norm(mean_w)
        np.testing.assert_allclose(result.mean_cosine, expected, rtol=1e-10)
        assert result.principal_cosine > 0.95 and result.coherence > 0.6, (side, result)
        cosines[side] = float(result.mean_cosine)
    assert cosines["-u"] > 0.95 and cosines["+u"] < -0.95, cosines


def test_alignment_definitions_and_mask():
    rng = np.random.default_rng(8)
    w = rng.normal(size=(30, 5)) + 1.0
    g = rng.normal(size=(30, 5))
    mask = np.arange(30) < 25
    result = gradients.common_enemies_alignment(w, g, mask=mask)
    real_w, real_g = w[:25], g[:25]
    mean = real_w.mean(0)
    top = np.linalg.svd(real_w - mean)[2][0]

    def cos(a, b):
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    np.testing.assert_allclose(result.mean_cosine, cos(-real_g.sum(0), mean), rtol=1e-10)
    np.testing.assert_allclose(result.principal_cosine, abs(cos(real_g.sum(0), top)), rtol=1e-10)
    np.testing.assert_allclose(result.row_mean_cosines[:25], [cos(-r, mean) for r in real_g], rtol=1e-10)
    np.testing.assert_allclose(result.row_principal_cosines[:25], [abs(cos(r, top)) for r in real_g], rtol=1e-8)
    np.testing.assert_array_equal(result.row_mean_cosines[25:], 0)
    pairs = [cos(real_g[i], real_g[j]) for i in range(25) for j in range(25) if i != j]
    np.testing.assert_allclose(result.coherence, np.mean(pairs), rtol=1e-10)


def test_common_enemies_bad_input_raises():
    w, h, targets = np.zeros((5, 3)), np.zeros((4, 3)), np.array([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"h must have shape \[N, 3\]"):
        gradients.softmax_gradient_split(w, np.zeros((4, 2)), targets)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, V\)"):
        gradients.softmax_gradient_split(w, h, np.array([0, 1, 2, 5]))
    with pytest.raises(TypeError, match="targets must be integer"):
        gradients.softmax_gradient_split(w, h, np.zeros(4))
    with pytest.raises(ValueError, match=r"targets must have shape \(4,\)"):
        gradients.softmax_gradient_split(w, h, np.zeros(3, int))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        gradients.softmax_gradient_split(w, h, targets, bias=np.zeros(4))
    with pytest.raises(ValueError, match="weights must be non-negative"):
        gradients.softmax_gradient_split(w, h, targets, weights=np.array([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="grad must have the shape of w"):
        gradients.common_enemies_alignment(w, h)
    with pytest.raises(ValueError, match=r"zeta must be in \[0.0, 1.0\]"):
        gradients.isoscore_star_grad(h, zeta=1.5)
