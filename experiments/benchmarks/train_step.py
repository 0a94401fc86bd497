"""isojax training steps per second vs a plain PyTorch loop on the same model, batch and sequence length.

    python -m experiments.benchmarks.train_step [--layers 6 --hidden 384 --heads 12 --batch 32 --length 128]
                                                [--repeats 5] [--rounds 2] [--quick]

One step = forward, cross-entropy on a 2-class head over [CLS], backward, global-norm clipping and an AdamW
update, dropout on. isojax: :func:`isojax.train.make_train_step` under ``jit`` (state donated); PyTorch:
``transformers.BertModel`` + ``nn.Linear`` head with ``torch.optim.AdamW`` in eager mode, the same weights
(PyTorch's init, converted) and the same threads. Each side runs in a process of its own (in one process the thread
pool of one side holds the cores while the other runs), ``--rounds`` times alternately, and times the median step
after warm-up. Defaults are the bundled model's shape (all-MiniLM-L6-v2: 6 layers, 384 wide). Prints each round's
median ms per step, steps/s and the ratio of the best rounds isojax / PyTorch (goal on CPU: <= 1.0).
On a GPU it also times a BERT-base bf16 step and prints its model FLOPs utilisation (3 x forward matmul FLOPs
per step / time / ``--peak-tflops``; goal above 40%).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.common import (
    add_model_arguments,
    add_side_arguments,
    bert_config,
    compare_sides,
    cpu_count,
    median_ms,
    side_report,
)
from experiments.benchmarks.encoder_forward import forward_flops
from isojax.models import TransformerConfig, build_encoder, config_to_hf
from isojax.models.bert import BERT_HF_NAMES
from isojax.models.checkpoint import params_from_state_dict
from isojax.train.model import TaskModel, init_variables
from isojax.train.objective import Objective
from isojax.train.optim import make_optimizer
from isojax.train.state import TrainState, create_state
from isojax.train.step import make_train_step

LR, WD, CLIP = 2e-5, 0.01, 1.0


def isojax_step(
    cfg: TransformerConfig, encoder_params, dtype=jnp.float32, last_layer_transform=None, **encoder_options
) -> tuple[jax.stages.Wrapped, TrainState]:
    """``(jitted step, state)`` for a 2-class head on [CLS] with AdamW, clipping, dropout; ``encoder_params`` are
    those of ``build_encoder(cfg, last_layer_transform=last_layer_transform, **encoder_options)`` (e.g. a
    ``SoftDecay``; ``scan_layers=True``: params in the scanned layout)."""
    model = TaskModel(
        build_encoder(cfg, dtype=dtype, last_layer_transform=last_layer_transform, **encoder_options),
        num_labels=2,
        pooling="cls",
        dropout_rate=0.1,
    )
    variables = init_variables(model, encoder_params, jax.random.key(0))
    optimizer = make_optimizer(
        variables["params"],
        learning_rate=LR,
        transform_learning_rate=LR,
        weight_decay=WD,
        total_updates=10_000,
        schedule_kind="constant",
        max_grad_norm=CLIP,
    )
    step = jax.jit(make_train_step(model, Objective(2), optimizer), donate_argnums=0)
    return step, create_state(variables, optimizer, seed=0)


def step_runner(step, state, batch: dict) -> Callable[[], jax.Array]:
    """``run()``: one call of ``step`` (which donates its state) on ``batch``, returning the loss; the new state is
    kept for the next call."""
    holder = [state]

    def run():
        holder[0], metrics = step(holder[0], batch)
        return metrics["loss"]

    return run


def run_side(args) -> dict:
    """One side in this process: the median ms of ``--repeats`` steps after warm-up (and, on a GPU, the isojax
    side's BERT-base bf16 step)."""
    import torch
    import transformers

    torch.set_num_threads(cpu_count() if args.side == "pytorch" else 1)  # the isojax side leaves the cores to XLA
    cfg = bert_config(args)
    torch.manual_seed(0)
    encoder = transformers.BertModel(transformers.BertConfig(**config_to_hf(cfg)))
    head = torch.nn.Linear(args.hidden, 2)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (args.batch, args.length)).astype(np.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "labels": rng.integers(0, 2, args.batch).astype(np.int32),
    }
    if args.side == "isojax":
        dummy = jnp.zeros((1, 2), jnp.int32)
        template = jax.eval_shape(lambda: build_encoder(cfg).init(jax.random.key(0), dummy)["params"])
        state = {k: v.numpy() for k, v in encoder.state_dict().items()}
        params = params_from_state_dict(state, BERT_HF_NAMES, template)
        run = step_runner(*isojax_step(cfg, jax.device_put(params)), jax.device_put(batch))
        out = {"ms": median_ms(run, repeats=args.repeats)}
        if jax.devices()[0].platform == "gpu":
            base = TransformerConfig.bert_base()
            base_params = build_encoder(base).init(jax.random.key(0), dummy)["params"]
            ids16 = rng.integers(0, base.vocab_size, (args.batch, args.length)).astype(np.int32)
            bf16_step = step_runner(
                *isojax_step(base, base_params, dtype=jnp.bfloat16), jax.device_put(dict(batch, input_ids=ids16))
            )
            out["bf16_ms"] = median_ms(bf16_step, repeats=max(args.repeats, 10))
        return out

    encoder.train()
    modules = torch.nn.ModuleList([encoder, head])
    no_decay = [p for n, p in modules.named_parameters() if p.ndim < 2]
    decay = [p for n, p in modules.named_parameters() if p.ndim >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.ones(ids.shape, dtype=torch.long)
    t_labels = torch.tensor(batch["labels"], dtype=torch.long)
    dropout = torch.nn.Dropout(0.1)

    def torch_step():
        opt.zero_grad(set_to_none=True)
        cls = encoder(input_ids=t_ids, attention_mask=t_mask).last_hidden_state[:, 0]
        loss = torch.nn.functional.cross_entropy(head(dropout(cls)), t_labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(modules.parameters(), CLIP)
        opt.step()
        return loss.detach()

    return {"ms": median_ms(torch_step, repeats=args.repeats)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap, repeats=5)
    add_side_arguments(ap)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100 SXM: 989)")
    ap.add_argument("--quick", action="store_true", help="2 layers, 128 wide, batch 4 x 32, 3 repeats, 1 round")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.heads, args.batch, args.length, args.repeats = 2, 128, 4, 4, 32, 3
        args.rounds = 1
    if args.side:
        side_report(run_side, args)
        return
    options = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads)]
    options += ["--batch", str(args.batch), "--length", str(args.length), "--repeats", str(args.repeats)]
    results, best = compare_sides(
        "experiments.benchmarks.train_step",
        options,
        args.rounds,
        "train step float32, best round",
        lambda results: (
            f"BERT {args.layers} layers x {args.hidden} wide, {args.heads} heads; train step on batch "
            f"{args.batch} x {args.length} (fwd + bwd + clip + AdamW), float32"
        ),
    )
    print(f"steps/s: isojax {1e3 / best['isojax']:.2f}, pytorch {1e3 / best['pytorch']:.2f}")
    bf16_ms = results["isojax"][0].get("bf16_ms")
    if bf16_ms is not None:
        base = TransformerConfig.bert_base()
        tflops = 3 * forward_flops(base, args.batch, args.length) / (bf16_ms * 1e-3) / 1e12
        print(
            f"BERT-base bf16 train step, batch {args.batch} x {args.length}: {bf16_ms:.2f} ms, "
            f"{args.batch * args.length / (bf16_ms * 1e-3):,.0f} tokens/s, {tflops:.1f} TFLOP/s = MFU "
            f"{tflops / args.peak_tflops:.1%} of {args.peak_tflops} peak"
        )


if __name__ == "__main__":
    main()
