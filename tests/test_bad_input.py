"""Bad input: non-finite, extreme and mistaken input never hangs, never gives a believable number, and masked
rows never count; integer masks hold only 0 and 1; no isojax function is jitted where it is defined.

References are independent of isojax: numpy formulas (IsoScore as the participation ratio of the covariance,
Rudman et al. 2022), scipy's minimum spanning tree for the 0-dim barcode.
"""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse.csgraph
import scipy.spatial.distance

from isojax import calibrate, metrics, topology
from isojax.eval import analyze_layers, encode, wordsim


def reference_isoscore(x):
    """IsoScore in float64 numpy: ((tr C)² / ‖C‖_F² − 1) / (d − 1), C the sample covariance."""
    c = np.cov(np.asarray(x, np.float64).T)
    return (np.trace(c) ** 2 / np.sum(c * c) - 1) / (c.shape[0] - 1)


@pytest.fixture
def cloud():
    """``(x [6, 3] float32, x with a NaN padding row [7, 3], mask [7])``."""
    x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32) @ np.diag([3.0, 1.0, 0.5]).astype(np.float32)
    padded = np.concatenate([x, np.full((1, 3), np.nan, np.float32)])
    return x, padded, np.arange(7) < 6


def test_soft_decay_on_an_inf_matrix_returns_within_a_time_limit():
    """Observation 1: soft_decay on an [8, 4] float32 matrix with one inf never returned (the SVD iterated on it).
    Run in a subprocess so that a hang fails the test instead of stalling the suite."""
    code = textwrap.dedent("""
        import numpy as np, jax
        from isojax.softdecay import soft_decay
        x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        x[3, 1] = np.inf
        try:
            soft_decay(x, -0.5)
        except ValueError as error:
            print("eager:", error)
        y = jax.jit(lambda a: soft_decay(a, -0.5))(x)
        print("jit all nan:", bool(np.isnan(np.asarray(y)).all()))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "eager: x has a non-finite value (NaN or inf) in row 3" in done.stdout
    assert "jit all nan: True" in done.stdout


def test_a_nan_padding_row_changes_nothing(cloud):
    """Observation 2: a NaN in a row the mask leaves out changed isoscore (to 0.0), made every row of
    calibrate.center NaN, and changed the 0-dim barcode."""
    x, padded, mask = cloud
    np.testing.assert_allclose(metrics.isoscore(padded, mask=mask), reference_isoscore(x), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(metrics.isoscore)(padded, mask=mask), reference_isoscore(x), rtol=1e-5)
    centered = np.asarray(calibrate.center(padded, mask=mask))
    np.testing.assert_allclose(centered[:6], x - x.mean(0), atol=1e-6)
    mst = scipy.sparse.csgraph.minimum_spanning_tree(
        scipy.spatial.distance.squareform(scipy.spatial.distance.pdist(x.astype(np.float64)))
    )
    expected = np.sort(mst.data)[::-1]
    bars = topology.zero_dim_barcode(padded, mask=mask)
    np.testing.assert_allclose(bars[:5], expected, rtol=1e-5)
    assert bars[5] == 0
    grad = jax.grad(lambda a: metrics.isoscore(a, mask=mask))(padded)
    assert np.isfinite(grad).all() and (grad[6] == 0).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "measure",
    [
        metrics.isoscore,
        metrics.token_uniformity,
        metrics.explained_variance,
        metrics.rbf_uniformity,
        topology.persistent_entropy_loss,
    ],
    ids=lambda f: f.__name__,
)
def test_a_non_finite_counted_row_is_an_error_or_nan(cloud, measure, bad):
    """Observation 3: a NaN in a counted row came out as a believable number (isoscore 0.0)."""
    x = cloud[0].copy()
    x[4, 2] = bad
    with pytest.raises(ValueError, match=r"x has a non-finite value \(NaN or inf\) in row 4"):
        measure(x)
    assert np.isnan(jax.jit(measure)(x))


@pytest.mark.parametrize("scale", [1e20, 1e-20])
def test_isoscore_is_scale_invariant_in_float32(cloud, scale):
    """Observation 4: isoscore(x * 1e±20) was 0.0 in float32 (the squares overflow or underflow)."""
    x = cloud[0]
    scaled = (x.astype(np.float64) * scale).astype(np.float32)
    expected = reference_isoscore(scaled)  # float64: no overflow, and the measure is scale-invariant
    np.testing.assert_allclose(expected, reference_isoscore(x), rtol=1e-5)
    np.testing.assert_allclose(metrics.isoscore(scaled), expected, rtol=1e-4)  # float32 rounding of 1 − 1/PR
    np.testing.assert_allclose(jax.jit(metrics.isoscore)(scaled), expected, rtol=1e-4)


def test_a_single_string_is_not_a_sequence_of_texts():
    """Observation 5: encode(module, params, tokenizer, "a man plays") encoded its 11 characters. The check
    comes before the model is touched, so no model is needed to see it."""
    with pytest.raises(TypeError, match=r"texts must be a sequence of strings, got str \(a single text"):
        encode(object(), None, None, "a man plays")
    with pytest.raises(TypeError, match="texts must be a sequence of strings"):
        analyze_layers(object(), None, None, "a man plays")
    with pytest.raises(TypeError, match="words must be a sequence of strings"):
        wordsim.single_token_ids(lambda words, **_: {"input_ids": [[0] for _ in words]}, "cat")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string"):
        encode(object(), None, None, ["a man plays", 3])


def test_integer_masks_hold_only_zero_and_one(cloud):
    """An integer mask holding a value other than 0 and 1 is refused (eagerly) or gives NaN (traced)."""
    x = cloud[0]
    with pytest.raises(ValueError, match=r"mask must be boolean or hold only 0 and 1, found the values \[0, 1, 2\]"):
        metrics.isoscore(x, mask=np.array([1, 1, 2, 1, 0, 1]))
    with pytest.raises(ValueError, match="found the values"):
        topology.barcode_mask(np.array([0, 2, 1]))
    np.testing.assert_allclose(
        metrics.isoscore(x, mask=np.array([1, 1, 1, 1, 1, 0])), reference_isoscore(x[:5]), rtol=1e-5
    )
    # Traced integer masks cannot be checked at trace time: a value other than 0/1 makes the result NaN.
    assert np.isnan(jax.jit(metrics.isoscore)(x, mask=jnp.array([1, 1, 2, 1, 0, 1])))
    np.testing.assert_allclose(
        jax.jit(metrics.isoscore)(x, mask=jnp.array([1, 1, 1, 1, 1, 0])), reference_isoscore(x[:5]), rtol=1e-5
    )


def test_nothing_is_jitted_at_definition():
    """No public or private function of any isojax module is wrapped in jax.jit where it is defined. A jitted
    function is recognised by its ``lower`` method."""
    import importlib
    import pkgutil

    import isojax

    jitted = []
    for info in pkgutil.walk_packages(isojax.__path__, "isojax."):
        module = importlib.import_module(info.name)
        jitted += [
            f"{info.name}.{name}"
            for name, obj in vars(module).items()
            if callable(obj) and hasattr(obj, "lower") and hasattr(obj, "trace")
        ]
    assert jitted == []
    for core in (topology._cloud_losses, topology._cloud_loss_grads, topology._edges, topology._prominent):
        assert not hasattr(core, "lower"), f"{core} is jitted at definition"


def test_a_cloud_closed_over_inside_jit_is_checked_with_numpy(cloud):
    """A concrete cloud inside a jit trace (a closure constant) is checked as concrete input: the check must not
    turn it into a tracer (it did, and np.asarray of that tracer raised TracerArrayConversionError)."""
    x, padded = jnp.asarray(cloud[0]), jnp.asarray(cloud[1])  # jax arrays: concrete inside the trace
    np.testing.assert_allclose(jax.jit(lambda: metrics.isoscore(x))(), reference_isoscore(cloud[0]), rtol=1e-5)
    with pytest.raises(ValueError, match="row 6"):
        jax.jit(lambda: metrics.isoscore(padded))()


def test_isobn_keeps_its_statistics_through_a_non_finite_batch(cloud):
    """Traced: a batch with a NaN counted row gives a NaN output for its cloud only and leaves the running
    statistics unchanged (0 · NaN in the moving average would have made them NaN for good)."""
    x = np.stack([cloud[0], cloud[0] * 2])
    x[1, 2, 0] = np.nan
    module = calibrate.IsoBN(use_running_average=False)
    variables = module.init(jax.random.key(0), x[:1])
    y, state = jax.jit(lambda v, a: module.apply(v, a, mutable=["batch_stats"]))(variables, x)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()
    np.testing.assert_array_equal(state["batch_stats"]["cov"], np.eye(3))
    np.testing.assert_array_equal(state["batch_stats"]["std"], np.ones(3))
