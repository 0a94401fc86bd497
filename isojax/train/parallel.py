"""Running the pure step on devices: one runner, :class:`MeshRunner`, ``jit`` over a ``(data, model)`` mesh.

Replicated, model-parallel, FSDP, multi-host and the pmap placement are placements of the same step on the mesh:
shardings of its inputs (batch rows over ``data``, parameters and optimiser moments by the model's partition rules,
:func:`state_shardings`), two sharding constraints in it (FSDP, :func:`gathered_shardings`), or ``jax.shard_map``
over ``data`` around it (pmap). The mesh has *Auto* axes, so XLA's propagation partitions what the model code does
not annotate. The state is held as global arrays whatever the placement, so a checkpoint moves between placements.
A parameter that no partition rule names is an error; a rule whose split does not divide falls back to replicated
with a warning. Multi-host: :func:`initialize_distributed` starts JAX's runtime before any computation; each process
feeds its own rows of every global batch (:meth:`MeshRunner.process_rows`). The design, what the compiled FSDP step
communicates and the costs of each placement: ``docs/design/training.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import time
import zlib
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from isojax._validate import check_positive_int
from isojax.models.partitioning import FSDP_AXIS, fsdp_spec
from isojax.train.config import Parallel, PlacementConfig

log = logging.getLogger(__name__)


_TASK_COUNT_ENV = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


FSDP_FIELDS = ("params", "opt_state")
"""The fields of the train state that FSDP splits over the data axis, the parameters and the optimiser state (Adam's
moments, accumulated gradients; its scalar counts stay replicated, having no dimension to split)."""


def initialize_distributed(
    mode: str = "auto",
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    initialization_timeout: int = 300,
) -> bool:
    """Start JAX's multi-process runtime (``jax.distributed.initialize``) when a multi-process job is described.

    Must run before any JAX computation.

    Args:
      mode: ``"on"``: always; ``"auto"``: when a multi-process job is described (``coordinator_address`` or
        ``num_processes`` given, ``JAX_COORDINATOR_ADDRESS`` set, or a SLURM / Open MPI job of more than one task:
        ``SLURM_NTASKS`` / ``OMPI_COMM_WORLD_SIZE`` > 1); ``"off"``: never.
      coordinator_address: ``host:port`` of process 0; ``None``: JAX reads ``JAX_COORDINATOR_ADDRESS`` and the
        cluster environment (SLURM, Open MPI, Cloud TPU).
      num_processes: the number of processes (given together with ``process_id``), or ``None`` as above.
      process_id: this process's index in ``[0, num_processes)``, or ``None`` as above.
      initialization_timeout: seconds to wait for the coordinator and every process to connect (JAX's default,
        300); a process other than 0 given ``coordinator_address`` spends the first part of them in
        :func:`wait_for_coordinator`.

    Returns:
      whether it initialised (``bool``). A bad ``mode``, only one of ``num_processes`` / ``process_id``, a
      ``process_id`` out of range or a timeout below 1 s is a ``ValueError`` and a timeout that is not a Python int
      a ``TypeError`` (raised before anything starts); no
      coordinator at ``coordinator_address`` within the timeout is a ``TimeoutError``, and so, for process 0 given
      the address, are other processes that do not all connect in time (:func:`wait_for_processes`; without an
      address JAX ends the process then).

    Examples:
      A single-process job (no coordinator, no cluster task count) starts nothing under ``"auto"``:

      >>> from unittest import mock
      >>> single = {k: v for k, v in os.environ.items() if k not in ("JAX_COORDINATOR_ADDRESS", *_TASK_COUNT_ENV)}
      >>> with mock.patch.dict(os.environ, single, clear=True):
      ...     initialize_distributed("auto"), initialize_distributed("off")
      (False, False)
      >>> initialize_distributed("auto", num_processes=2, process_id=2)
      Traceback (most recent call last):
      ValueError: process_id must be in [0, num_processes=2), got 2
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"distributed must be 'auto', 'on' or 'off', got {mode!r}")
    if (num_processes is None) != (process_id is None):
        raise ValueError(
            f"num_processes and process_id go together, got num_processes={num_processes!r}, process_id={process_id!r}"
        )
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, num_processes={num_processes}), got {process_id!r}")
    check_positive_int(initialization_timeout, "initialization_timeout")
    multi = (
        coordinator_address is not None
        or num_processes is not None
        or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
        or any(os.environ.get(v, "1").isdigit() and int(os.environ.get(v, "1")) > 1 for v in _TASK_COUNT_ENV)
    )
    if mode == "on" or (mode == "auto" and multi):
        deadline = time.monotonic() + initialization_timeout
        if coordinator_address is not None and process_id not in (None, 0):  # process 0 starts the coordinator
            wait_for_coordinator(coordinator_address, initialization_timeout)
        elif coordinator_address is not None and process_id == 0 and num_processes:
            wait_for_processes(coordinator_address, num_processes - 1, initialization_timeout)
        left = max(1, round(deadline - time.monotonic()))
        jax.distributed.initialize(coordinator_address, num_processes, process_id, initialization_timeout=left)
        log.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())
        return True
    return False


