"""isojax.stats (streaming per-layer statistics) against numpy on all the real tokens at once and against the in-memory
isojax.metrics / isojax.calibrate functions on the same tokens: batches with padding, merges, 8 devices, files."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from isojax import calibrate, metrics, stats

B, LAYERS, L, D = 12, 3, 9, 5


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def corpus(seed=0, offset=30.0):
    """States ``[B, layers, L, d]`` (anisotropic, far off the origin), a right-padded mask ``[B, L]`` with garbage
    (NaN) in the padding, and the real tokens of each layer ``[layers, T, d]`` (numpy float64)."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(LAYERS, D, D)) * rng.uniform(0.05, 3.0, size=(LAYERS, 1, D))
    x = np.einsum("blnd,lde->blne", rng.normal(size=(B, LAYERS, L, D)), mixing) + offset
    lengths = rng.integers(1, L + 1, size=B)
    mask = np.arange(L) < lengths[:, None]
    x[~np.broadcast_to(mask[:, None, :], x.shape[:-1])] = np.nan
    real = np.stack([x[:, layer][mask] for layer in range(LAYERS)])
    return x, mask, real


def stream(x, mask, sizes=(5, 4, 3)):
    """The state of ``x`` folded in as batches of ``sizes`` texts, under one jitted update."""
    update = jax.jit(stats.update)
    state, start = stats.init(D, layers=LAYERS), 0
    for size in sizes:
        state = update(state, x[start : start + size], mask[start : start + size])
        start += size
    assert start == len(x)
    return state


def test_streamed_moments_equal_numpy_over_all_real_tokens(x64):
    x, mask, real = corpus()
    state = stream(x, mask)
    assert state.mean.dtype == jnp.float64
    np.testing.assert_array_equal(state.tokens, [len(r) for r in real])
    np.testing.assert_allclose(state.mean, real.mean(1), rtol=1e-12)
    np.testing.assert_allclose(stats.covariance(state), [np.cov(r.T) for r in real], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.covariance(state, ddof=0), [np.cov(r.T, ddof=0) for r in real], rtol=1e-10)
    np.testing.assert_allclose(stats.second_moment(state), [r.T @ r / len(r) for r in real], rtol=1e-12)


