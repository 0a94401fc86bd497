"""The scale table's readings (experiments/benchmarks/scale.py): the HLO collective parser and memory reading against closed
forms, and the issue's goals on a tiny BERT over the 8 virtual devices."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from experiments.benchmarks import scale

TINY = (
    "rte",
    dict(
        model_type="bert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=16,
    ),
)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(scale.MODELS, "tiny", TINY)
    return "tiny"


def test_collective_bytes_of_a_hand_written_shard_map():
    """psum of a [3, 5] float32 block: 60 bytes; all_gather of [16, 2] float32 blocks over 8 devices: the [128, 2]
    result, 1024 bytes; psum_scatter of [8, 2] blocks over the 4-device groups of a (2, 4) mesh: the whole [8, 2]
    array reduced, 64 bytes (its [2, 2] result x 4). Memory: the arguments of one device are its blocks."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def f(x, y, z):
        return (
            jax.lax.psum(x, ("a", "b")),
            jax.lax.all_gather(y, ("a", "b"), tiled=True),
            jax.lax.psum_scatter(z, "b", tiled=True),
        )

    g = jax.jit(
        jax.shard_map(
            f,
            mesh=mesh,
            in_specs=(P(("a", "b")), P(("a", "b")), P(("a", "b"))),
            out_specs=(P(), P(), P(("a", "b"))),
            check_vma=False,
        )
    )
    args = (jnp.ones((8 * 3, 5)), jnp.ones((8 * 16, 2)), jnp.ones((8 * 8, 2)))
    compiled = g.lower(*args).compile()
    got = scale.collective_bytes(compiled.as_text(), 8)
    assert got == {
        "all-reduce": 3 * 5 * 4,
        "all-gather": 128 * 2 * 4,
        "reduce-scatter": 8 * 2 * 4,
        "all-to-all": 0,
        "collective-permute": 0,
    }
    assert compiled.memory_analysis().argument_size_in_bytes == (3 * 5 + 16 * 2 + 8 * 2) * 4


def test_collective_bytes_reads_tuples_iota_groups_and_async_pairs():
    """Hand-written HLO lines: a tuple all-reduce (both results), an iota-grouped reduce-scatter (groups of 4), an
    async all-gather (its output, not its operand; the -done not again) and a bfloat16 collective-permute; the
    arrays each moves (what tells a batch-shaped array, :func:`experiments.scale.batch_shaped_bytes`)."""
    text = "\n".join(
        [
            "  %ar = (f32[10]{0}, bf16[4,4]{1,0}) all-reduce(%a, %b), replica_groups={}, to_apply=%add",
            "  %rs = f32[3,2]{1,0} reduce-scatter(%c), replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add",
            "  %ags = (f32[2,8]{1,0}, f32[16,8]{1,0}) all-gather-start(%d), replica_groups={{0,1,2,3,4,5,6,7}}",
            "  %agd = f32[16,8]{1,0} all-gather-done(%ags)",
            "  ROOT %cp = bf16[7]{0} collective-permute(%e), source_target_pairs={{0,1},{1,0}}",
        ]
    )
    assert [arrays for _, _, arrays in scale.collectives(text, 8)] == [
        (("f32", (10,)), ("bf16", (4, 4))),
        (("f32", (3, 2)),),
        (("f32", (16, 8)),),
        (("bf16", (7,)),),
    ]
    # batch-shaped: leading dimension 16 or 4 (rows), not a parameter's shape ([4, 4] is one here)
    assert scale.batch_shaped_bytes(text, 8, (16, 4), {(4, 4)}) == 16 * 8 * 4
    assert scale.batch_shaped_bytes(text, 8, (3,), set()) == 3 * 2 * 4 * 4  # the reduce-scatter's whole input
    assert scale.collective_bytes(text, 8) == {
        "all-reduce": 10 * 4 + 16 * 2,
        "all-gather": 16 * 8 * 4,
        "reduce-scatter": 3 * 2 * 4 * 4,
        "all-to-all": 0,
        "collective-permute": 7 * 2,
    }


