r"""``isojax finetune``: fine-tune an encoder on a GLUE task, or an encoder-decoder on a sequence-to-sequence task,
with an isotropy method.

    isojax finetune --task stsb --model default --method softdecay --epochs 3 --out runs/stsb-softdecay
    isojax finetune --task rte --model bert-base-cased --method isotropy_layer --devices 8 --parallel pmap
    isojax finetune --task cola --method baseline --reg persistent_entropy=0.1@cls,bars=all --out runs/x
    isojax finetune --task cnn_dailymail --model facebook/bart-large --method flow --train-limit 20000 --out runs/y
    isojax finetune --task seq2seq --data-source my_pairs/ --model my_bart --method cosine --out runs/z

Run again with the same arguments to resume from the latest checkpoint in ``--out``; the same run can be
repeated on 1 or N devices and under the mesh or pmap (``--devices``, ``--parallel``, ``--model-parallel``).

Multi-host (one process per host; the mesh spans every process's devices, each process tokenises and feeds only
its rows of each batch, process 0 writes the logs and results, every process writes its shards of the
checkpoints): run the same command on every host with ``--coordinator HOST:PORT --num-processes N --process-id I``
(I = 0 .. N-1; HOST:PORT is process 0's address), or let JAX read them from the environment (Cloud TPU, SLURM,
Open MPI; ``JAX_COORDINATOR_ADDRESS``). ``--coordinator-timeout`` (default 300 s) bounds the wait for the
coordinator and the other processes. On CPU the processes talk through Gloo. For example two processes on one
machine, four CPU devices each::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m isojax.cli finetune --task stsb \
        --coordinator localhost:1234 --num-processes 2 --process-id 0 --out runs/x &
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m isojax.cli finetune --task stsb \
        --coordinator localhost:1234 --num-processes 2 --process-id 1 --out runs/x
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from isojax.argtypes import host_port, int_at_least
from isojax.train.config import SETTINGS, Setting, TrainConfig
from isojax.train.methods import METHOD_ALIASES, METHODS, REGULARIZERS, REPRESENTATIONS
from isojax.train.objective import Regularizer


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
    """Add the ``finetune`` command to an argparse ``subparsers`` object; returns its parser. Its options are
    derived from :data:`~isojax.train.config.SETTINGS` (flag, help, choices and default of each field), one group
    per section, beside ``--config`` and the multi-process options."""
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune on a GLUE task or a sequence-to-sequence task with an isotropy method (SoftDecay, "
        "regularisers, IsoBN, Isotropy Layer, flow); mesh or pmap, checkpoints, resume",
        description=__doc__,
        epilog=_methods_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help="a JSON configuration (TrainConfig.to_json()); the options below override it",
    )
    groups: dict[str, Any] = {}
    for s in SETTINGS:
        section = s.path.rpartition(".")[0] or "run"
        if section not in groups:
            doc = (s.section.__doc__ or "").split(":")[0].split("\n")[0].rstrip(".") if section != "run" else "the run"
            groups[section] = p.add_argument_group(f"{section} ({doc})")
        _add_setting(groups[section], s)
    r = p.add_argument_group("multi-process")
    r.add_argument(
        "--distributed",
        default="auto",
        choices=("auto", "on", "off"),
        help="jax.distributed.initialize(): auto = when the options below or the environment describe a "
        "multi-process job",
    )
    r.add_argument(
        "--coordinator",
        type=host_port,
        default=None,
        metavar="HOST:PORT",
        help="multi-process: address of process 0's coordinator (default: JAX_COORDINATOR_ADDRESS or the "
        "cluster environment)",
    )
    r.add_argument("--num-processes", type=int_at_least(1), default=None, help="multi-process: number of processes")
    r.add_argument(
        "--process-id", type=int_at_least(0), default=None, help="multi-process: this process's index, 0 .. N-1"
    )
    r.add_argument(
        "--coordinator-timeout",
        type=int_at_least(1),
        default=300,
        metavar="SECONDS",
        help="multi-process: how long to wait for the coordinator and every process to connect (default 300); a "
        "process other than 0 that reaches no coordinator in time stops with an error naming the address",
    )
    p.set_defaults(func=cmd_finetune)
    return p


def _add_setting(group, s: Setting) -> None:
    """The option of a setting: a switch for a bool (setting the opposite of its default), ``--reg`` repeatable,
    else a value kept as text (:meth:`~isojax.train.config.Setting.parse` converts it, naming the setting when it
    cannot). Given options are stored under their dotted paths; the others are left out."""
    field = s.field
    default = field.default_factory() if callable(field.default_factory) else field.default
    text = ",".join(map(str, default)) if isinstance(default, tuple) else default
    shown = "" if default in (None, (), True, False) else f" (default {text})"
    kwargs: dict[str, Any] = {"dest": s.path, "default": argparse.SUPPRESS, "help": f"{field.metadata['help']}{shown}"}
    if s.kind is bool:
        group.add_argument(s.flag, action="store_const", const=not default, **kwargs)
        return
    if field.metadata["choices"]:
        kwargs["choices"] = field.metadata["choices"]
    if "metavar" in field.metadata:
        kwargs["metavar"] = field.metadata["metavar"]
    group.add_argument(s.flag, action="append" if s.path == "method.regularizers" else "store", **kwargs)


def config_from_args(args) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``finetune`` arguments: ``--config``'s file (else the defaults) with the
    options given as dotted overrides."""
    base = {}
    if args.config:
        try:
            with open(args.config) as f:
                base = json.load(f)
        except OSError as e:
            raise ValueError(f"--config {args.config}: cannot be read ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--config {args.config}: not JSON ({e})") from None
        if not isinstance(base, dict):
            raise ValueError(f"--config {args.config}: expected a JSON object of settings, got {type(base).__name__}")
    config = TrainConfig.from_json(base, {s.path: vars(args)[s.path] for s in SETTINGS if s.path in vars(args)})
    for stage in config.stages():
        for spec in stage.regularizers:
            Regularizer.of(spec)  # an option value the regulariser refuses fails here, before the model loads
    return config


def cmd_finetune(args) -> int:
    """Run ``isojax finetune``: print the final evaluation of every stage (also in ``<out>/results.json``)."""
    from isojax.train.loop import fit
    from isojax.train.parallel import initialize_distributed

    # bad settings fail here, before a multi-process job waits for its other processes or loads the model or data
    config = config_from_args(args)
    initialize_distributed(
        args.distributed,
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=args.coordinator_timeout,
    )  # before any JAX computation (reading the configuration does none)
    result = fit(config)
    for stage, metrics in result.stages.items():
        print(f"{stage}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    print(f"step {result.step}; outputs in {result.output_dir} (results.json, log.jsonl, curves.png, checkpoints/)")
    return 0