def test_streamed_measures_equal_the_in_memory_functions(x64):
    """1e-6 relative in float64, for every layer, on the same tokens in memory (padding full of NaN)."""
    x, mask, real = corpus()
    state = stream(x, mask)
    close = dict(rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(stats.isoscore(state), metrics.isoscore(real), **close)
    np.testing.assert_allclose(stats.isoscore_star(state, zeta=0.3), metrics.isoscore_star(real, zeta=0.3), **close)
    c0 = np.cov(real[0].T) + np.eye(D)
    np.testing.assert_allclose(stats.isoscore_star(state, c0=c0), metrics.isoscore_star(real, c0=c0), **close)
    for centered in (False, True):
        for k in (1, 2):
            np.testing.assert_allclose(
                stats.anisotropy(state, k=k, centered=centered), metrics.anisotropy(real, k=k, center=centered), **close
            )
        np.testing.assert_allclose(
            stats.explained_variance(state, 3, centered=centered),
            metrics.explained_variance(real, 3, center=centered),
            **close,
        )
    np.testing.assert_allclose(stats.mean_cosine(state), metrics.token_uniformity(real), **close)
    rogue, in_memory = stats.rogue_dimensions(state), metrics.rogue_dimensions(real)
    for field in ("contributions", "mean_cosine", "top1_share", "top3_share"):
        np.testing.assert_allclose(getattr(rogue, field), getattr(in_memory, field), **close)
    assert np.isnan(rogue.standardized_cosine).all()  # needs a second pass: not from a state


def test_streamed_fits_equal_calibrate(x64):
    x, mask, real = corpus()
    state = stream(x, mask)
    np.testing.assert_allclose(stats.fit_centering(state).mean, calibrate.fit_centering(real).mean, rtol=1e-12)
    streamed, in_memory = stats.fit_whitening(state, k=3), calibrate.fit_whitening(real, k=3)
    np.testing.assert_allclose(streamed.mean, in_memory.mean, rtol=1e-10)
    np.testing.assert_allclose(streamed.W, in_memory.W, rtol=1e-6, atol=1e-9)
    whitened = (real[1] - np.asarray(streamed.mean[1])) @ np.asarray(stats.fit_whitening(state, eps=0.0).W[1])
    np.testing.assert_allclose(np.cov(whitened.T), np.eye(D), atol=1e-8)


def test_largest_activation_is_numpy_argmax_over_the_stream(x64):
    x, mask, real = corpus()
    x = x.copy()
    x[7, 1, 2, 3] = -1e4  # a massive activation in layer 1, text 7, position 2, dimension 3
    mask[7, 2] = True
    real = np.stack([x[:, layer][mask] for layer in range(LAYERS)])
    state = stream(x, mask)
    for layer in range(LAYERS):
        magnitude = np.abs(real[layer])
        np.testing.assert_array_equal(state.max_abs[layer], magnitude.max(0))
        np.testing.assert_array_equal(state.max_index[layer], magnitude.argmax(0))  # the k-th real token of the stream
        positions = np.nonzero(mask)[1]  # real tokens in stream order: text-major, position within the text
        np.testing.assert_array_equal(state.max_position[layer], positions[magnitude.argmax(0)])
    top = stats.massive_activation(state)
    assert (float(top.value[1]), int(top.dimension[1]), int(top.position[1])) == (1e4, 3, 2)
    assert int(top.token[1]) == mask[:7].sum() + 2


def test_merge_and_files_are_the_stream_of_both(x64, tmp_path):
    """Two halves accumulated apart (as by two processes), saved, loaded and merged = one stream of all."""
    x, mask, real = corpus(seed=1)
    first, second = stream(x[:5], mask[:5], (5,)), stream(x[5:], mask[5:], (3, 4))
    path = stats.save(second, tmp_path / "second.npz")
    merged = stats.merge(first, stats.load(path))
    whole = stream(x, mask)
    for a, b in zip(merged, whole):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(stats.isoscore(merged), metrics.isoscore(real), rtol=1e-6)
    assert stats.load(path).m2.dtype == np.float64
    np.savez(tmp_path / "other.npz", tokens=np.zeros(3))
    with pytest.raises(ValueError, match="missing"):
        stats.load(tmp_path / "other.npz")


def test_sharded_accumulation_on_8_devices_equals_in_memory(x64):
    """Each of 8 devices folds in its shard of every batch; merge_over_axis combines them by collectives."""
    devices = jax.devices()
    assert len(devices) == 8
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 16, LAYERS, L, D)) * rng.uniform(0.1, 3, size=D) + 5.0  # 3 batches of 16 texts
    mask = rng.uniform(size=(3, 16, L)) < 0.7
    x[~np.broadcast_to(mask[:, :, None, :], x.shape[:-1])] = np.inf
    mesh = Mesh(np.array(devices), ("data",))

    @jax.jit
    def accumulate(x, mask):
        def per_device(x, mask):
            state = stats.init(D, layers=LAYERS)
            for b in range(x.shape[0]):
                state = stats.update(state, x[b], mask[b])
            return stats.merge_over_axis(state, "data")

        return jax.shard_map(
            per_device,
            mesh=mesh,
            in_specs=(PartitionSpec(None, "data"), PartitionSpec(None, "data")),
            out_specs=PartitionSpec(),
        )(x, mask)

    state = accumulate(x, mask)
    real = np.stack([np.concatenate([x[b, :, layer][mask[b]] for b in range(3)]) for layer in range(LAYERS)])
    np.testing.assert_array_equal(state.tokens, [len(r) for r in real])
    np.testing.assert_allclose(stats.covariance(state), [np.cov(r.T) for r in real], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(stats.isoscore(state), metrics.isoscore(real), rtol=1e-6)
    np.testing.assert_allclose(stats.anisotropy(state, centered=True), metrics.anisotropy(real, center=True), rtol=1e-6)
    np.testing.assert_allclose(stats.mean_cosine(state), metrics.token_uniformity(real), rtol=1e-6)
    np.testing.assert_array_equal(state.max_abs, np.abs(real).max(1))
    # The stream order of a sharded accumulation: device 0's tokens (its shard of every batch), then device 1's...
    order = np.concatenate([mask[b, 2 * k : 2 * k + 2].ravel() for k in range(8) for b in range(3)])
    assert order.sum() == len(real[0])
    per_device = [
        np.concatenate([x[b, 2 * k : 2 * k + 2, layer][mask[b, 2 * k : 2 * k + 2]] for b in range(3)])
        for layer in range(LAYERS)
        for k in range(8)
    ]
    device_order = np.stack([np.concatenate(per_device[i * 8 : (i + 1) * 8]) for i in range(LAYERS)])
    np.testing.assert_array_equal(state.max_index, np.abs(device_order).argmax(1))


def test_float32_accumulation_stays_accurate_far_from_the_origin():
    """Without x64 the state is float32; per-batch centring + Chan merges keep the covariance of states with a
    mean 1000 times their spread to float32 accuracy, where the raw-moment formula loses it."""
    assert not jax.config.jax_enable_x64
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(40, 50, D)) + 1000.0).astype(np.float32)
    update = jax.jit(stats.update)
    state = stats.init(D)
    for batch in x:
        state = update(state, batch[None])
    assert state.m2.dtype == jnp.float32 and state.tokens.dtype == jnp.int32
    rows = x.reshape(-1, D).astype(np.float64)
    expected = np.cov(rows.T)
    np.testing.assert_allclose(stats.covariance(state), expected, rtol=1e-3, atol=1e-3 * expected.max())
    raw = rows.astype(np.float32)
    naive = (raw.T @ raw - len(raw) * np.outer(raw.mean(0), raw.mean(0))) / (len(raw) - 1)
    assert np.abs(naive - expected).max() > 10 * np.abs(np.asarray(stats.covariance(state)) - expected).max()


