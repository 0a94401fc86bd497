"""IsoBN against a numpy transcription of the authors' PyTorch module (INK-USC/IsoBN ``IsoBN.forward``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from isojax.calibrate import IsoBN, isobn_scale


def np_isobn(x, cov, std, *, training, momentum=0.05, eps=1e-3):
    """The authors' forward pass (biased batch statistics, EMA, clipped correlations, renormalised scale)."""
    if training:
        y = x - x.mean(0)
        cov = cov + momentum * (y.T @ y / len(x) - cov)
        std = std + momentum * (np.sqrt((y**2).mean(0)) - std)
    corr = np.clip(cov / np.outer(std, std), -1, 1)
    gamma = (corr**2).mean(1)
    scale = 1 / (gamma * std + eps) ** 0.5
    scale *= (np.trace(cov) / ((np.diag(cov) * scale**2).sum() + eps)) ** 0.5
    return x * scale, cov, std, scale


def correlated_batches(seed, steps, n=32, d=6):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d)) * np.geomspace(3, 0.3, d)
    return [(rng.normal(size=(n, d)) @ A.T + 1.0).astype(np.float32) for _ in range(steps)]


def run(module, variables, x, *, train, mask=None):
    return module.apply(variables, x, mask=mask, use_running_average=not train, mutable=["batch_stats"])


@pytest.mark.parametrize("stats_init", ["identity", "zeros"])
def test_training_and_eval_match_numpy_reference(stats_init):
    batches = correlated_batches(0, 5)
    d = batches[0].shape[1]
    module = IsoBN(stats_init=stats_init)
    variables = module.init(jax.random.key(0), batches[0], use_running_average=False)
    start = (np.eye(d), np.ones(d)) if stats_init == "identity" else (np.zeros((d, d)), np.zeros(d))
    np.testing.assert_array_equal(variables["batch_stats"]["cov"], start[0])  # init does not update
    np.testing.assert_array_equal(variables["batch_stats"]["std"], start[1])
    step = jax.jit(lambda v, x: run(module, v, x, train=True))
    cov, std = (a.astype(np.float64) for a in start)
    for x in batches[:4]:
        y, variables = step(variables, x)
        y_ref, cov, std, _ = np_isobn(x.astype(np.float64), cov, std, training=True)
        np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(variables["batch_stats"]["cov"], cov, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(variables["batch_stats"]["std"], std, rtol=2e-5, atol=2e-5)
    y, updated = run(module, variables, batches[4], train=False)
    y_ref, *_ = np_isobn(batches[4].astype(np.float64), cov, std, training=False)
    np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)
    jax.tree.map(np.testing.assert_array_equal, updated, variables)  # evaluation leaves the statistics alone


def test_identity_start_is_near_identity_and_zeros_start_outputs_zeros():
    x = correlated_batches(1, 1)[0]
    ident = IsoBN(use_running_average=True)
    y = ident.apply(ident.init(jax.random.key(0), x), x)
    np.testing.assert_allclose(y, x, rtol=2e-3)
    zeros = IsoBN(use_running_average=True, stats_init="zeros")
    np.testing.assert_array_equal(zeros.apply(zeros.init(jax.random.key(0), x), x), np.zeros_like(x))


def test_mask_and_leading_axes():
    rng = np.random.default_rng(2)
    x = np.concatenate(correlated_batches(2, 2, n=16)).reshape(2, 16, 6)
    mask = rng.random((2, 16)) < 0.7
    x_padded = np.where(mask[..., None], x, 1e4).astype(np.float32)
    module = IsoBN()
    variables = module.init(jax.random.key(0), x, use_running_average=False)
    y, stats = run(module, variables, x_padded, train=True, mask=mask)
    y_ref, cov, std, scale = np_isobn(x[mask].astype(np.float64), np.eye(6), np.ones(6), training=True)
    np.testing.assert_allclose(stats["batch_stats"]["cov"], cov, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(stats["batch_stats"]["std"], std, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y, x_padded * scale, rtol=2e-5)
    _, unchanged = run(module, variables, x_padded, train=True, mask=np.zeros((2, 16), bool))
    jax.tree.map(np.testing.assert_array_equal, unchanged, variables)  # no real row: no update


def test_gradient_does_not_flow_through_statistics():
    x = correlated_batches(3, 1)[0]
    g = np.random.default_rng(3).normal(size=x.shape)
    module = IsoBN()
    variables = module.init(jax.random.key(0), x, use_running_average=False)
    grad = jax.grad(lambda x: jnp.sum(run(module, variables, x, train=True)[0] * g))(jnp.asarray(x))
    *_, scale = np_isobn(x.astype(np.float64), np.eye(6), np.ones(6), training=True)
    np.testing.assert_allclose(grad, g * scale, rtol=2e-5, atol=2e-5)


def test_sharded_batch_statistics_equal_the_global_batch():
    n_dev = len(jax.devices())
    x = correlated_batches(4, 1, n=4 * n_dev)[0]
    mesh = jax.make_mesh((n_dev,), ("batch",))
    module = IsoBN(axis_name="batch")
    variables = IsoBN().init(jax.random.key(0), x, use_running_average=False)
    sharded = jax.shard_map(
        lambda v, x: run(module, v, x, train=True), mesh=mesh, in_specs=(P(), P("batch")), out_specs=(P("batch"), P())
    )
    x_sharded = jax.device_put(x, jax.NamedSharding(mesh, P("batch")))
    variables = jax.device_put(variables, jax.NamedSharding(mesh, P()))
    y, stats = jax.jit(sharded)(variables, x_sharded)
    y_ref, cov, std, _ = np_isobn(x.astype(np.float64), np.eye(6), np.ones(6), training=True)
    np.testing.assert_allclose(stats["batch_stats"]["cov"], cov, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)


def test_constant_feature_and_bf16_input():
    x = correlated_batches(5, 1)[0]
    x[:, 2] = 3.0  # zero variance: the authors' code divides 0 by 0 here
    module = IsoBN()
    variables = module.init(jax.random.key(0), x, use_running_average=False)
    for _ in range(3):
        y, variables = run(module, variables, x, train=True)
    assert np.isfinite(y).all()
    y16, stats = run(module, variables, jnp.asarray(x, jnp.bfloat16), train=True)
    assert y16.dtype == jnp.bfloat16 and stats["batch_stats"]["cov"].dtype == jnp.float32
    assert np.isfinite(np.asarray(y16, np.float32)).all()
    assert np.isfinite(isobn_scale(jnp.zeros((3, 3)), jnp.zeros(3))).all()


def test_bad_input_raises():
    x = correlated_batches(6, 1)[0]
    with pytest.raises(ValueError, match="stats_init"):
        IsoBN(stats_init="ones").init(jax.random.key(0), x, use_running_average=False)
    with pytest.raises(ValueError, match="momentum"):
        IsoBN(momentum=0.0).init(jax.random.key(0), x, use_running_average=False)
    with pytest.raises(ValueError, match="mask must have shape"):
        IsoBN().init(jax.random.key(0), x, mask=np.ones(3, bool), use_running_average=False)
    with pytest.raises(TypeError, match="floating"):
        IsoBN().init(jax.random.key(0), x.astype(np.int32), use_running_average=False)
    with pytest.raises(ValueError, match=r"\[\.\.\., n, d\]"):
        IsoBN().init(jax.random.key(0), x[0], use_running_average=False)
