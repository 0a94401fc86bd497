"""Per-device memory of the analysis forward of Llama-3-8B- and Llama-3-70B-shaped models under FSDP x tensor
parallelism, from compiled modules' ``memory_analysis()``; which batch x length fits a 16, 32 and 80 GiB device.

    python -m experiments.benchmarks.llm_memory [--models llama-3-8b,llama-3-70b] [--devices 8,64,256]
                                               [--lengths 2048,8192] [--out experiments/results]

**Forward.** ``CausalLM.apply`` on bfloat16 parameters with bfloat16 compute, returning the hidden state of every
layer (what ``isojax analyze`` reads; the logits are not returned, so XLA drops the LM head), built from a config:
nothing is downloaded or initialised (abstract parameters, ``jax.eval_shape``); each cell is lowered and compiled,
never run. The devices are virtual CPU devices (``--xla_force_host_platform_device_count``).

**Layout.** A ``(data, model)`` mesh: 8 devices as 2 x 4, 64 as 8 x 8, 256 as 32 x 8. Parameters by the model's
partition rules (:func:`isojax.models.partition_rules`: Megatron tensor parallelism over ``model``) with FSDP over
``data`` (:func:`isojax.models.partitioning.fsdp_spec`); the batch and the returned hidden states split over
``data``.

**Scanned layers.** The blocks run as one ``nn.scan`` loop (``CausalLM(scan_layers=True)``): each iteration gathers
its own layer's FSDP shards, and the model compiles at its full depth in seconds. (Unrolled, XLA's CPU scheduler
gathers every layer's shards up front: Llama-3-70B on 2 x 4 devices then needs 94 GiB per device at one row per data
shard, whatever the FSDP split.)

What the compiled forward holds, read from its memory analysis: the per-device parameters (argument bytes: the
FSDP x model shard), every layer's hidden states (output), and temporaries that include the parameters gathered over
the data axis for the whole stack (XLA gathers a scanned weight before the loop rather than one layer per
iteration), so the temporary bytes grow with the model over the model axis, not over the whole mesh.

**Batch.** Each cell is compiled at 1 and 2 rows per data shard; the per-device peak (argument + output + temporary
bytes) is extrapolated linearly in the batch; a device of M GiB fits the largest global batch (a multiple of the
data-axis size) whose peak <= M. ``--check`` compiles one more batch per model and reports the extrapolation's error.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, cast

if __name__ == "__main__":  # the largest mesh needs 256 devices; on CPU they are virtual
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=256")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import traverse_util  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from experiments.tooling.report import markdown_table, provenance, write_result  # noqa: E402
from isojax.models import DecoderOutput, TransformerConfig, build_model, init_params, partition_rules  # noqa: E402
from isojax.models.partitioning import fsdp_spec  # noqa: E402
from isojax.models.rope import Rope  # noqa: E402
from isojax.train.parallel import make_mesh, partition_spec  # noqa: E402

GIB = 2**30
DEVICES_GIB = {"TPU v5e (16 GiB)": 16, "TPU v4 (32 GiB)": 32, "H100 (80 GiB)": 80}
MESHES = {8: (2, 4), 64: (8, 8), 256: (32, 8)}
_LLAMA3: dict[str, Any] = dict(
    model_type="llama",
    vocab_size=128256,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    layer_norm_eps=1e-5,
    type_vocab_size=0,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    pre_norm=True,
    embedding_norm=False,
    norm="rms_norm",
    gated_mlp=True,
    hidden_act="silu",
    attention_bias=False,
    attention_output_bias=False,
    mlp_bias=False,
    tie_word_embeddings=False,
    rope=Rope(
        theta=500000.0,
        kind="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
)
MODELS: dict[str, dict[str, Any]] = {  # Meta's config.json sizes
    "llama-3-8b": dict(
        _LLAMA3, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=14336
    ),
    "llama-3-70b": dict(
        _LLAMA3, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, intermediate_size=28672
    ),
}


def compile_cell(name: str, devices: int, batch: int, length: int) -> dict:
    """Lower and compile one forward; its per-device memory (bytes) and the compile seconds."""
    cfg = TransformerConfig(**MODELS[name])
    mesh = make_mesh(devices, model_parallel=MESHES[devices][1])
    module = build_model(cfg, dtype=jnp.bfloat16).clone(scan_layers=True)
    abstract = jax.eval_shape(lambda: init_params(module, jax.random.key(0)))
    rules, data = partition_rules(cfg), MESHES[devices][0]

    def place(path, leaf):
        joined = "/".join(path)
        spec = fsdp_spec(joined, leaf.shape, partition_spec(joined, leaf.shape, MESHES[devices][1], rules), data)
        return jax.ShapeDtypeStruct(leaf.shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))

    params = traverse_util.unflatten_dict({p: place(p, x) for p, x in traverse_util.flatten_dict(abstract).items()})
    rows = NamedSharding(mesh, P("data", None))
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=rows)

    def forward(params, ids, mask):
        return cast(DecoderOutput, module.apply({"params": params}, ids, mask)).hidden_states

    start = time.perf_counter()
    states = NamedSharding(mesh, P("data", None, None))
    compiled = jax.jit(forward, out_shardings=states).lower(params, ids, mask).compile()
    mem = compiled.memory_analysis()
    assert mem is not None  # the CPU, GPU and TPU backends all report it
    return {
        "argument": mem.argument_size_in_bytes,
        "output": mem.output_size_in_bytes,
        "temp": mem.temp_size_in_bytes,
        "peak": mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes,
        "seconds": round(time.perf_counter() - start, 1),
    }


def largest_batch(small: dict, large: dict, device_bytes: float, data: int) -> int | None:
    """Largest global batch (a multiple of ``data``) whose peak, linear through the two measured cells, fits."""
    slope = (large["peak"] - small["peak"]) / (large["batch"] - small["batch"])
    intercept = small["peak"] - slope * small["batch"]
    if slope <= 0 or small["peak"] > device_bytes:
        return None
    batch = int((device_bytes - intercept) // slope) // data * data
    return batch if batch >= data else None


def run(models, devices, lengths, check: bool) -> dict:
    cells, checks = [], []
    for name in models:
        for n in devices:
            data = MESHES[n][0]
            for length in lengths:
                small, large = (dict(compile_cell(name, n, b, length), batch=b) for b in (data, 2 * data))
                print(f"{name} {n} devices length {length}: {small} {large}")
                cells.append(
                    {
                        "model": name,
                        "devices": n,
                        "mesh": MESHES[n],
                        "length": length,
                        "measured": [small, large],
                        "peak_gib_at_data_rows": small["peak"] / GIB,
                        "largest_batch": {
                            d: largest_batch(small, large, g * GIB, data) for d, g in DEVICES_GIB.items()
                        },
                    }
                )
                if check and n == devices[0] and length == lengths[0]:
                    measured = compile_cell(name, n, 4 * data, length)["peak"]
                    slope = large["peak"] - small["peak"]
                    predicted = small["peak"] + 3 * slope
                    error = abs(predicted - measured) / measured
                    checks.append(
                        dict(
                            model=name,
                            devices=n,
                            batch=4 * data,
                            measured=measured,
                            predicted=predicted,
                            relative_error=error,
                        )
                    )
                    print("check", checks[-1])
    return {"cells": cells, "checks": checks}


def report(result: dict) -> list[str]:
    headers = ["model", "devices (data x model)", "length", "GiB per device at one row per data shard"]
    headers += [f"largest batch, {d}" for d in DEVICES_GIB]
    rows = [
        [
            c["model"],
            f"{c['devices']} ({c['mesh'][0]} x {c['mesh'][1]})",
            c["length"],
            round(c["peak_gib_at_data_rows"], 2),
            *[c["largest_batch"][d] or "does not fit" for d in DEVICES_GIB],
        ]
        for c in result["cells"]
    ]
    sections = [markdown_table(headers, rows)]
    if result["checks"]:
        check_rows = [
            [c["model"], c["devices"], c["batch"], round(c["measured"] / GIB, 3), round(c["predicted"] / GIB, 3)]
            + [f"{100 * c['relative_error']:.2f} %"]
            for c in result["checks"]
        ]
        sections += [
            "Extrapolation in the batch checked against a compiled larger batch:",
            markdown_table(["model", "devices", "batch", "measured GiB", "extrapolated GiB", "error"], check_rows),
        ]
    return sections


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-8b,llama-3-70b")
    parser.add_argument("--devices", default="8,64,256")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--no-check", action="store_true", help="skip the extrapolation check")
    parser.add_argument("--out", default=None, help="results directory (default: experiments/results)")
    args = parser.parse_args(argv)
    prov = provenance("llm_memory")
    devices = [int(n) for n in args.devices.split(",")]
    if max(devices) > jax.device_count():
        raise SystemExit(f"needs {max(devices)} devices, has {jax.device_count()} (set XLA_FLAGS before starting)")
    result = run(args.models.split(","), devices, [int(n) for n in args.lengths.split(",")], not args.no_check)
    kwargs = {} if args.out is None else {"directory": args.out}
    path = write_result(
        "llm_memory",
        "Per-device memory of the bf16 analysis forward of Llama-3-shaped models",
        report(result),
        {"result": result, "devices_gib": DEVICES_GIB},
        prov,
        **kwargs,
    )
    print("\n".join(report(result)))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

__all__ = ["compile_cell", "largest_batch"]