def test_collectives_in_loops_follow_the_while_body_and_its_calls():
    """Of three all-reduces, one sits in a computation called by a while body: it is counted; the one in the
    entry computation and the one in an unrelated computation are not."""
    text = """
%inner (p: f32[4]) -> f32[4] {
  ROOT %x = f32[4]{0} all-reduce(%p), replica_groups={}, to_apply=%add
}

%body (p: f32[4]) -> f32[4] {
  ROOT %c = f32[4]{0} call(%p), to_apply=%inner
}

%other (p: f32[4]) -> f32[4] {
  ROOT %y = f32[4]{0} all-reduce(%p), replica_groups={}, to_apply=%add
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %w = f32[4]{0} while(%a), condition=%cond, body=%body
  ROOT %z = f32[4]{0} all-reduce(%w), replica_groups={}, to_apply=%add
}
"""
    assert scale.collectives_in_loops(text) == 1
    assert scale.collective_bytes(text, 8)["all-reduce"] == 3 * 16


def _cell(name, layout, **kw):
    layout = scale.LAYOUTS[layout]
    return scale.row(scale.measure(name, layout, length=8, **{"dtype": "float32", "remat": "none", **kw}), layout)


def test_data_parallel_step_all_reduces_the_gradient_once_and_holds_the_state(tiny):
    """Over 8 devices the train step's collectives are one all-reduce of the float32 gradient (4 bytes per
    parameter; within 5 %: the pooler, unused with [CLS] pooling, has no gradient) and each device holds the whole
    state: parameters and two Adam moments, 12 bytes per parameter (+ the step counters)."""
    r = _cell(tiny, "replicated 8", batch=16)
    params = r["params"]
    assert sum(r["collectives"].values()) == pytest.approx(4 * params, rel=0.05)
    assert r["collectives"]["all-gather"] == r["collectives"]["reduce-scatter"] == 0
    assert r["collective_ratio"] == pytest.approx(1, abs=0.05)
    assert r["state_bytes"] == pytest.approx(12 * params, rel=0.001)
    assert r["batch_bytes"] == (16 // 8) * 8 * 4 * 3 + (16 // 8) * 4  # ids, mask, types [2, 8] + labels [2]


def test_model_parallel_state_splits_the_megatron_matrices(tiny):
    """Over model 2 the per-device state is 12 bytes per parameter of the replicated arrays + half of the
    query/key/value/output and feed-forward matrices and the query/key/value and FFN input biases
    (4 h^2 + 3 h + 2 h i + i per layer), counted from the shapes."""
    r = _cell(tiny, "model 2", batch=16)
    h, i, layers = 32, 128, 2
    split = layers * (4 * h * h + 3 * h + 2 * h * i + i)
    assert r["state_bytes"] == pytest.approx(12 * (r["params"] - split / 2), rel=0.0002)
    assert r["state_ratio"] == pytest.approx(1, rel=0.0002)


def test_fsdp_state_is_the_total_over_the_devices(tiny):
    """Under FSDP over 8 devices each holds 1/8 of the parameters and of the two Adam moments (12 bytes per
    parameter in all) within 5 % (arrays whose dimensions do not divide by 8 stay whole)."""
    r = _cell(tiny, "fsdp 8", batch=16)
    assert r["state_bytes"] == pytest.approx(12 * r["params"] / 8, rel=0.05)
    assert r["state_ratio"] == pytest.approx(1, rel=0.05)


# wide enough that, left to XLA's sharding propagation, FSDP gathered the batch's activations instead of parameters
WIDE = ("rte", {**TINY[1], "hidden_size": 256, "num_hidden_layers": 1, "intermediate_size": 1024})


def test_fsdp_step_gathers_parameters_once_and_reduces_gradients_never_activations(monkeypatch):
    """The FSDP train step over 8 devices (a 1-layer, 256-wide BERT; 24 rows of 16 tokens, 3 per device), read from
    the compiled HLO: no collective moves an array whose leading dimension is the batch's 24 rows or a device's 3
    (activations, masks, token ids); the all-gathers move each parameter split over the data axis once, whole
    (4 bytes x its size, summed from the state's shardings); the all-reduces move the float32 gradient of every
    parameter but the pooler's (unused with [CLS] pooling: no gradient), 4 bytes per parameter, plus scalars."""
    monkeypatch.setitem(scale.MODELS, "wide", WIDE)
    batch, length = 24, 16
    step, state, rows, _ = scale.build_step(
        "wide", scale.LAYOUTS["fsdp 8"], dtype="float32", remat="none", batch=batch, length=length
    )
    ops = list(scale.collectives(step.lower(state, rows).compile().as_text(), 8))
    shapes = {shape for _, _, arrays in ops for _, shape in arrays}
    assert not {shape for shape in shapes if shape[:1] in ((batch,), (batch // 8,))}
    params = jax.tree_util.tree_leaves_with_path(state.params)
    assert shapes <= {x.shape for _, x in params} | {()}
    split = sum(x.size for _, x in params if "data" in x.sharding.spec)
    assert split > 0.99 * sum(x.size for _, x in params)  # all but the 2-way classifier's bias
    assert {op for op, _, _ in ops} == {"all-gather", "all-reduce"}
    assert sum(total for op, total, _ in ops if op == "all-gather") == 4 * split
    scalars = sum(
        scale.DTYPE_BYTES[t] for op, _, arrays in ops if op == "all-reduce" for t, shape in arrays if not shape
    )
    with_gradient = sum(x.size for path, x in params if "pooler" not in jax.tree_util.keystr(path))
    assert sum(total for op, total, _ in ops if op == "all-reduce") - scalars == 4 * with_gradient


def test_fit_extrapolates_the_peak_linearly():
    """Peaks 10 + 2 B bytes: a 100-byte device fits B = 45, rounded down to 44 over 4 data shards; none fits 11."""
    small, large = {"batch": 4, "peak_bytes": 18}, {"batch": 8, "peak_bytes": 26}
    assert scale.fit(small, large, 100, 4) == 44
    assert scale.fit(small, large, 11, 1) is None


def test_local_plan_takes_the_layouts_over_the_devices_there_are():
    """One device: the replicated-1 cells of every model; 8 devices: the 8-device layouts; 3 devices: those over 2."""
    assert {c.layout for c in scale.local_plan(1)} == {"replicated 1"}
    assert {c.model for c in scale.local_plan(1)} == set(scale.MODELS)
    assert {c.layout for c in scale.local_plan(3)} == {"replicated 2"}
    assert {c.layout for c in scale.local_plan(8)} == {
        "replicated 8",
        "model 2",
        "model 4",
        "model 8",
        "fsdp 8",
        "fsdp 4 x model 2",
    }
    assert all(len(c.batches) == 2 for c in scale.local_plan(8))


@pytest.mark.slow
def test_accelerator_prints_and_writes_the_scale_rows(tiny, monkeypatch, tmp_path, capsys):
    """experiments.accelerator's scale part: the local plan compiled, its table printed and written by device; on
    one device the step has no collective and holds the whole state (12 bytes per parameter + step counters)."""
    from experiments import accelerator

    monkeypatch.setattr(scale, "local_plan", lambda n: [scale.Cell(tiny, "replicated 1", batches=(2, 4))])
    got = accelerator.run_scale(str(tmp_path), "some-device", {"command": "test"}, length=8)
    assert got["compiled"] == 2
    assert (tmp_path / "some-device-scale.md").exists() and (tmp_path / "some-device-scale.json").exists()
    printed = capsys.readouterr().out
    assert "| tiny | replicated 1 | float32 | none | 2 |" in printed and "What fits where" in printed
    rows = json.loads((tmp_path / "some-device-scale.json").read_text())["rows"]
    assert [sum(r["collectives"].values()) for r in rows] == [0, 0]
    assert rows[0]["state_bytes"] == pytest.approx(12 * rows[0]["params"], rel=0.001)
