"""The fine-tuning guide's Python training example runs as written: a model, an objective with a scheduled
regulariser, an optimiser and a train step, run data-parallel on a mesh of the 8 virtual devices.

References: the first step against the same step written by hand with flax, optax and ``isojax.losses`` on one
device (loss, and the parameters after AdamW's update); the schedule against optax evaluated on its own; the task
loss falls on every pass over the data.
"""

import time
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from isojax import losses

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")

# The guide's "From Python" block, read from docs/guides/finetuning.md so that the two cannot drift apart.
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "finetuning.md"
EXAMPLE = GUIDE.read_text().split("**From Python.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]

B, L, EPOCHS = 16, 8, 6


def _batches():
    """4 batches of 16 rows, seen 6 times; the label is the second token's id mod 3, so it can be learned."""
    out = []
    for i in range(4):
        r = np.random.default_rng(i)
        mask = (np.arange(L) < r.integers(3, L + 1, B)[:, None]).astype(np.int32)
        ids = (r.integers(1, 100, (B, L)) * mask).astype(np.int32)
        out.append(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "token_type_ids": np.zeros((B, L), np.int32),
                "labels": (ids[:, 1] % 3).astype(np.int32),
            }
        )
    return out * EPOCHS


def _reference_first_step(namespace, batch):
    """The first step by hand: flax forward with the step's dropout key ``fold_in(key(0), 0)``, optax's cross-entropy
    + 0.1 (the schedule at step 0) * losses.istar_loss of [CLS], gradient, one AdamW update."""
    model, variables = namespace["model"], namespace["variables"]

    def loss(params):
        out = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            deterministic=False,
            rngs={"dropout": jax.random.fold_in(jax.random.key(0), 0)},
        )
        ce = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["labels"]).mean()
        return ce + 0.1 * losses.istar_loss(out.cls)

    value, grads = jax.jit(jax.value_and_grad(loss))(variables["params"])
    tx = optax.adamw(1e-3)
    updates, _ = tx.update(grads, tx.init(variables["params"]), variables["params"])
    return float(value), optax.apply_updates(variables["params"], updates)


def test_readme_training_example_runs_on_the_mesh(capsys):
    batches = _batches()
    namespace = {"batches": batches[:1]}
    exec(EXAMPLE, namespace)  # one step: compare with the hand-written step
    first = [float(x) for x in capsys.readouterr().out.split()]
    want_loss, want_params = _reference_first_step(namespace, batches[0])
    assert first[0] == 1 and first[1] == pytest.approx(want_loss, rel=1e-5)
    jax.tree.map(
        lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6),
        jax.device_get(namespace["state"].params),
        want_params,
    )
    assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(namespace["state"]))

    namespace = {"batches": batches}
    start = time.perf_counter()
    exec(EXAMPLE, namespace)  # the whole run, timed (compilation included)
    seconds = time.perf_counter() - start
    rows = np.array([[float(x) for x in line.split()] for line in capsys.readouterr().out.splitlines()])
    np.testing.assert_array_equal(rows[:, 0], np.arange(1, len(batches) + 1))
    schedule = optax.linear_schedule(0.1, 1.0, 50)
    np.testing.assert_allclose(rows[:, 3], [float(schedule(t)) for t in range(len(batches))], rtol=1e-6)
    task = rows[:, 2].reshape(EPOCHS, -1).mean(1)  # mean task loss of each pass over the 4 batches
    assert np.all(np.diff(task) < 0) and task[-1] < task[0] - 0.05, task  # falls on every pass
    print(
        f"guide example: {len(batches)} steps in {seconds:.1f} s (compilation included); task loss per pass "
        f"{np.round(task, 3).tolist()}"
    )
