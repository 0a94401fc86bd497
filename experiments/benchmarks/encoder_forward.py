"""isojax (jit) vs transformers' PyTorch forward of a random-weight BERT-base, each in a process of its own.

    python -m experiments.benchmarks.encoder_forward [--batch 32 --length 128 --repeats 10 --rounds 2] [--quick]

Both sides use the same weights (PyTorch's random init, converted) and the same threads (``torch.set_num_threads``
= the CPU count, which XLA's CPU client also uses). Each side runs in a process of its own (in one process the
thread pool of one side holds the cores while the other runs), ``--rounds`` times alternately; prints each round's
median milliseconds after warm-up and the ratio of the best rounds isojax / PyTorch (goal on CPU: <= 1.0). On a
GPU it also prints tokens/s and achieved TFLOP/s of a bf16 forward as a fraction of ``--peak-tflops`` (the card's dense bf16 peak).
"""

from __future__ import annotations

import argparse
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.common import add_side_arguments, compare_sides, cpu_count, median_ms, side_report
from isojax.argtypes import int_at_least
from isojax.models import EncoderOutput, TransformerConfig, build_encoder, config_to_hf
from isojax.models.bert import BERT_HF_NAMES
from isojax.models.checkpoint import params_from_state_dict


def forward_flops(cfg: TransformerConfig, batch: int, length: int) -> float:
    """Matmul FLOPs of one forward: 2 * tokens * (4H^2 + 2 H I) per layer plus 2 * 2 * B * L^2 * H attention."""
    h, i, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    tokens = batch * length
    return n * (2 * tokens * (4 * h * h + 2 * h * i) + 4 * batch * length * length * h)


def run_side(args) -> dict:
    """One side in this process: the median ms of ``--repeats`` forwards after warm-up; the isojax side also gives
    max |isojax - torch| on the batch (PyTorch run once, on one thread) and, on a GPU, the bf16 figures."""
    import torch
    import transformers

    torch.set_num_threads(cpu_count() if args.side == "pytorch" else 1)  # the isojax side leaves the cores to XLA
    cfg = TransformerConfig.bert_base(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    ref = transformers.BertModel(transformers.BertConfig(**config_to_hf(cfg))).eval()
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.length)).astype(np.int32)
    mask = np.ones_like(ids, dtype=bool)
    t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def torch_forward():
        with torch.inference_mode():
            return ref(input_ids=t_ids, attention_mask=t_mask).last_hidden_state

    if args.side == "pytorch":
        return {"ms": median_ms(torch_forward, repeats=args.repeats)}
    module = build_encoder(cfg)
    template = jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    params = jax.device_put(params_from_state_dict(state, BERT_HF_NAMES, template))
    fwd = jax.jit(lambda p, i, m: cast(EncoderOutput, module.apply({"params": p}, i, m)).last_hidden_state)
    ids_j, mask_j = jax.device_put(ids), jax.device_put(mask)
    out = {"err": float(np.abs(np.asarray(fwd(params, ids_j, mask_j)) - torch_forward().numpy()).max())}
    out["ms"] = median_ms(lambda: fwd(params, ids_j, mask_j), repeats=args.repeats)
    if jax.devices()[0].platform == "gpu":
        bf16 = build_encoder(cfg, dtype=jnp.bfloat16)
        fwd16 = jax.jit(lambda p, i, m: cast(EncoderOutput, bf16.apply({"params": p}, i, m)).last_hidden_state)
        out["bf16_ms"] = median_ms(lambda: fwd16(params, ids_j, mask_j), repeats=args.repeats)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int_at_least(1), default=32)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=10)
    ap.add_argument("--layers", type=int_at_least(1), default=12)
    add_side_arguments(ap)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100 SXM: 989)")
    ap.add_argument("--quick", action="store_true", help="2 layers, batch 4 x 32, 3 repeats, 1 round")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.repeats, args.layers, args.rounds = 4, 32, 3, 2, 1
    if args.side:
        side_report(run_side, args)
        return
    options = ["--batch", str(args.batch), "--length", str(args.length), "--repeats", str(args.repeats)]
    results, _ = compare_sides(
        "experiments.benchmarks.encoder_forward",
        [*options, "--layers", str(args.layers)],
        args.rounds,
        "forward float32, best round",
        lambda results: (
            f"BERT-base ({args.layers} layers) forward, batch {args.batch} x {args.length}; "
            f"max |isojax - torch| = {results['isojax'][0]['err']:.2e}"
        ),
    )
    bf16_ms = results["isojax"][0].get("bf16_ms")
    if bf16_ms is not None:
        cfg = TransformerConfig.bert_base(num_hidden_layers=args.layers)
        tflops = forward_flops(cfg, args.batch, args.length) / (bf16_ms * 1e-3) / 1e12
        print(
            f"bf16 forward: {bf16_ms:.2f} ms, {args.batch * args.length / (bf16_ms * 1e-3):,.0f} tokens/s, "
            f"{tflops:.1f} TFLOP/s = {tflops / args.peak_tflops:.1%} of {args.peak_tflops} peak"
        )


if __name__ == "__main__":
    main()
