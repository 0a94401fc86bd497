"""Which SoftDecay the STS table's isotropy row measures: each side of the pairs transformed on its own.

``experiments/reproductions/softdecay_sts.py`` fills the Figure-4 measures (IsoScore .5730 for SoftDecay on STS15, MiniLM mean
pooling, in ``experiments/results/softdecay_sts.md``) with :func:`isojax.eval.sts.evaluate_pairs`, which applies
SoftDecay to the ``[N, d]`` matrix of the first sentences and to that of the second sentences separately (as the
SoftDecay authors' code does) and then measures the ``2N`` rows together. One SoftDecay over all ``2N`` rows
(:meth:`Transform.apply_joint`) is another cloud, with another IsoScore. Both are shown here on a synthetic pair
set whose two sides have different principal axes.

References: SoftDecay written here in numpy from the paper's eq. 2 and Algorithm 1 (SVD, f(σ) = −ln(1 − α(σ + α))/α,
rescaled so that the top singular value is kept), and IsoScore from Rudman et al.'s steps (PCA variances, ddof=1,
scaled to norm √d, isotropy defect δ).
"""

import numpy as np

from isojax.eval import sts

ALPHA = -0.2


def soft_decay_np(x, alpha):
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    f = -np.log(1 - alpha * (s + alpha)) / alpha
    return (u * (s.max() / f.max() * f)) @ vt


def isoscore_np(x):
    n, d = x.shape
    centred = x - x.mean(0)
    variances = np.linalg.eigvalsh(centred.T @ centred / (n - 1))  # the PCA-rotated cloud's variances
    v = np.sqrt(d) * variances / np.linalg.norm(variances)
    delta = np.linalg.norm(v - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    return ((d - delta**2 * (d - np.sqrt(d))) ** 2 - d) / (d * (d - 1))


def pair_sides(n=150, d=12, seed=0):
    """Two sides of ``n`` pairs in R^d, each strongly anisotropic, along different axes, with opposite offsets."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(8.0, 0.2, d)
    offset = 5 * rng.normal(size=d)
    a = rng.normal(size=(n, d)) * scales + offset
    b = (a + 0.5 * rng.normal(size=(n, d)) * scales)[:, ::-1] - offset  # reversed axes: another top direction
    return a.astype(np.float32), b.astype(np.float32), rng.normal(size=n)


def test_table_path_transforms_each_side_separately_and_differs_from_one_joint_transform():
    a, b, gold = pair_sides()
    table_row = sts.evaluate_pairs(a, b, gold, sts.Transform("softdecay", alpha=ALPHA), isotropy=True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    per_side = isoscore_np(np.concatenate([soft_decay_np(a64, ALPHA), soft_decay_np(b64, ALPHA)]))
    joint = isoscore_np(soft_decay_np(np.concatenate([a64, b64]), ALPHA))
    np.testing.assert_allclose(table_row["isoscore"], per_side, rtol=1e-4)  # the table measures per side ...
    assert abs(per_side - joint) > 0.05, (per_side, joint)  # ... which is not the joint transform's cloud
    # The joint variant, from the same Transform: one SoftDecay over the 2N rows.
    joint_rows = np.asarray(sts.Transform("softdecay", alpha=ALPHA).apply_joint(np.concatenate([a, b])))
    np.testing.assert_allclose(isoscore_np(joint_rows.astype(np.float64)), joint, rtol=1e-4)
    # The raw cloud is the same for both, and both transforms raise its isotropy.
    assert isoscore_np(np.concatenate([a64, b64])) < min(per_side, joint)
