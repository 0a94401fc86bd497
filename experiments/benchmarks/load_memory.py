"""Peak host memory of loading a checkpoint onto 8 devices: tensor by tensor vs reading the whole state dict first.

    python -m experiments.benchmarks.load_memory [--layers 12 --hidden 768 --vocab 30522] [--placement fsdp+tensor]
    python -m experiments.benchmarks.load_memory --gguf smollm2-135m-instruct

Writes a random-weight BERT (BERT-base's shape by default: 110 M parameters, 438 MB of float32 safetensors) into a
temporary directory, then loads it in a fresh Python process per path, each with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` and a ``(data 4, model 2)`` mesh of Auto axes:

- ``tensor-by-tensor``: ``isojax.from_pretrained(path, mesh=mesh, placement=...)``: each tensor is read, laid out
  and put onto its devices before the next one is read;
- ``read-all``: the path before: ``checkpoint.read_state_dict`` (every array in memory), ``params_from_state_dict``,
  then ``jax.device_put`` of the whole params tree onto the same shardings.

In each child, after importing and building the mesh (the baseline), ``/proc/self/clear_refs`` resets the peak
resident set (VmHWM) to the current one; after loading, the peak VmHWM is read. On the CPU backend the 8 devices'
buffers are host memory too, so the figure of merit is the *overhead*: peak - baseline - the bytes of the placed
arrays (every device's shards summed), against the goal <= 2 x the largest tensor. A sampler thread (every 2 ms) also
records the peak anonymous resident memory (RssAnon), which excludes file pages the kernel can drop.

With ``--gguf FILE`` (or an offline model name) the same two paths read a GGUF file's Hugging Face-named float32
tensors (:class:`isojax.models.gguf.GGUFCheckpoint`) and put each onto the data axis of the same mesh as FSDP splits
it (:func:`isojax.models.partitioning.fsdp_spec`), without a model module: ``tensors()`` one at a time, or
``dict(tensors())`` first and one ``jax.device_put``. The GGUF file itself is memory-mapped, so its pages that were
read count in VmHWM (not in RssAnon).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

MB = 1 << 20
MODULE = "experiments.benchmarks.load_memory"


def _status() -> dict[str, int]:
    """``/proc/self/status`` memory fields in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _child(path: str, mode: str, placement: str) -> dict:
    import jax

    from isojax.models import checkpoint
    from isojax.models.hub import from_pretrained, param_shardings, read_config
    from isojax.models.registry import architecture, build_encoder, init_params
    from isojax.train.parallel import make_mesh

    mesh = make_mesh(8, model_parallel=2)
    jax.block_until_ready(jax.device_put(0.0))  # start the runtime before the baseline
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _status()
    peak_anon = [base["RssAnon"]]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak_anon[0] = max(peak_anon[0], _status()["RssAnon"])
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    if mode.startswith("gguf"):
        params = _gguf_load(path, mode, mesh)
    elif mode == "tensor-by-tensor":
        _, params, _ = from_pretrained(path, mesh=mesh, placement=placement, with_tokenizer=False)
    else:
        config = read_config(path)
        module = build_encoder(config)
        template = jax.eval_shape(lambda: init_params(module, jax.random.key(0)))
        state = checkpoint.read_state_dict(path)
        names = architecture(config.model_type).hf_names
        host = checkpoint.params_from_state_dict(state, names, template)
        params = jax.device_put(host, param_shardings(template, config, mesh, placement))
        del state, host
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    end = _status()
    leaves = jax.tree.leaves(params)
    placed = sum(s.data.nbytes for leaf in leaves for s in leaf.addressable_shards)
    largest = max(leaf.nbytes for leaf in leaves)
    return {
        "mode": mode,
        "baseline": base["VmRSS"],
        "peak": end["VmHWM"],
        "peak_anon": max(peak_anon[0], end["RssAnon"]),
        "baseline_anon": base["RssAnon"],
        "placed": placed,
        "largest": largest,
        "params_bytes": sum(leaf.nbytes for leaf in leaves),
        "seconds": seconds,
    }


