"""Seconds of I-STAR's ``c0="data"`` reference pass: the covariance of the head input over a GLUE training split,
as :func:`isojax.train.tasks.classification.representation_covariance` streams it (rows shortest first, each batch
cut to the split's bucket width of its longest row), against the same stream in the rows' own order with the
default buckets (32, 64, ...).

    python -m experiments.benchmarks.reference_covariance [--config experiments/reproductions/configs/glue_methods.json]
        [--data-dir ../shared/data] [--tasks sst2,cola] [--limit 4096] [--repeats 2]

Each task's run is the campaign's App. B I-STAR (C0 from data) run of seed 0 (its model, ``max_length``, buckets and
``eval_batch_size``); the model is the pretrained encoder with a fresh head, as at the start of training. Both sides
stream the first ``--limit`` training rows (0: all) in one process, after one untimed call each, ``--repeats`` times
alternating (:func:`~experiments.benchmarks.common.interleaved_medians`). Each call jits its forward afresh, as a run
does once, so the times include compiling every width a side meets (the sorted side meets more: one per bucket up to
its longest row); a few hundred rows measure mostly that. The median is reported with the padded tokens per row each
side feeds, the ratio (sorted / data order, goal < 1) and the largest difference of the two covariances relative to
their largest entry (the sums are the same up to rounding).
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from experiments.benchmarks.common import interleaved_medians, machine
from experiments.campaign.spec import DEFAULT_CONFIG, DEFAULT_DATA, expand
from isojax import stats
from isojax.argtypes import int_at_least
from isojax.data.batching import DEFAULT_BUCKETS, batches, bucket_length
from isojax.train.tasks.classification import ClassificationRecipe, representation_covariance


def data_order_covariance(model, variables, split, batch_size: int) -> np.ndarray:
    """The covariance of the head input ``cls`` streamed in the rows' own order, default buckets, accumulated in
    float64 with :mod:`isojax.stats`."""
    forward = jax.jit(lambda v, b: model.apply(v, b["input_ids"], b["attention_mask"], b["token_type_ids"]))
    state = None
    for b in batches(split.tokens(), batch_size):
        rows = np.asarray(forward(variables, b).cls, np.float64)  # the forward pass in its own dtypes
        with jax.enable_x64(True):
            state = stats.update(stats.init(rows.shape[-1]) if state is None else state, rows)
    if state is None:
        raise ValueError("the split has no rows")
    with jax.enable_x64(True):
        return np.asarray(stats.covariance(state))


def padded_tokens_per_row(lengths: np.ndarray, batch_size: int, buckets, width: int) -> float:
    """Tokens fed per row when rows of ``lengths`` (in that order) go in batches cut to their bucket width."""
    fed = sum(
        len(chunk) * bucket_length(chunk, buckets, max_length=width)
        for chunk in (lengths[k : k + batch_size] for k in range(0, len(lengths), batch_size))
    )
    return fed / len(lengths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--data-dir", default=DEFAULT_DATA)
    ap.add_argument("--tasks", default="sst2,cola")
    ap.add_argument("--limit", type=int_at_least(0), default=4096, help="the first N training rows (0 = all)")
    ap.add_argument("--repeats", type=int_at_least(1), default=2)
    args = ap.parse_args(argv)

    with open(args.config) as f:
        campaign = expand(json.load(f))
    runs = {r.task: r for r in campaign if (r.protocol, r.method, r.seed) == ("appB", "istar (C0 from data)", 0)}
    print(machine())
    print(
        f"{'task':<6} {'rows':>6} {'tokens/row sorted':>18} {'data order':>11} {'s sorted':>9} {'s data order':>13} "
        f"{'ratio':>6} {'max rel diff':>13}"
    )
    for task in args.tasks.split(","):
        config = runs[task].config(data_dir=args.data_dir)
        recipe = ClassificationRecipe(config)
        model, params, tokenizer = recipe.build()
        train = recipe.load("train", tokenizer, args.limit)
        variables = recipe.init_variables(model, params, jax.random.key(0), None)
        batch = config.optim.eval_batch_size
        result: dict[str, np.ndarray] = {}
        sides = {
            "sorted": lambda: result.update(sorted=representation_covariance(model, variables, train, batch)("cls")),
            "data order": lambda: result.update({"data order": data_order_covariance(model, variables, train, batch)}),
        }
        t_sorted, t_order = (ms / 1e3 for ms in interleaved_medians(sides, args.repeats).values())
        mask = train.tokens()["attention_mask"]
        lengths, width = mask.sum(1), mask.shape[1]
        fed_sorted = padded_tokens_per_row(np.sort(lengths, kind="stable"), batch, train.buckets, width)
        fed_order = padded_tokens_per_row(lengths, batch, DEFAULT_BUCKETS, width)
        a, b = result["sorted"], result["data order"]
        print(
            f"{task:<6} {len(train):>6} {fed_sorted:>18.1f} {fed_order:>11.1f} {t_sorted:>9.1f} {t_order:>13.1f} "
            f"{t_sorted / t_order:>6.3f} {np.abs(a - b).max() / np.abs(b).max():>13.2e}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