def wait_for_processes(address: str, others: int, timeout: float) -> None:
    """Process 0's side of :func:`wait_for_coordinator`: accept connections at ``address``'s port (every interface)
    until ``others`` processes have connected, then close it for JAX's coordinator, which would instead end the
    process (``SIGABRT``) when one never connects.

    Args:
      address: the coordinator's ``HOST:PORT`` (this process's; the port is listened on).
      others: how many other processes must connect (``num_processes - 1``).
      timeout: seconds to wait for them.

    Returns:
      ``None``, once they all connected.

    Raises:
      TimeoutError: fewer than ``others`` connected within ``timeout`` seconds; the message names the address and
        the count.

    Examples:
      >>> with socket.create_server(("127.0.0.1", 0)) as free:
      ...     port = free.getsockname()[1]
      >>> wait_for_processes(f"127.0.0.1:{port}", 1, 0.5)
      Traceback (most recent call last):
      TimeoutError: coordinator 127.0.0.1:...: 0 of the 1 other processes connected within 0.5 s; are they all started with this --coordinator and --num-processes 2?
    """
    port = int(address.rpartition(":")[2])
    dual = socket.has_dualstack_ipv6()
    family = socket.AF_INET6 if dual else socket.AF_INET
    deadline, connected = time.monotonic() + timeout, 0
    with socket.create_server(("", port), family=family, dualstack_ipv6=dual) as server:
        while connected < others:
            server.settimeout(max(1e-3, deadline - time.monotonic()))
            try:
                server.accept()[0].close()
            except TimeoutError:
                raise TimeoutError(
                    f"coordinator {address}: {connected} of the {others} other processes connected within {timeout:g} "
                    f"s; are they all started with this --coordinator and --num-processes {others + 1}?"
                ) from None
            connected += 1


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Wait until something accepts a TCP connection at ``address`` (``HOST:PORT``, ``[IPv6]:PORT``), trying every
    quarter second until ``timeout`` seconds have passed; the connection is closed at once.

    Args:
      address: the coordinator's ``HOST:PORT``.
      timeout: seconds to keep trying.

    Returns:
      ``None``, once a connection was accepted.

    Raises:
      TimeoutError: nothing accepted a connection within ``timeout`` seconds; the message names the address and
        the last error (refused, unknown host, ...).

    Examples:
      >>> with socket.create_server(("127.0.0.1", 0)) as server:
      ...     wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", 5)
      >>> wait_for_coordinator("127.0.0.1:1", 0.5)
      Traceback (most recent call last):
      TimeoutError: coordinator 127.0.0.1:1: no connection within 0.5 s (last: ...); is process 0 running with this address?
    """
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=max(0.1, min(2.0, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            last = e
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"coordinator {address}: no connection within {timeout:g} s (last: {last}); "
                "is process 0 running with this address?"
            )
        time.sleep(min(0.25, left))


def select_devices(num_devices: int | None) -> list:
    """The first ``num_devices`` of ``jax.devices()``.

    Args:
      num_devices: how many devices (``None``: all). A multi-process run must use all of them (every process drives
        devices of the mesh).

    Returns:
      a list of ``jax.Device``. Fewer devices than asked for (or fewer than all in a multi-process run) is a
      ``ValueError`` naming ``devices``.

    Examples:
      >>> select_devices(None) == jax.devices(), select_devices(1) == jax.devices()[:1]
      (True, True)
      >>> select_devices(len(jax.devices()) + 1)
      Traceback (most recent call last):
      ValueError: devices: asked for ..., but ... device(s) are available
    """
    devices = jax.devices()
    if num_devices is None:
        return devices
    if jax.process_count() > 1 and num_devices != len(devices):
        raise ValueError(
            f"devices: a multi-process run uses every process's devices ({len(devices)} over "
            f"{jax.process_count()} processes), got {num_devices}"
        )
    if not 1 <= num_devices <= len(devices):
        raise ValueError(
            f"devices: asked for {num_devices}, but {len(devices)} {devices[0].platform} device(s) are available"
        )
    return devices[:num_devices]


def make_mesh(num_devices: int | None = None, model_parallel: int = 1) -> Mesh:
    """A ``(data, model)`` mesh of Auto axes over the first ``num_devices`` devices.

    Args:
      num_devices: how many devices (``None``: all; see :func:`select_devices`).
      model_parallel: the size of the ``model`` axis; it must divide the number of devices.

    Returns:
      a ``jax.sharding.Mesh`` of shape ``(num_devices / model_parallel, model_parallel)`` with axis names
      ``("data", "model")``. A ``model_parallel`` that does not divide the devices is a ``ValueError``.

    Examples:
      >>> dict(make_mesh(1).shape)
      {'data': 1, 'model': 1}
      >>> dict(make_mesh().shape) == {"data": jax.device_count(), "model": 1}
      True
      >>> make_mesh(1, model_parallel=2)
      Traceback (most recent call last):
      ValueError: model_parallel=2 must divide the 1 devices
    """
    devices = select_devices(num_devices)
    if model_parallel < 1 or len(devices) % model_parallel:
        raise ValueError(f"model_parallel={model_parallel} must divide the {len(devices)} devices")
    shape = (len(devices) // model_parallel, model_parallel)
    return jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def partition_spec(path: str, shape: tuple[int, ...], model_size: int, rules, *, strict: bool = True) -> P:
    """The PartitionSpec of an array at ``path`` by the first rule whose regex is found in ``path``.

    Args:
      path: the "/"-joined path of a parameter, or of an optimiser moment (which contains its parameter's path).
      shape: the array's shape.
      model_size: the size of the mesh's ``model`` axis.
      rules: ``(regex, PartitionSpec)`` pairs, tried in order (e.g.
        :meth:`isojax.train.model.TaskModel.partition_rules`).
      strict: whether a path that no rule matches is an error (parameters) or replicated (other state).

    Returns:
      the rule's ``PartitionSpec``; ``P()`` (replicated) when ``model_size == 1``, when the rule splits nothing,
      when a split dimension does not divide by ``model_size`` (with a logged warning), or when no rule matches and
      not ``strict``. No matching rule under ``strict`` is a ``ValueError`` naming the path.

    Examples:
      >>> rules = [(r"query/kernel$", P(None, "model")), (r"norm/scale$", P())]
      >>> partition_spec("layer_0/attention/query/kernel", (8, 8), 2, rules)
      P(None, 'model')
      >>> partition_spec("layer_0/attention/query/kernel", (8, 9), 2, rules)  # 9 columns do not split in two
      P()
      >>> partition_spec("layer_0/attention/key/kernel", (8, 8), 2, rules)
      Traceback (most recent call last):
      ValueError: no partition rule names parameter 'layer_0/attention/key/kernel' (shape (8, 8)); ...
    """
    for pattern, spec in rules:
        if re.search(pattern, path):
            if model_size == 1 or all(axis is None for axis in spec):
                return P()
            if len(spec) == len(shape) and all(
                axis is None or shape[i] % model_size == 0 for i, axis in enumerate(spec)
            ):
                return spec
            log.warning(
                "%s: shape %s does not divide as %s over %d model devices; replicated", path, shape, spec, model_size
            )
            return P()
    if strict:
        raise ValueError(
            f"no partition rule names parameter {path!r} (shape {shape}); add one next to the layer "
            "that defines it (see isojax.models.registry.partition_rules)"
        )
    return P()


def state_shardings(state, mesh: Mesh, rules, *, fsdp: bool = False):
    """The ``NamedSharding`` of every leaf of a train state on ``mesh``.

    Each leaf's spec is :func:`partition_spec` of its "/"-joined path: strictly for the leaves under ``params``, by
    the same rules where they match elsewhere (optimiser moments), else replicated. With ``fsdp``, the leaves under
    :data:`FSDP_FIELDS` are in addition split over the data axis (:func:`~isojax.models.partitioning.fsdp_spec`).

    Args:
      state: a pytree whose top-level fields include ``params`` (a :class:`~isojax.train.state.TrainState` or a dict),
        its leaves arrays or ``jax.ShapeDtypeStruct`` s (only their shapes are read).
      mesh: a ``(data, model)`` mesh (:func:`make_mesh`), or an abstract one.
      rules: the ``(regex, PartitionSpec)`` partition rules of the model.
      fsdp: also split ``params`` and ``opt_state`` over the data axis.

    Returns:
      a pytree of the structure of ``state`` with a ``NamedSharding`` at every leaf.

    Examples:
      On an abstract 2 × 2 mesh (no devices needed): the kernel is split by its columns over ``model``, and under FSDP
      by its rows over ``data`` too; the step count stays replicated:

      >>> from jax.sharding import AbstractMesh
      >>> mesh = AbstractMesh((2, 2), ("data", "model"))
      >>> state = {"params": {"dense": {"kernel": jax.ShapeDtypeStruct((8, 4), "float32")}},
      ...          "step": jax.ShapeDtypeStruct((), "int32")}
      >>> rules = [(r"dense/kernel$", P(None, "model"))]
      >>> [s.spec for s in jax.tree.leaves(state_shardings(state, mesh, rules))]
      [P(None, 'model'), P()]
      >>> [s.spec for s in jax.tree.leaves(state_shardings(state, mesh, rules, fsdp=True))]
      [P('data', 'model'), P()]
    """
    model_size = mesh.shape["model"]
    data_size = mesh.shape["data"] if fsdp else 1

    def sharding(path, x):
        keys, shape = _path(path), np.shape(x)
        field = keys.split("/", 1)[0]
        spec = partition_spec(keys, shape, model_size, rules, strict=field == "params")
        if field in FSDP_FIELDS:
            spec = fsdp_spec(keys, shape, spec, data_size)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, state)


def gathered_shardings(shardings):
    """The shardings with the data axis (:data:`~isojax.models.partitioning.FSDP_AXIS`) taken out of every spec.

    Every array whole over the data axis, laid out as the model-parallel rules alone say (FSDP's parameters as the
    step uses them, module docstring).

    Args:
      shardings: a pytree of ``NamedSharding`` s (e.g. the ``params`` of :func:`state_shardings` with ``fsdp=True``).

    Returns:
      a pytree of the same structure: each ``NamedSharding`` on the same mesh with ``"data"`` replaced by ``None``.

    Examples:
      >>> from jax.sharding import AbstractMesh
      >>> mesh = AbstractMesh((2, 2), ("data", "model"))
      >>> gathered = gathered_shardings({"kernel": NamedSharding(mesh, P("data", "model")), "bias": NamedSharding(mesh, P())})
      >>> gathered["kernel"].spec, gathered["bias"].spec
      (P(None, 'model'), P())
    """
    return jax.tree.map(
        lambda s: NamedSharding(s.mesh, P(*(None if axis == FSDP_AXIS else axis for axis in s.spec))), shardings
    )


def _on_gathered(predict: Callable, gathered) -> Callable:
    """FSDP's prediction: ``predict(state, batch)`` on ``state.params`` constrained to the gathered layout."""

    def on_gathered(state, batch):
        params = jax.lax.with_sharding_constraint(state.params, gathered)
        return predict(dataclasses.replace(state, params=params), batch)

    return on_gathered


def traced_on(fn: Callable, mesh: Mesh) -> Callable:
    """``fn`` traced with ``mesh`` as the abstract mesh (``jax.sharding.use_abstract_mesh``): what the model code
    reads of the placement, the data axis's size (:func:`isojax.models.embeddings.data_shards`, for the uses of a tied
    table). The axes stay *Auto*: nothing else changes."""

    def on_mesh(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return on_mesh


def _to_host(x) -> np.ndarray:
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return multihost_utils.process_allgather(x, tiled=True)


class MeshRunner:
    """Train and predict under ``jit`` on a mesh (module docstring); :func:`make_runner` builds one.

    ``train_step(placed, batch)`` and ``predict_step(placed, batch)`` are the jitted functions themselves (with their
    shardings; e.g. ``train_step.lower(state, batch).compile()`` to read the compiled step), taking the batch as
    :meth:`device_batch` builds it.

    Args:
      mesh: a ``(data, model)`` mesh (:func:`make_mesh`).
      make_step: ``make_step(**placement)`` builds the train step ``(state, batch) -> (state, metrics)`` given the
        placement keywords of :func:`~isojax.train.step.make_train_step` (none; ``gathered`` under FSDP;
        ``data_axis`` under pmap), e.g. ``functools.partial(make_train_step, model, objective, optimizer)``.
      predict: the prediction step ``(state, batch) -> dict`` of ``[B, ...]`` arrays.
      abstract_state: the train state's structure (arrays or ``jax.ShapeDtypeStruct`` s), which with
        ``partition_rules`` fixes its shardings (:func:`state_shardings`).
      partition_rules: the model's ``(regex, PartitionSpec)`` rules.
      fsdp: also split the parameters and optimiser state over the data axis.
      pmap: the pmap placement: the step runs per device in ``jax.shard_map`` over the data axis, the state
        replicated (module docstring).

    Attributes:
      mesh: as given.
      state_sharding: the ``NamedSharding`` of every leaf of the state (:func:`state_shardings`).
      batch_sharding: ``NamedSharding(mesh, P("data"))``: batch rows over the data axis.
      train_step: the jitted train step (the state argument donated).
      predict_step: the jitted prediction step.
    """

    def __init__(
        self,
        mesh: Mesh,
        make_step: Callable[..., Callable],
        predict: Callable,
        abstract_state,
        partition_rules,
        *,
        fsdp: bool = False,
        pmap: bool = False,
    ):
        self.mesh = mesh
        self.state_sharding = state_shardings(abstract_state, mesh, partition_rules, fsdp=fsdp)
        self.batch_sharding = NamedSharding(mesh, P("data"))
        replicated = NamedSharding(mesh, P())
        if fsdp:  # communicate parameters and gradients, never activations (module docstring)
            gathered = gathered_shardings(self.state_sharding.params)
            step = make_step(gathered=gathered)
            predict = _on_gathered(predict, gathered)
        elif pmap:  # as jax.pmap runs: shard_map over the devices, without its replication checks
            step = jax.shard_map(
                make_step(data_axis="data"), mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=False
            )
        else:
            step = make_step()
        self.train_step = jax.jit(
            traced_on(step, mesh),
            in_shardings=(self.state_sharding, self.batch_sharding),
            out_shardings=(self.state_sharding, replicated),
            donate_argnums=0,
        )
        self.predict_step = jax.jit(
            predict, in_shardings=(self.state_sharding, self.batch_sharding), out_shardings=self.batch_sharding
        )

    def place(self, state):
        """Put a host or single-device state onto the mesh: each process puts the shards its devices hold, from its
        own copy. Every process must hold the same state: in a multi-process run the CRC-32 of each array's bytes
        is compared across the processes (``device_put`` would all-gather every whole array to compare them)."""
        host = jax.tree.map(np.asarray, jax.device_get(state))
        if jax.process_count() > 1:
            crcs = np.array([zlib.crc32(np.ascontiguousarray(x).tobytes()) for x in jax.tree.leaves(host)], np.uint32)
            multihost_utils.assert_equal(crcs, "the processes' copies of the state to place differ")
        return jax.tree.map(
            lambda x, s: jax.make_array_from_callback(x.shape, s, x.__getitem__), host, self.state_sharding
        )

    def checkpoint_view(self, placed):
        """What a checkpoint stores: the global arrays themselves (Orbax writes shards in parallel)."""
        return placed

    def host(self, tree):
        """A placed pytree (state, params, metrics) as host numpy arrays. Replicated arrays are read from this
        process's devices; sharded ones are gathered over the processes (a collective: every process calls it)."""
        return jax.tree.map(_to_host, tree)

    def process_rows(self, batch_size: int) -> np.ndarray:
        """Positions, within a global batch of ``batch_size`` rows, of the rows that this process feeds: those its
        devices hold under the batch sharding, in order (all of them in a single-process run)."""
        blocks = {
            index[0].indices(batch_size)[:2]
            for index in self.batch_sharding.addressable_devices_indices_map((batch_size,)).values()
            if index is not None  # None: a device outside the sharding (none here)
        }
        return np.concatenate([np.arange(start, stop) for start, stop in sorted(blocks)])

    def restore_target(self, abstract_state):
        """Abstract state with shardings: Orbax restores each shard straight onto its device."""
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, self.state_sharding
        )

    def from_checkpoint(self, restored):
        """The placed state from what :meth:`restore_target` restored: already on the mesh, as it is."""
        return restored

    def device_batch(self, rows: dict) -> dict:
        """The global batch that ``train_step`` / ``predict_step`` take (rows over the data axis), given this
        process's rows of it (:meth:`process_rows`)."""
        return jax.make_array_from_process_local_data(self.batch_sharding, rows)

    def train(self, placed, rows: dict):
        """One step on a global batch, given this process's rows of it (numpy; :meth:`process_rows`); returns the
        new placed state and device metrics."""
        return self.train_step(placed, self.device_batch(rows))

    def predict(self, placed, rows: dict) -> dict:
        """Predictions for a whole global batch (host numpy, gathered), given this process's rows of it."""
        return self.host(self.predict_step(placed, self.device_batch(rows)))


def make_runner(
    mode: Parallel,
    *,
    num_devices: int | None,
    model_parallel: int,
    make_step,
    predict,
    abstract_state,
    partition_rules,
    fsdp: bool = False,
) -> MeshRunner:
    """The :class:`MeshRunner` of a placement over the first ``num_devices`` devices.

    Placement of the state on the mesh: replicated (``model_parallel=1``), model-parallel (``model_parallel > 1``: a
    ``(devices / model_parallel, model_parallel)`` mesh), and with ``fsdp=True`` the parameters and optimiser state
    also split over the data axis (FSDP, module docstring; combines with ``model_parallel``); ``mode="pmap"``: the
    pmap placement (data-parallel only).

    Args:
      mode: one of :data:`~isojax.train.config.PARALLEL_MODES`: ``"mesh"`` or ``"pmap"``.
      num_devices: how many devices (``None``: all).
      model_parallel: the size of the mesh's ``model`` axis (``"pmap"``: must be 1).
      make_step: ``make_step(**placement)`` builds the train step ``(state, batch) -> (state, metrics)``
        (:class:`MeshRunner`).
      predict: the prediction step ``(state, batch) -> dict``.
      abstract_state: the train state's structure (arrays or ``jax.ShapeDtypeStruct`` s).
      partition_rules: the model's rules, e.g. :meth:`isojax.train.model.TaskModel.partition_rules`.
      fsdp: FSDP; needs ``mode="mesh"``.

    Returns:
      the runner. An unknown mode, ``model_parallel > 1`` or ``fsdp`` under ``"pmap"`` is a ``ValueError``
      (:class:`~isojax.train.config.PlacementConfig` checks them).

    Examples:
      Both placements see the global batch: the step's metric is the sum over all rows, ``Σ 2 x = 2 · 28``; under pmap
      the step runs per device, on its rows (the sum is then a ``psum``):

      >>> import numpy as np
      >>> def make_step(data_axis=None, gathered=None):
      ...     def step(state, batch):
      ...         total = (state["params"]["w"] * batch["x"]).sum()
      ...         return state, {"sum": total if data_axis is None else jax.lax.psum(total, data_axis)}
      ...     return step
      >>> def predict(state, batch):
      ...     return {"y": state["params"]["w"] * batch["x"]}
      >>> state = {"params": {"w": np.float32(2.0)}}
      >>> batch = {"x": np.arange(8, dtype=np.float32)}
      >>> for mode in ("mesh", "pmap"):
      ...     runner = make_runner(mode, num_devices=None, model_parallel=1, make_step=make_step, predict=predict,
      ...                          abstract_state=state, partition_rules=[(r"w$", P())])
      ...     placed, metrics = runner.train(runner.place(state), batch)
      ...     print(mode, runner.host(metrics)["sum"], runner.predict(placed, batch)["y"][-2:])
      mesh 56.0 [12. 14.]
      pmap 56.0 [12. 14.]
    """
    PlacementConfig(devices=num_devices, parallel=mode, model_parallel=model_parallel, fsdp=fsdp)
    mesh = make_mesh(num_devices, model_parallel)
    return MeshRunner(mesh, make_step, predict, abstract_state, partition_rules, fsdp=fsdp, pmap=mode == "pmap")


__all__ = [
    "FSDP_FIELDS",
    "MeshRunner",
    "gathered_shardings",
    "initialize_distributed",
    "make_mesh",
    "make_runner",
    "partition_spec",
    "select_devices",
    "state_shardings",
    "wait_for_coordinator",
    "wait_for_processes",
]
