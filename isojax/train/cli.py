"""``isojax finetune``: fine-tune an encoder on a GLUE task, or an encoder-decoder on a sequence-to-sequence task,
with an isotropy method.

    isojax finetune --task stsb --model default --method softdecay --epochs 3 --out runs/stsb-softdecay
    isojax finetune --task rte --model bert-base-cased --method isotropy_layer --devices 8 --parallel pmap
    isojax finetune --task cola --method baseline --reg persistent_entropy=0.1@cls,bars=all --out runs/x
    isojax finetune --task cnn_dailymail --model facebook/bart-large --method flow --train-limit 20000 --out runs/y
    isojax finetune --task seq2seq --data-source my_pairs/ --model my_bart --method cosine --out runs/z

Run again with the same arguments to resume from the latest checkpoint in ``--out``; the same run can be
repeated on 1 or N devices and under the mesh or pmap (``--devices``, ``--parallel``, ``--model-parallel``).
Standalone: ``python -m isojax.train.cli finetune ...``.

Multi-host (one process per host; the mesh spans every process's devices, each process tokenises and feeds only
its rows of each batch, process 0 writes the logs and results, every process writes its shards of the
checkpoints): run the same command on every host with ``--coordinator HOST:PORT --num-processes N --process-id I``
(I = 0 .. N-1; HOST:PORT is process 0's address), or let JAX read them from the environment (Cloud TPU, SLURM,
Open MPI; ``JAX_COORDINATOR_ADDRESS``). On CPU the processes talk through Gloo. For example two processes on one
machine, four CPU devices each::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m isojax.train.cli finetune --task stsb \
        --coordinator localhost:1234 --num-processes 2 --process-id 0 --out runs/x &
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m isojax.train.cli finetune --task stsb \
        --coordinator localhost:1234 --num-processes 2 --process-id 1 --out runs/x
"""

from __future__ import annotations

import argparse
import sys

from isojax.data.datadir import DATA_DIR_HELP
from isojax.data.glue import GLUE_TASKS
from isojax.data.seq2seq import SEQ2SEQ_TASKS
from isojax.models.stack import REMAT_POLICIES
from isojax.train.config import METHOD_ALIASES, METHODS, TrainConfig, parse_regularizer
from isojax.train.model import REPRESENTATIONS
from isojax.train.objective import REGULARIZERS


def _methods_help() -> str:
    lines = [
        f"  {name:<24} {m.description}"
        + "".join(f" [+ {r.name}={r.weight:g}@{r.representation}]" for r in m.regularizers)
        for name, m in METHODS.items()
    ]
    lines += [f"  {alias:<24} = {target}" for alias, target in METHOD_ALIASES.items()]
    regs = [
        f"  {name:<20} {k.description} [default @{k.representation}; options {dict(k.options)}]"
        for name, k in REGULARIZERS.items()
    ]
    reps = [f"  {name:<12} {text}" for name, text in REPRESENTATIONS.items()]
    return (
        "methods:\n"
        + "\n".join(lines)
        + "\n\nregularisers (--reg NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...]):\n"
        + "\n".join(regs)
        + "\n\n"
        + SCHEDULES_HELP
        + "\n\nrepresentations:\n"
        + "\n".join(reps)
    )


SCHEDULES_HELP = """\
weight schedules (a WEIGHT or float option VALUE of --reg, or --joint-alpha; t = batches trained so far in
the run, N > 0 and S >= 0 integers of steps; one compilation serves the whole run; each scheduled value is logged
as LABEL/weight, LABEL/OPTION or joint/alpha in log.jsonl):
  constant:V          V
  linear:A:B:N[:S]    A until step S (default 0), linear to B at step S + N, then B      (optax.linear_schedule)
  warmup:V:N[:S]      linear:0:V:N[:S]
  cosine:A:N[:F]      A (F + (1 - F)(1 + cos(pi min(t, N) / N)) / 2), from A to F A      (optax.cosine_decay_schedule)
  e.g. --reg istar=linear:0:1.0:500@cls      --reg istar=warmup:0.1:200:100@cls,zeta=linear:0.5:0.2:1000"""


