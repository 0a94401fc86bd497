"""Cost of isojax's IsoScore and 0-dim barcode against the reference packages.

    python -m experiments.benchmarks.metrics [--points 20000 --dim 768 --sizes 64 256 1024 --repeats 5] [--quick]

(a) ``isojax.metrics.isoscore`` (jitted by the caller, ``jax.jit(isoscore)``, as isojax's metrics expect) against
``IsoScore.IsoScore`` of the ``isoscore`` package (torch: ``torch.cov`` + ``svdvals``) on a float32
``[points, dim]`` cloud. The package's time includes its ``torch.tensor`` copy of the input, which is part of its
API.
(b) ``isojax.topology.zero_dim_barcode`` (``jax.jit``: Gram-matrix distances + Prim's ``fori_loop``) against
scipy (``pdist`` + ``minimum_spanning_tree``) and ripser (``ripser(x, maxdim=0)``, H0 only), each from the
``[n, dim]`` points to the finite bars, for each n in ``--sizes``.
Both sides run in this process after warm-up (``block_until_ready``); medians in ms; ratio = isojax / reference
(< 1: isojax faster). Goal on CPU: ratio <= 1 for IsoScore and for the barcode at n >= 256. The outputs are
compared before timing.
"""

from __future__ import annotations

import argparse
import warnings

import jax
import numpy as np

from experiments.benchmarks.common import cpu_count, machine, median_ms, report
from isojax.argtypes import int_at_least
from isojax.metrics import isoscore
from isojax.topology import zero_dim_barcode

# isojax's metrics are plain functions: the caller jits (one compilation per input shape).
isoscore_jit = jax.jit(isoscore)
barcode_jit = jax.jit(zero_dim_barcode)


def scipy_bars(x):
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.spatial.distance import pdist, squareform

    return np.sort(minimum_spanning_tree(squareform(pdist(x))).data)[::-1]


def ripser_bars(x):
    from ripser import ripser

    with warnings.catch_warnings():  # ripser warns when there are more features than points
        warnings.simplefilter("ignore", UserWarning)
        deaths = ripser(x, maxdim=0)["dgms"][0][:, 1]
    return np.sort(deaths[np.isfinite(deaths)])[::-1]


def bench_isoscore(args) -> None:
    import torch
    from IsoScore import IsoScore as package

    torch.set_num_threads(cpu_count())
    x = np.random.default_rng(0).standard_normal((args.points, args.dim)).astype(np.float32)
    x *= np.linspace(0.1, 3.0, args.dim, dtype=np.float32)  # anisotropic
    xj = jax.device_put(x)
    ours, theirs = float(isoscore_jit(xj)), float(package.IsoScore(x))
    print(f"(a) IsoScore of a float32 [{args.points}, {args.dim}] cloud: isojax {ours:.6f}, isoscore {theirs:.6f}")
    jax_ms = median_ms(lambda: isoscore_jit(xj), repeats=args.repeats)
    package_ms = median_ms(lambda: package.IsoScore(x), repeats=args.repeats)
    report([(f"IsoScore [{args.points}, {args.dim}]", jax_ms, package_ms)], "isojax", "isoscore")


def bench_barcode(args) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for n in args.sizes:
        x = rng.standard_normal((n, args.dim)).astype(np.float32)
        xj = jax.device_put(x)
        ours = np.asarray(barcode_jit(xj))
        error = max(np.abs(ours - scipy_bars(x)).max(), np.abs(ours - ripser_bars(x)).max()) / ours.max()
        print(f"(b) barcode n={n}, d={args.dim}: max relative difference to scipy/ripser bars {error:.1e}")
        jax_ms = median_ms(lambda: barcode_jit(xj), repeats=args.repeats)
        rows.append((f"barcode n={n} vs scipy MST", jax_ms, median_ms(lambda: scipy_bars(x), repeats=args.repeats)))
        rows.append((f"barcode n={n} vs ripser H0", jax_ms, median_ms(lambda: ripser_bars(x), repeats=args.repeats)))
    report(rows, "isojax", "reference")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int_at_least(2), default=20000, help="rows of the IsoScore cloud")
    parser.add_argument("--dim", type=int_at_least(1), default=768, help="feature dimension of both benchmarks")
    parser.add_argument(
        "--sizes", type=int_at_least(2), nargs="+", default=[64, 256, 1024], help="barcode point counts"
    )
    parser.add_argument("--repeats", type=int_at_least(1), default=5, help="timed runs per case (median reported)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2000 points, sizes 64 256, 2 repeats")
    parser.add_argument("--skip-isoscore", action="store_true")
    parser.add_argument("--skip-barcode", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.points, args.sizes, args.repeats = 2000, [64, 256], 2
    print(machine())
    if not args.skip_isoscore:
        bench_isoscore(args)
    if not args.skip_barcode:
        bench_barcode(args)


if __name__ == "__main__":
    main()