def _gguf_load(path: str, mode: str, mesh) -> dict:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from isojax.models.gguf import GGUFCheckpoint
    from isojax.models.partitioning import fsdp_spec

    checkpoint = GGUFCheckpoint(path)

    def sharding(key: str, shape) -> NamedSharding:
        return NamedSharding(mesh, fsdp_spec(key, shape, P(), mesh.shape["data"]))

    if mode == "gguf-tensor-by-tensor":
        return {
            key: jax.make_array_from_callback(value.shape, sharding(key, value.shape), value.__getitem__)
            for key, value in checkpoint.tensors()
        }
    host = dict(checkpoint.tensors())
    return jax.device_put(host, {key: sharding(key, np.shape(value)) for key, value in host.items()})


def _write_model(directory: str, layers: int, hidden: int, vocab: int) -> None:
    import jax

    from isojax.models import TransformerConfig, build_encoder, init_params
    from isojax.models.hub import save_pretrained

    config = TransformerConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    module = build_encoder(config)
    save_pretrained(module, init_params(module, jax.random.key(0)), directory)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--placement", default="fsdp+tensor", choices=("replicated", "fsdp", "tensor", "fsdp+tensor"))
    ap.add_argument("--gguf", help="a .gguf file or offline model name: measure reading its tensors instead")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args.placement)))
        return
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    if args.gguf:
        from isojax.models.hub import resolve

        path = resolve(args.gguf)
        rows = [_run_child(path, mode, args.placement, env) for mode in ("gguf-tensor-by-tensor", "gguf-read-all")]
        print(
            f"GGUF {os.path.basename(path)} ({os.path.getsize(path) / MB:.1f} MB), as float32: "
            f"{rows[0]['params_bytes'] / MB:.1f} MB, largest tensor {rows[0]['largest'] / MB:.1f} MB; 8 CPU devices, "
            f"mesh data 4 x model 2, FSDP over data; placed bytes (all devices) {rows[0]['placed'] / MB:.1f} MB"
        )
        _table(rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        # written in a child too, so that this process holds no JAX arrays
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from {MODULE} import _write_model; _write_model({tmp!r}, {args.layers}, {args.hidden}, {args.vocab})",
            ],
            check=True,
            env=env,
        )
        size = os.path.getsize(os.path.join(tmp, "model.safetensors"))
        rows = [_run_child(tmp, mode, args.placement, env) for mode in ("tensor-by-tensor", "read-all")]
    first = rows[0]
    print(
        f"model: {args.layers} layers x {args.hidden}, vocab {args.vocab}: model.safetensors {size / MB:.1f} MB, "
        f"largest tensor {first['largest'] / MB:.1f} MB; 8 CPU devices, mesh data 4 x model 2, "
        f"placement {args.placement}; placed bytes (all devices) {first['placed'] / MB:.1f} MB"
    )
    _table(rows)


def _run_child(path: str, mode: str, placement: str, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", MODULE, "--placement", placement, "--child", path, mode],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(rows: list[dict]) -> None:
    print(
        f"{'path':<22} {'baseline MB':>11} {'peak MB':>9} {'peak-base MB':>12} {'overhead MB':>11} "
        f"{'overhead/largest':>16} {'anon overhead MB':>16} {'seconds':>8}"
    )
    for row in rows:
        overhead = row["peak"] - row["baseline"] - row["placed"]
        anon = row["peak_anon"] - row["baseline_anon"] - row["placed"]
        print(
            f"{row['mode']:<22} {row['baseline'] / MB:>11.1f} {row['peak'] / MB:>9.1f} "
            f"{(row['peak'] - row['baseline']) / MB:>12.1f} {overhead / MB:>11.1f} {overhead / row['largest']:>16.2f} "
            f"{anon / MB:>16.1f} {row['seconds']:>8.2f}"
        )
    print("goal: overhead <= 2 x largest tensor")


if __name__ == "__main__":
    main()