def add_finetune_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``finetune`` command to an argparse ``subparsers`` object; returns its parser."""
    d = TrainConfig()
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune on a GLUE task or a sequence-to-sequence task with an isotropy method (SoftDecay, "
        "regularisers, IsoBN, Isotropy Layer, flow); mesh or pmap, checkpoints, resume",
        description=__doc__,
        epilog=_methods_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("task and model")
    g.add_argument(
        "--task",
        default=d.task,
        help=f"GLUE task: {', '.join(GLUE_TASKS)} (default {d.task}); or "
        f"sequence-to-sequence task (an encoder-decoder model): {', '.join(SEQ2SEQ_TASKS)}",
    )
    g.add_argument("--model", default=d.model, help="model directory, Hub id, or 'default' (all-MiniLM-L6-v2)")
    g.add_argument("--method", default=d.method, help=f"isotropy method (default {d.method}; list below)")
    g.add_argument(
        "--reg",
        action="append",
        default=[],
        metavar="SPEC",
        help="extra regulariser NAME[=WEIGHT][@REPRESENTATION][,KEY=VALUE...] (repeatable); WEIGHT and "
        "float VALUEs are numbers or schedules of the step, e.g. istar=linear:0:1:500@cls (list below)",
    )
    g.add_argument(
        "--pooling",
        default=d.pooling,
        help=f"sentence representation fed to the head (default "
        f"{d.pooling}): cls, pooler, mean, first_last_avg, last2avg",
    )
    g.add_argument(
        "--combine",
        default=d.combine,
        choices=("sum", "balanced", "weighted"),
        help="task loss + regularisers: sum, balanced (moving-average balancer), weighted "
        "(alpha L1 + (1-alpha) L2); isotropy_layer's second stage is balanced unless 'weighted'",
    )
    g.add_argument(
        "--joint-alpha",
        default=d.joint_alpha,
        help="alpha of --combine weighted: a number or a schedule of the step (grammar below)",
    )
    g.add_argument(
        "--softdecay-alpha",
        type=float,
        default=d.softdecay_alpha,
        help=f"initial SoftDecay alpha in (-1, 0) (default {d.softdecay_alpha})",
    )
    g.add_argument(
        "--softdecay-placement",
        default=d.softdecay_placement,
        choices=("output", "block"),
        help="SoftDecay on the last layer's output (the paper; default) or inside the last block before "
        "its LayerNorm with the residual added twice (the authors' code)",
    )
    g.add_argument("--data-dir", default=d.data_dir, metavar="DIR", help=DATA_DIR_HELP)
    g.add_argument(
        "--data-source",
        default=d.data_source,
        help="GLUE source: auto (--data-dir, else $ISOJAX_DATA_DIR, else the Hub; STS-B falls back to "
        "the offline package), hub, package, or a local directory/file in the Hub's layout; "
        "sequence-to-sequence: auto (the Hub) or a local directory/file (task seq2seq: columns source, "
        "target)",
    )
    g.add_argument("--train-limit", type=int, default=0, help="use the first N training rows (0 = all)")
    g.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N dev rows (0 = all)")
    g.add_argument("--max-length", type=int, default=d.max_length, help=f"tokens per example (default {d.max_length})")
    q = p.add_argument_group("sequence-to-sequence tasks")
    q.add_argument(
        "--max-target-length",
        type=int,
        default=d.max_target_length,
        help=f"target tokens per example (default {d.max_target_length})",
    )
    q.add_argument(
        "--label-smoothing",
        type=float,
        default=d.label_smoothing,
        help=f"label smoothing of the token cross-entropy (default {d.label_smoothing})",
    )
    q.add_argument("--num-beams", type=int, default=d.num_beams, help="beams of the dev decoding (1 = greedy)")
    q.add_argument("--length-penalty", type=float, default=d.length_penalty, help="beam search length penalty")
    q.add_argument(
        "--generation-max-length",
        type=int,
        default=None,
        help="longest decoded sequence, start token included (default max-target-length + 1)",
    )
    f = p.add_argument_group("flow (method flow)")
    f.add_argument("--flow-levels", type=int, default=d.flow_levels, help=f"Glow levels (default {d.flow_levels})")
    f.add_argument("--flow-depth", type=int, default=d.flow_depth, help=f"steps per level (default {d.flow_depth})")
    f.add_argument(
        "--flow-hidden", type=int, default=d.flow_hidden, help=f"coupling network width (default {d.flow_hidden})"
    )
    f.add_argument(
        "--flow-init-batches",
        type=int,
        default=d.flow_init_batches,
        help="training batches whose pretrained representations start the flow's ActNorm "
        f"(default {d.flow_init_batches})",
    )
    h = p.add_argument_group("optimisation")
    h.add_argument("--batch-size", type=int, default=d.batch_size, help=f"global batch (default {d.batch_size})")
    h.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    h.add_argument("--lr", type=float, default=d.learning_rate, help=f"peak learning rate (default {d.learning_rate})")
    h.add_argument(
        "--transform-lr",
        type=float,
        default=d.transform_learning_rate,
        help="learning rate of SoftDecay alpha, the Isotropy Layer and the flow (constant for the flow) "
        f"(default {d.transform_learning_rate})",
    )
    h.add_argument("--weight-decay", type=float, default=d.weight_decay)
    h.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    h.add_argument("--schedule", default=d.schedule, choices=("linear", "cosine", "constant"))
    h.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm, help="clip (0 = off)")
    h.add_argument("--grad-accumulation", type=int, default=d.grad_accumulation, help="batches per update")
    h.add_argument("--epochs", type=float, default=d.epochs)
    h.add_argument("--steps", type=int, default=None, help="train this many batches instead of --epochs")
    h.add_argument("--stage2-epochs", type=float, default=d.stage2_epochs, help="Isotropy Layer stage length")
    h.add_argument("--stage2-steps", type=int, default=None)
    h.add_argument("--no-dropout", action="store_true", help="turn dropout off")
    h.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"), help="compute dtype")
    h.add_argument(
        "--scan-layers",
        action="store_true",
        help="run the encoder's blocks as one nn.scan loop (compile time flat in depth)",
    )
    h.add_argument(
        "--remat",
        default=d.remat,
        choices=("none", *REMAT_POLICIES),
        help="recompute each block's forward in the backward pass (default none)",
    )
    h.add_argument("--seed", type=int, default=d.seed)
    r = p.add_argument_group("devices, checkpoints, logs")
    r.add_argument("--devices", type=int, default=None, help="use the first N devices (default all)")
    r.add_argument("--parallel", default=d.parallel, choices=("mesh", "pmap"), help="jit on a mesh, or pmap")
    r.add_argument("--model-parallel", type=int, default=d.model_parallel, help="size of the mesh's model axis")
    r.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP: split the parameters and Adam moments over the mesh's data axis (with --parallel mesh)",
    )
    r.add_argument(
        "--distributed",
        default="auto",
        choices=("auto", "on", "off"),
        help="jax.distributed.initialize(): auto = when the options below or the environment describe a "
        "multi-process job",
    )
    r.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="multi-process: address of process 0's coordinator (default: JAX_COORDINATOR_ADDRESS or the "
        "cluster environment)",
    )
    r.add_argument("--num-processes", type=int, default=None, help="multi-process: number of processes")
    r.add_argument("--process-id", type=int, default=None, help="multi-process: this process's index, 0 .. N-1")
    r.add_argument("--out", default=d.output_dir, help=f"output directory (default {d.output_dir})")
    r.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint every N steps (0 = stage ends)")
    r.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    r.add_argument("--eval-every", type=int, default=d.eval_every, help="evaluate every N steps (0 = stage ends)")
    r.add_argument("--log-every", type=int, default=d.log_every)
    r.add_argument(
        "--max-nonfinite-steps",
        type=int,
        default=d.max_nonfinite_steps,
        help="stop after this many steps in a row with a non-finite loss or gradient (each is skipped; "
        f"default {d.max_nonfinite_steps}); rerunning resumes from the last good checkpoint",
    )
    r.add_argument(
        "--log-gradients",
        action="store_true",
        help="log per-layer gradient norms and the word-embedding gradient's alignment with the mean "
        "embedding direction (common enemies) every --log-every steps, with a curve in curves.png",
    )
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_finetune)
    return p


def config_from_args(args) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``finetune`` arguments."""
    return TrainConfig(
        task=args.task,
        model=args.model,
        method=args.method,
        regularizers=tuple(parse_regularizer(s) for s in args.reg),
        pooling=args.pooling,
        combine=args.combine,
        joint_alpha=args.joint_alpha,
        softdecay_alpha=args.softdecay_alpha,
        softdecay_placement=args.softdecay_placement,
        max_length=args.max_length,
        batch_size=args.batch_size,
        eval_batch_size=args.eval_batch_size,
        learning_rate=args.lr,
        transform_learning_rate=args.transform_lr,
        weight_decay=args.weight_decay,
        warmup_ratio=args.warmup_ratio,
        schedule=args.schedule,
        max_grad_norm=args.max_grad_norm,
        grad_accumulation=args.grad_accumulation,
        epochs=args.epochs,
        steps=args.steps,
        stage2_epochs=args.stage2_epochs,
        stage2_steps=args.stage2_steps,
        dropout=not args.no_dropout,
        dtype=args.dtype,
        scan_layers=args.scan_layers,
        remat=args.remat,
        seed=args.seed,
        devices=args.devices,
        parallel=args.parallel,
        model_parallel=args.model_parallel,
        fsdp=args.fsdp,
        output_dir=args.out,
        save_every=args.save_every,
        keep_checkpoints=args.keep_checkpoints,
        eval_every=args.eval_every,
        log_every=args.log_every,
        log_gradients=args.log_gradients,
        max_nonfinite_steps=args.max_nonfinite_steps,
        train_limit=args.train_limit,
        eval_limit=args.eval_limit,
        data_source=args.data_source,
        data_dir=args.data_dir,
        progress=not args.quiet,
        max_target_length=args.max_target_length,
        label_smoothing=args.label_smoothing,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        generation_max_length=args.generation_max_length,
        flow_levels=args.flow_levels,
        flow_depth=args.flow_depth,
        flow_hidden=args.flow_hidden,
        flow_init_batches=args.flow_init_batches,
    )


def cmd_finetune(args) -> int:
    """Run ``isojax finetune``: print the final evaluation of every stage (also in ``<out>/results.json``)."""
    from isojax.train.loop import fit
    from isojax.train.parallel import initialize_distributed

    try:
        initialize_distributed(
            args.distributed,
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )  # before any JAX work
        config = config_from_args(args)  # bad settings fail here, before the model or data are loaded
    except (TypeError, ValueError) as e:
        print(f"isojax finetune: error: {e}", file=sys.stderr)
        return 2
    result = fit(config)
    for stage, metrics in result.stages.items():
        print(f"{stage}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    print(f"step {result.step}; outputs in {result.output_dir} (results.json, log.jsonl, curves.png, checkpoints/)")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line with the ``finetune`` command alone (``isojax.cli`` adds it beside its others)."""
    p = argparse.ArgumentParser(prog="python -m isojax.train.cli")
    add_finetune_parser(p.add_subparsers(dest="command", required=True))
    return p


def config_from_argv(argv: list[str]) -> TrainConfig:
    """The :class:`TrainConfig` of a ``finetune`` command line (``["finetune", "--task", "rte", ...]``)."""
    return config_from_args(parser().parse_args(argv))


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
