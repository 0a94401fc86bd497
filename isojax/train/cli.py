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
import contextlib
import dataclasses
import io
import json
import re
from typing import Annotated, Literal

import tyro
from tyro.conf import arg

from isojax.argtypes import host_port
from isojax.train.config import TrainConfig
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


@dataclasses.dataclass(frozen=True)
class MultiProcess:
    """One process per host (module docstring)."""

    distributed: Literal["auto", "on", "off"] = "auto"
    """jax.distributed.initialize(): auto = when the options below or the environment describe a multi-process
    job"""
    coordinator: Annotated[str | None, arg(metavar="HOST:PORT")] = None
    """address of process 0's coordinator (default: JAX_COORDINATOR_ADDRESS or the cluster environment)"""
    num_processes: int | None = None
    """number of processes"""
    process_id: int | None = None
    """this process's index, 0 .. N-1"""
    coordinator_timeout: Annotated[int, arg(metavar="SECONDS")] = 300
    """how long to wait for the coordinator and every process to connect; a process other than 0 that reaches no
    coordinator in time stops with an error naming the address"""

    def __post_init__(self):
        if self.coordinator is not None:
            try:
                host_port(self.coordinator)
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"--coordinator: {e}") from None
        for name, low in (("num_processes", 1), ("process_id", 0), ("coordinator_timeout", 1)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"--{name.replace('_', '-')}: expected an integer >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Finetune:
    """``isojax finetune``'s arguments: the run's configuration and how its processes meet."""

    config: Annotated[str | None, arg(metavar="PATH")] = None
    """a JSON configuration (TrainConfig.to_json(), as results.json's "config" holds it); the options below
    override it"""
    run: Annotated[TrainConfig, arg(name="")] = TrainConfig()
    multi_process: Annotated[MultiProcess, arg(name="")] = MultiProcess()


RENAMED = {"--quiet": "--no-progress"}
"""Flags of earlier versions and their spelling now."""


def parse_finetune(argv: list[str]) -> Finetune:
    """The arguments of ``isojax finetune ARGV``: ``--config``'s file (else the defaults) with the options on top,
    parsed by tyro. ``--help`` prints and exits; a bad option or value is a ``ValueError`` with tyro's message on
    one line, naming the option."""
    base = TrainConfig()
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if name in RENAMED:
            raise ValueError(f"{name} is now spelled {RENAMED[name]}")
        if name in ("--buckets", "--task.buckets") and "," in value:
            raise ValueError(f"{name} takes widths separated by spaces now: {name} 32 64 128")
        if name == "--config" and value:
            base = read_config(value)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(
                Finetune,
                args=argv,
                default=Finetune(run=base),
                prog="isojax finetune",
                description=f"{__doc__}\n{_methods_help()}",
            )
    except SystemExit as e:
        if e.code:
            raise ValueError(_one_line(err.getvalue())) from None
        raise


def read_config(path: str) -> TrainConfig:
    """The :class:`TrainConfig` of a JSON file; ``ValueError`` naming the file when it cannot be read as one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: cannot be read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--config {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a JSON object of settings, got {type(data).__name__}")
    try:
        return TrainConfig.from_json(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--config {path}: {e}") from None


def _one_line(text: str) -> str:
    """tyro's boxed error (its first line the box's title) as one line."""
    lines = [line.strip().strip("\u2502|").strip() for line in text.strip().splitlines()[1:]]
    words = " ".join(line for line in lines if not re.fullmatch(r"[\u2500-\u257f+-]*", line)).split()
    return " ".join(words).split(" Argument helptext:")[0].split(" For full helptext")[0]


def cmd_finetune(argv: list[str]) -> int:
    """Run ``isojax finetune``: print the final evaluation of every stage (also in ``<out>/results.json``)."""
    import jax

    from isojax.export import export_run
    from isojax.train.loop import fit
    from isojax.train.parallel import initialize_distributed

    # bad settings fail here, before a multi-process job waits for its other processes or loads the model or data
    args = parse_finetune(argv)
    check_terms(args.run)
    multi = args.multi_process
    initialize_distributed(
        multi.distributed,
        coordinator_address=multi.coordinator,
        num_processes=multi.num_processes,
        process_id=multi.process_id,
        initialization_timeout=multi.coordinator_timeout,
    )  # before any JAX computation (reading the configuration does none)
    result = fit(args.run)
    for stage, metrics in result.stages.items():
        print(f"{stage}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    print(f"step {result.step}; outputs in {result.output_dir} (results.json, log.jsonl, curves.png, checkpoints/)")
    if args.run.logging.export and jax.process_index() == 0:
        export_run(result.output_dir, args.run.logging.export)
        print(f"exported to {args.run.logging.export} (isojax export)")
    return 0


def check_terms(config: TrainConfig) -> None:
    """Build every regulariser of the run once, so that an option value the regulariser refuses fails before the
    model and data load."""
    for stage in config.stages():
        for spec in stage.regularizers:
            Regularizer.of(spec)


def config_from_argv(argv: list[str]) -> TrainConfig:
    """The :class:`TrainConfig` of an ``isojax finetune`` command line (``["finetune", "--task", ...]``).

    Args:
      argv: the command line after ``isojax``.

    Returns:
      The configuration; ``ValueError`` naming a bad option or value.

    Examples:
      >>> config_from_argv(["finetune", "--task", "rte", "--lr", "3e-5", "--optim.steps", "10"]).optim
      OptimConfig(learning_rate=3e-05, ...)
    """
    config = parse_finetune(list(argv[1:])).run
    check_terms(config)
    return config