def test_state_size_does_not_grow_with_the_tokens():
    """Memory independent of the corpus: the state after 10 or 10 000 tokens has the same leaves."""
    small = stats.update(stats.init(D, layers=2), np.ones((1, 2, 10, D), np.float32))
    large = stats.update(stats.init(D, layers=2), np.ones((50, 2, 200, D), np.float32))
    assert [a.shape for a in small] == [a.shape for a in large]
    size = sum(a.size for a in large)
    assert size == 2 * (1 + 6 * D + D * D)  # count, 6 vectors, M2


def test_bad_input():
    state = stats.init(D, layers=LAYERS)
    x = np.zeros((2, LAYERS, L, D), np.float32)
    with pytest.raises(ValueError, match="match the state's shape"):
        stats.update(state, x[:, :2])
    with pytest.raises(ValueError, match=r"d=5 features"):
        stats.update(state, x[..., :4])
    with pytest.raises(ValueError, match="mask must have shape"):
        stats.update(state, x, np.ones((2, L + 1), bool))
    bad = x.copy()
    bad[1, 2, 4, 0] = np.nan
    with pytest.raises(ValueError, match=r"x has a non-finite value \(NaN or inf\) in row 4"):
        stats.update(state, bad)
    poisoned = jax.jit(stats.update)(state, bad).m2  # traced: that layer's state is NaN, never a finite number
    assert np.isnan(poisoned[2]).all() and np.isfinite(poisoned[:2]).all()
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        stats.update(state, x.astype(np.int32))
    with pytest.raises(TypeError, match="stats must be an isojax.stats.Stats"):
        stats.update({"count": 0}, x)
    with pytest.raises(ValueError, match="at least 2 token"):
        stats.isoscore(stats.update(state, x[:1, :, :1]))
    with pytest.raises(ValueError, match="d must be >= 1"):
        stats.init(0)
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        stats.merge(state, stats.init(D))
    with pytest.raises(ValueError, match="k must be"):
        stats.anisotropy(stats.update(state, x), k=D + 1)
