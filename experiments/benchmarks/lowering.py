"""The lowering matrix: every public entry point of isojax lowered by the compiler for each platform, from this host.

    python -m experiments.benchmarks.lowering [--groups spectral,functions,models,generate,train] [--platforms tpu,cuda,rocm,cpu]
                                   [--out experiments/results]

Each entry point (a tiny configuration of it, built from a config: nothing is downloaded) is exported with
``jax.export.export(jax.jit(f), platforms=(p,))(*args)`` for ``p`` in tpu, cuda, rocm and cpu. A cell is

- ``lowers``: the export succeeded. ``(not serializable: T)`` adds that it needed the custom call ``T``, which
  JAX gives no compatibility guarantee (it lowers and compiles on that platform, but JAX will not serialise it
  without ``DisabledSafetyCheck.custom_call``);
- ``refused: R``: a decomposition the platform has no lowering for (:data:`isojax.spectral.METHODS`: only
  ``gram_eigh_f64`` on TPU), refused by isojax up front with a ``ValueError`` naming the platform, or, exported
  from a host that has it, by JAX's lowering of isojax's per-platform dispatch (``NotImplementedError: ...
  platform_index(platforms=...) not found for platform P``: the platforms that have a branch);
- ``FAILS: E``: anything else, an error from inside JAX: a defect.

Every cell also records whether the module holds float64 (a TPU module must not) and its ``custom_call`` targets;
a train step must hold no host callback. On CPU the export is serialised, deserialised and called, and its result
compared with the direct jitted call (largest absolute difference; the matrix says ``round trip`` per entry).
Run on an accelerator (``python -m experiments.accelerator`` does, for the platform it sees), the round trip is
made there instead: the export for that platform compiled and run on the device. Writes ``lowering.{md,json}``
with the command, commit and machine. The same cells are the test ``tests/test_lowering.py`` (on fewer entry points
per group where a group repeats itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the mesh cells need 8 devices; on CPU they are virtual (as tests/conftest.py does)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.tooling.files import write_json  # noqa: E402
from experiments.tooling.report import RESULTS, markdown_table, provenance  # noqa: E402

PLATFORMS = ("tpu", "cuda", "rocm", "cpu")
HOST_CALLBACK = re.compile(r"callback", re.IGNORECASE)
"""custom_call targets of host callbacks (``xla_python_cpu_callback``, ``xla_ffi_python_gpu_callback``, ...)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row of the matrix: ``build() -> (f, args)``; ``f`` is exported as ``jax.jit(f)`` unless it is jitted
    already (a train step as its runner compiles it, with its shardings)."""

    group: str
    name: str
    build: Callable[..., tuple[Callable, tuple]]
    """Called with no arguments (typed ``...``: the entries are lambdas that bind loop variables as defaults)."""
    round_trip: bool = True
    """Call the CPU export and compare with the direct call (False: arguments that need a device placement)."""


# ---------------------------------------------------------------------------------------------------- cells


def _custom_calls(text: str) -> list[str]:
    return sorted(set(re.findall(r"custom_call\s*@([\w.]+)", text)))


def export(f, args, platform: str):
    """``(exported, unserialisable custom-call targets)``: ``jax.export`` for ``platform``, retried with the safety
    check disabled for custom calls JAX gives no compatibility guarantee (named in its error)."""
    fn = f if hasattr(f, "trace") else jax.jit(f)
    disabled: list[str] = []
    while True:
        try:
            checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in disabled]
            return jax.export.export(fn, platforms=(platform,), disabled_checks=checks)(*args), disabled
        except ValueError as e:
            new = [t for t in _custom_calls(str(e)) if t not in disabled]
            if "Cannot serialize code with custom calls" not in str(e) or not new:
                raise
            disabled += new


def refusal(error: BaseException, platform: str) -> bool:
    """Whether ``error`` refuses a decomposition ``platform`` has no lowering for: isojax's ``ValueError``, or JAX's
    lowering of :func:`isojax.spectral.thin_svd`'s per-platform dispatch, which has no branch for ``platform``."""
    if isinstance(error, ValueError):
        return f"does not lower on {platform}" in str(error)
    text = str(error)
    return isinstance(error, NotImplementedError) and "platform_index" in text and f"for platform {platform}" in text


def lower_cell(f, args, platform: str) -> dict:
    """One cell: ``{"status": "lowers" | "refused" | "fails", "detail", "float64", "custom_calls",
    "host_callbacks", "unserializable", "seconds"}``."""
    start = time.perf_counter()
    try:
        exported, unsafe = export(f, args, platform)
    except Exception as e:  # noqa: BLE001 - every failure is a cell of the matrix
        status = "refused" if refusal(e, platform) else "fails"
        return {
            "status": status,
            "detail": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
            "seconds": round(time.perf_counter() - start, 2),
        }
    text = exported.mlir_module()
    calls = _custom_calls(text)
    return {
        "status": "lowers",
        "detail": "",
        "float64": bool(re.search(r"\bf64\b", text)),
        "custom_calls": calls,
        "host_callbacks": [c for c in calls if HOST_CALLBACK.search(c)],
        "unserializable": unsafe,
        "seconds": round(time.perf_counter() - start, 2),
        "exported": exported,
    }


def round_trip(exported, f, args) -> float:
    """Largest absolute difference between the deserialised CPU export called on ``args`` and ``jax.jit(f)``."""
    restored = jax.export.deserialize(exported.serialize())
    got, want = restored.call(*args), (f if hasattr(f, "trace") else jax.jit(f))(*args)
    diffs = [
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    ]
    return max(diffs, default=0.0)


def cell_text(cell: dict) -> str:
    if cell["status"] == "refused":
        return "refused: " + cell["detail"].removeprefix("ValueError: ")
    if cell["status"] == "fails":
        return "FAILS: " + cell["detail"]
    notes = [f"not serializable: {', '.join(cell['unserializable'])}"] if cell["unserializable"] else []
    notes += ["float64"] if cell["float64"] else []
    notes += [f"host callback {', '.join(cell['host_callbacks'])}"] if cell["host_callbacks"] else []
    return "lowers" + (f" ({'; '.join(notes)})" if notes else "")


def _flat(f, args):
    """``f`` as a function of the leaves of ``args`` returning the leaves of its result, and those leaves."""
    leaves, tree = jax.tree.flatten(args)
    return (lambda *xs: jax.tree.leaves(f(*jax.tree.unflatten(tree, xs)))), tuple(leaves)


def run_entry(entry: Entry, platforms=PLATFORMS) -> dict:
    """The cells of one entry (and its round trip on the platform this process runs on)."""
    from isojax.spectral import current_platform

    here = current_platform()
    try:
        f, args = entry.build()
    except Exception as e:  # noqa: BLE001
        return {"group": entry.group, "name": entry.name, "build_error": f"{type(e).__name__}: {e}"[:300]}
    if not hasattr(f, "trace"):  # flat arguments and results: the export serialises without pytree registrations
        f, args = _flat(f, args)
    row: dict[str, Any] = {"group": entry.group, "name": entry.name, "cells": {}}
    for p in platforms:
        cell = lower_cell(f, args, p)
        exported = cell.pop("exported", None)
        if p == here and exported is not None and entry.round_trip:
            try:
                row["round_trip_max_abs_diff"] = round_trip(exported, f, args)
            except Exception as e:  # noqa: BLE001
                row["round_trip_error"] = f"{type(e).__name__}: {e}"[:300]
        row["cells"][p] = cell
    return row


# -------------------------------------------------------------------------------------------------- entries


def _grad(f, argnum=0):
    """Gradient of the sum of ``f``'s floating outputs with respect to argument ``argnum``."""

    def total(*args):
        leaves = [x for x in jax.tree.leaves(f(*args)) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
        return sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)

    return jax.grad(total, argnums=argnum)


def _cloud(n=8, d=4, seed=0, batch=()):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((*batch, n, d)), jnp.float32)


def _mask(n=8, real=6, batch=()):
    return jnp.broadcast_to(jnp.arange(n) < real, (*batch, n))


def spectral_entries(methods=None) -> list[Entry]:
    """``soft_decay`` and ``spectral_map`` forward and gradient for every strategy and ``auto``; ``thin_svd``,
    ``spectral_derivative``, ``softdecay_derivative`` and the ``SoftDecay`` module with ``auto``. The matrices are
    [2, 40, 6] (a side above 32, where ``auto`` differs between platforms) with a mask."""
    from isojax.softdecay import SoftDecay, soft_decay, softdecay_derivative
    from isojax.spectral import METHODS, spectral_derivative, spectral_map, thin_svd

    x, mask = _cloud(40, 6, batch=(2,)), _mask(40, 30, batch=(2,))
    alpha = jnp.float32(-0.6)
    out = []
    for m in methods or [*METHODS, "auto"]:
        sd = lambda x, a, m=m: soft_decay(x, a, mask=mask, method=m)  # noqa: E731
        sm = lambda x, m=m: spectral_map(x, jnp.log1p, mask=mask, method=m).y  # noqa: E731
        out += [
            Entry("spectral", f"soft_decay[{m}]", lambda sd=sd: (sd, (x, alpha))),
            Entry("spectral", f"grad soft_decay[{m}] (x, alpha)", lambda sd=sd: (_grad(sd, (0, 1)), (x, alpha))),
            Entry("spectral", f"spectral_map[{m}]", lambda sm=sm: (sm, (x,))),
            Entry("spectral", f"grad spectral_map[{m}]", lambda sm=sm: (_grad(sm), (x,))),
        ]
    module = SoftDecay()
    variables = module.init(jax.random.key(0), x, mask)
    out += [
        Entry("spectral", "thin_svd[auto]", lambda: (lambda x: thin_svd(x), (x,))),
        Entry(
            "spectral",
            "spectral_derivative[auto] .vjp",
            lambda: (lambda x: spectral_derivative(x, jnp.log1p, mask=mask).vjp(x), (x,)),
        ),
        Entry(
            "spectral",
            "softdecay_derivative[auto] .singular_values",
            lambda: (lambda x: softdecay_derivative(x, alpha, mask=mask).singular_values(), (x,)),
        ),
        Entry(
            "spectral",
            "grad SoftDecay module (params)",
            lambda: (_grad(lambda v, x: module.apply(v, x, mask)), (variables, x)),
        ),
    ]
    return out


@functools.cache
def _function_calls() -> dict[str, tuple[Callable, tuple, bool]]:
    """``{module.name: (f, array args, differentiable)}`` for every function in the ``__all__`` of
    metrics, losses, topology, calibrate and gradients (classes: their modules' apply, or a state they build)."""
    from isojax import calibrate, gradients, losses, metrics, topology

    x, m, w = _cloud(16, 4), _mask(16, 12), _cloud(10, 4, seed=1)
    labels = jnp.asarray(np.arange(16) % 2, jnp.int32)
    bars = topology.zero_dim_barcode(x, mask=m)
    key = jax.random.key(0)
    flow = calibrate.fit_flow(x, key, mask=m, levels=1, depth=1, hidden=8, steps=2, batch_size=8)
    whitening = calibrate.fit_whitening(x, mask=m)
    abtt = calibrate.fit_all_but_the_top(x, D=1, mask=m)
    centering = calibrate.fit_centering(x, mask=m)
    cov = jnp.cov(x.T) + jnp.eye(4)
    isobn = calibrate.IsoBN(use_running_average=False)
    isobn_vars = isobn.init(key, x, mask=m)
    layer = calibrate.IsotropyLayer()
    layer_vars = layer.init(key, x)
    flow_module = calibrate.Flow(levels=1, depth=1, hidden=8)
    flow_vars = flow_module.init(key, x, m)
    h, targets = _cloud(16, 4, seed=2), jnp.asarray(np.arange(16) % 10, jnp.int32)
    calls: dict[str, tuple[Callable, tuple, bool]] = {
        "metrics.explained_variance": (lambda x: metrics.explained_variance(x, 2, mask=m), (x,), True),
        "metrics.isoscore": (lambda x: metrics.isoscore(x, mask=m), (x,), True),
        "metrics.isoscore_star": (lambda x: metrics.isoscore_star(x, c0=cov, mask=m), (x,), True),
        "metrics.partition_isotropy": (lambda w: metrics.partition_isotropy(w), (w,), True),
        "metrics.token_uniformity": (lambda x: metrics.token_uniformity(x, mask=m), (x,), True),
        "metrics.rbf_uniformity": (lambda x: metrics.rbf_uniformity(x, mask=m), (x,), True),
        "metrics.lsds": (lambda x: metrics.lsds(x, 2 * x, k=3, mask=m), (x,), True),
        "metrics.anisotropy": (lambda x: metrics.anisotropy(x, mask=m), (x,), True),
        "metrics.singular_value_stats": (lambda x: metrics.singular_value_stats(x, mask=m), (x,), True),
        "metrics.SingularValueStats": (lambda x: metrics.singular_value_stats(x, mask=m), (x,), True),
        "metrics.empirical_cdf": (lambda v: metrics.empirical_cdf(v, jnp.linspace(-1, 1, 5)), (x[:, 0],), False),
        "metrics.massive_activations": (lambda x: metrics.massive_activations(x, mask=m), (x,), False),
        "metrics.MassiveActivation": (lambda x: metrics.massive_activations(x, mask=m), (x,), False),
        "metrics.rogue_dimensions": (lambda x: metrics.rogue_dimensions(x, mask=m), (x,), False),
        "metrics.RogueDimensions": (lambda x: metrics.rogue_dimensions(x, mask=m), (x,), False),
        "metrics.attention_sinks": (
            lambda x: metrics.attention_sinks(jax.nn.softmax(x @ x.T, axis=-1)[None], mask=m[None]),
            (x,),
            True,
        ),
        "metrics.AttentionSinks": (
            lambda x: metrics.attention_sinks(jax.nn.softmax(x @ x.T, axis=-1)[None], mask=m[None]),
            (x,),
            False,
        ),
        "metrics.twonn_dimension": (lambda x: metrics.twonn_dimension(x, mask=m), (x,), False),
        "metrics.random_pair_cosine": (lambda x: metrics.random_pair_cosine(x, key, num_pairs=8, mask=m), (x,), True),
        "metrics.alignment": (lambda x: metrics.alignment(x, 2 * x + 1, mask=m), (x,), True),
        "losses.cosine_regularization": (lambda w: losses.cosine_regularization(w), (w,), True),
        "losses.polynomial_decay": (lambda c: losses.polynomial_decay(4, c1=c, gamma=1.5), (jnp.float32(2),), True),
        "losses.exponential_decay": (
            lambda c: losses.exponential_decay(4, c1=c, c2=0.5, gamma=1.5),
            (jnp.float32(2),),
            True,
        ),
        "losses.spectrum_polynomial": (lambda w: losses.spectrum_polynomial(w, c1=2.0, gamma=1.5), (w,), True),
        "losses.spectrum_exponential": (
            lambda w: losses.spectrum_exponential(w, c1=2.0, c2=0.5, gamma=1.5),
            (w,),
            True,
        ),
        "losses.isoscore_loss": (lambda x: losses.isoscore_loss(x, mask=m), (x,), True),
        "losses.istar_loss": (lambda x: losses.istar_loss(x, c0=cov, mask=m), (x,), True),
        "losses.balancer_init": (lambda: losses.balancer_init(2), (), False),
        "losses.BalancerState": (lambda: losses.balancer_init(2), (), False),
        "losses.balancer_update": (
            lambda current: losses.balancer_update(losses.balancer_init(2), current),
            (jnp.asarray([1.0, 2.0]),),
            False,
        ),
        "losses.balancer_factors": (losses.balancer_factors, (jnp.asarray([1.0, 3.0]),), False),
        "topology.zero_dim_barcode": (lambda x: topology.zero_dim_barcode(x, mask=m), (x,), True),
        "topology.barcode_edges": (lambda x: topology.barcode_edges(x, mask=m), (x,), False),
        "topology.barcode_mask": (lambda m: topology.barcode_mask(m), (m,), False),
        "topology.persistent_entropy": (
            lambda b: topology.persistent_entropy(b, mask=topology.barcode_mask(m)),
            (bars,),
            True,
        ),
        "topology.select_prominent": (
            lambda b: topology.select_prominent(b, mask=topology.barcode_mask(m)),
            (bars,),
            False,
        ),
        "topology.persistent_entropy_loss": (
            lambda x: topology.persistent_entropy_loss(x, labels, mask=m, num_classes=2),
            (x,),
            True,
        ),
        "topology.persistent_entropy_loss_grad": (
            lambda x: topology.persistent_entropy_loss_grad(x, labels, mask=m, num_classes=2),
            (x,),
            False,
        ),
        "calibrate.all_but_the_top": (lambda x: calibrate.all_but_the_top(x, D=1, mask=m), (x,), True),
        "calibrate.center": (lambda x: calibrate.center(x, mask=m), (x,), True),
        "calibrate.fit_all_but_the_top": (lambda x: calibrate.fit_all_but_the_top(x, D=1, mask=m), (x,), True),
        "calibrate.AllButTheTopState": (lambda x: calibrate.fit_all_but_the_top(x, D=1, mask=m), (x,), True),
        "calibrate.apply_all_but_the_top": (lambda x: calibrate.apply_all_but_the_top(abtt, x), (x,), True),
        "calibrate.fit_centering": (lambda x: calibrate.fit_centering(x, mask=m), (x,), True),
        "calibrate.CenteringState": (lambda x: calibrate.fit_centering(x, mask=m), (x,), True),
        "calibrate.apply_centering": (lambda x: calibrate.apply_centering(centering, x), (x,), True),
        "calibrate.fit_flow": (
            lambda x, k: calibrate.fit_flow(x, k, mask=m, levels=1, depth=1, hidden=8, steps=2, batch_size=8),
            (x, key),
            False,
        ),
        "calibrate.FlowState": (
            lambda x, k: calibrate.fit_flow(x, k, mask=m, levels=1, depth=1, hidden=8, steps=2, batch_size=8),
            (x, key),
            False,
        ),
        "calibrate.fit_whitening": (lambda x: calibrate.fit_whitening(x, mask=m), (x,), True),
        "calibrate.WhiteningState": (lambda x: calibrate.fit_whitening(x, mask=m), (x,), True),
        "calibrate.apply_flow": (lambda x: calibrate.apply_flow(flow, x), (x,), True),
        "calibrate.invert_flow": (lambda z: calibrate.invert_flow(flow, z), (x,), True),
        "calibrate.isobn_scale": (lambda c: calibrate.isobn_scale(c, jnp.sqrt(jnp.diagonal(c))), (cov,), True),
        "calibrate.scale_lu_updates": (
            lambda g: calibrate.scale_lu_updates().update(g, calibrate.scale_lu_updates().init(g))[0],
            ({"w": x},),
            False,
        ),
        "calibrate.scaled_center": (lambda x: calibrate.scaled_center(x, mask=m), (x,), True),
        "calibrate.apply_whitening": (lambda x: calibrate.apply_whitening(whitening, x), (x,), True),
        "calibrate.IsoBN": (lambda x: isobn.apply(isobn_vars, x, mask=m, mutable=["batch_stats"])[0], (x,), True),
        "calibrate.IsotropyLayer": (lambda x: layer.apply(layer_vars, x), (x,), True),
        "calibrate.Flow": (lambda x: flow_module.apply(flow_vars, x, m), (x,), True),
        "gradients.cosine_regularization_grad": (lambda w: gradients.cosine_regularization_grad(w), (w,), False),
        "gradients.spectrum_polynomial_grad": (
            lambda w: gradients.spectrum_polynomial_grad(w, c1=2.0, gamma=1.5),
            (w,),
            False,
        ),
        "gradients.spectrum_exponential_grad": (
            lambda w: gradients.spectrum_exponential_grad(w, c1=2.0, c2=0.5, gamma=1.5),
            (w,),
            False,
        ),
        "gradients.isoscore_grad": (lambda x: gradients.isoscore_grad(x, mask=m), (x,), False),
        "gradients.isoscore_star_grad": (lambda x: gradients.isoscore_star_grad(x, c0=cov, mask=m), (x,), False),
        "gradients.isoscore_loss_grad": (lambda x: gradients.isoscore_loss_grad(x, mask=m), (x,), False),
        "gradients.istar_loss_grad": (lambda x: gradients.istar_loss_grad(x, c0=cov, mask=m), (x,), False),
        "gradients.persistent_entropy_loss_grad": (
            lambda x: gradients.persistent_entropy_loss_grad(x, labels, mask=m, num_classes=2),
            (x,),
            False,
        ),
        "gradients.spectral_derivative": (
            lambda x: gradients.spectral_derivative(x, jnp.log1p, mask=m).norm(),
            (x,),
            False,
        ),
        "gradients.SpectralDerivative": (
            lambda x: gradients.spectral_derivative(x, jnp.log1p, mask=m).cond(),
            (x,),
            False,
        ),
        "gradients.softdecay_derivative": (
            lambda x: gradients.softdecay_derivative(x, -0.6, mask=m).vjp(x),
            (x,),
            False,
        ),
        "gradients.softmax_gradient_split": (
            lambda w, h: gradients.softmax_gradient_split(w, h, targets),
            (w, h),
            True,
        ),
        "gradients.SoftmaxGradients": (lambda w, h: gradients.softmax_gradient_split(w, h, targets), (w, h), True),
        "gradients.common_enemies_alignment": (lambda w, g: gradients.common_enemies_alignment(w, g), (w, 2 * w), True),
        "gradients.CommonEnemiesAlignment": (lambda w, g: gradients.common_enemies_alignment(w, g), (w, 2 * w), True),
    }
    return calls


def public_functions() -> list[str]:
    """``module.name`` of everything in the ``__all__`` of metrics, losses, topology, calibrate and gradients."""
    from isojax import calibrate, gradients, losses, metrics, topology

    return [
        f"{mod.__name__.split('.')[-1]}.{name}"
        for mod in (metrics, losses, topology, calibrate, gradients)
        for name in mod.__all__
    ]


def function_entries(names=None) -> list[Entry]:
    """Each public function under ``jit`` and, where it is differentiable, under ``grad`` (tiny [16, 4] clouds)."""
    calls = _function_calls()
    out = []
    for name in names or public_functions():
        f, args, differentiable = calls[name]
        out.append(Entry("functions", name, lambda f=f, args=args: (f, args)))
        if differentiable and args:
            out.append(Entry("functions", f"grad {name}", lambda f=f, args=args: (_grad(f), args)))
    return out


ENCODERS = ("bert", "roberta", "albert", "distilbert", "mpnet")
ARCHITECTURES = (*ENCODERS, "gpt2", "bart")


def tiny_config(model_type: str):
    """A tiny :class:`isojax.models.TransformerConfig` of ``model_type`` (2 layers, width 32, vocabulary 99), through the
    Hugging Face config translation like a loaded checkpoint's."""
    from isojax.models import config_from_hf

    common = dict(vocab_size=99, max_position_embeddings=42)
    hf = {
        "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=40),
        "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_inner=40, n_positions=42, bos_token_id=1, eos_token_id=2),
        "bart": dict(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=40,
            decoder_ffn_dim=40,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=2,
        ),
        "albert": dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40, embedding_size=16
        ),
    }.get(model_type, dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40))
    if model_type == "gpt2":
        common.pop("max_position_embeddings")
    return config_from_hf({"model_type": model_type, **common, **hf})


def _ids(batch=2, length=8):
    return jnp.asarray(np.random.default_rng(0).integers(3, 99, (batch, length)), jnp.int32)


def model_entries(architectures=ARCHITECTURES, dtypes=("float32", "bfloat16")) -> list[Entry]:
    """Each architecture's forward (a [2, 8] batch; BART with decoder inputs) in each compute dtype."""
    from isojax.models import build_model, init_params, model_kind

    def build(model_type, dtype):
        cfg = tiny_config(model_type)
        module = build_model(cfg, dtype=jnp.dtype(dtype))
        params = init_params(module, jax.random.key(0))
        ids, mask = _ids(), jnp.ones((2, 8), jnp.int32)
        if model_kind(cfg) == "encoder_decoder":
            return (lambda p, i, m: module.apply({"params": p}, i, m, i)), (params, ids, mask)
        return (lambda p, i, m: module.apply({"params": p}, i, m)), (params, ids, mask)

    return [Entry("models", f"{t} forward {d}", lambda t=t, d=d: build(t, d)) for t in architectures for d in dtypes]


def generate_entries() -> list[Entry]:
    """``generate`` greedy and with 3 beams, GPT-2 (prompt 4, to length 10) and BART (source 6, to length 8)."""
    from isojax.models import build_model, init_params
    from isojax.models.generate import generate

    def build(model_type, beams):
        module = build_model(tiny_config(model_type))
        params = init_params(module, jax.random.key(0))
        ids = _ids(2, 4 if model_type == "gpt2" else 6)
        return (
            lambda p, i: generate(module, p, i, max_length=10 if model_type == "gpt2" else 8, num_beams=beams).sequences
        ), (params, ids)

    return [
        Entry("generate", f"generate {t} {'greedy' if b == 1 else f'beam {b}'}", lambda t=t, b=b: build(t, b))
        for t in ("gpt2", "bart")
        for b in (1, 3)
    ]


TRAIN_LAYOUTS: dict[str, dict[str, Any]] = {
    "1 device": dict(parallel="mesh", devices=1),
    "mesh data 8": dict(parallel="mesh", devices=8),
    "mesh data 4 x model 2": dict(parallel="mesh", devices=8, model_parallel=2),
    "mesh fsdp 8": dict(parallel="mesh", devices=8, fsdp=True),
    "mesh fsdp 4 x model 2": dict(parallel="mesh", devices=8, model_parallel=2, fsdp=True),
    "pmap 8": dict(parallel="pmap", devices=8),
}


def train_step(method: str, layout: str, *, dtype="bfloat16", remat="full"):
    """``(step, (state, batch))``: the first stage's train step of ``isojax finetune --method METHOD`` on a tiny
    BERT (scanned layers, ``remat``, ``dtype``), as :func:`isojax.train.loop.fit` builds it (its ``stage_runner``:
    objective, optimiser, runner over the layout's devices), without the tokenizer and data it would load: the
    model is built from a config as :func:`isojax.train.tasks.classification.build_task_model` builds it from a checkpoint, and the
    flow starts from random rows. ``step`` is the runner's compiled function (``jit`` with its shardings; under
    pmap, of ``shard_map`` around the step)."""
    from isojax.data.glue import glue_task
    from isojax.models import build_encoder, init_params
    from isojax.softdecay import SoftDecay
    from isojax.train import loop
    from isojax.train.config import (
        MethodConfig,
        MethodName,
        ModelConfig,
        OptimConfig,
        PlacementConfig,
        TaskConfig,
        TrainConfig,
    )
    from isojax.train.model import TaskModel, init_variables, make_flow
    from isojax.train.objective import data_references
    from isojax.train.state import create_state
    from isojax.train.tasks.classification import ClassificationRecipe

    config = TrainConfig(
        task=TaskConfig("rte", max_length=8),
        model=ModelConfig("tiny", dtype=dtype, scan_layers=True, remat=remat),
        method=MethodConfig(typing.cast(MethodName, method)),
        optim=OptimConfig(batch_size=8, steps=4),
        placement=PlacementConfig(**TRAIN_LAYOUTS[layout]),
    )
    spec = config.method_spec
    cfg = dataclasses.replace(tiny_config("bert"), hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    encoder = build_encoder(
        cfg,
        dtype=jnp.dtype(dtype),
        scan_layers=True,
        remat=remat,
        transform_placement=config.method.softdecay_placement,
        last_layer_transform=SoftDecay(alpha_init=config.method.softdecay_alpha) if spec.softdecay else None,
    )
    model = TaskModel(
        encoder,
        num_labels=glue_task(config.task.name).num_labels,
        pooling=config.model.pooling,
        dropout_rate=0.1,
        use_isobn=spec.isobn,
        use_isotropy_layer=spec.isotropy_layer,
        flow=make_flow(config),
    )
    rows = np.random.default_rng(0).standard_normal((16, cfg.hidden_size)).astype(np.float32)
    variables = init_variables(
        model, init_params(encoder, jax.random.key(0)), jax.random.key(1), rows if spec.flow else None
    )
    recipe = ClassificationRecipe(config)
    regs = [reg for stage in config.stages() for reg in stage.regularizers]
    references = data_references(regs, lambda name: jnp.eye(cfg.hidden_size))
    total = loop.stage_steps(config, per_epoch=1)[0]
    optimizer, _, runner, _ = loop.stage_runner(
        config, recipe, model, variables, references, config.stages()[0], start=0, total=total
    )
    state = create_state(variables, optimizer, config.seed)
    ids = _ids(8, 8)
    batch = {
        "input_ids": ids,
        "attention_mask": jnp.ones_like(ids),
        "token_type_ids": jnp.zeros_like(ids),
        "labels": jnp.asarray(np.arange(8) % 2, jnp.int32),
    }
    return runner.train_step, (runner.place(state), runner.device_batch(batch))


def train_entries(methods=None, layouts=tuple(TRAIN_LAYOUTS)) -> list[Entry]:
    """Every fine-tuning method's train step in every layout that fits the devices this process sees."""
    from isojax.train.methods import METHODS

    layouts = [layout for layout in layouts if TRAIN_LAYOUTS[layout]["devices"] <= jax.device_count()]
    return [
        Entry(
            "train",
            f"train step {m} ({layout}; bf16, scan, remat full)",
            lambda m=m, layout=layout: train_step(m, layout),
            round_trip=False,
        )
        for m in (methods or METHODS)
        for layout in layouts
    ]


GROUPS = {
    "spectral": spectral_entries,
    "functions": function_entries,
    "models": model_entries,
    "generate": generate_entries,
    "train": train_entries,
}


# --------------------------------------------------------------------------------------------------- report


def write(rows: list[dict], platforms, out_dir: str, meta: dict, stem: str = "lowering") -> str:
    """``STEM.{json,md}`` in ``out_dir``; returns the Markdown."""
    counts = {
        s: sum(1 for r in rows for c in r.get("cells", {}).values() if c["status"] == s)
        for s in ("lowers", "refused", "fails")
    }
    build_errors = [r for r in rows if "build_error" in r]
    payload = {"provenance": meta, "platforms": list(platforms), "counts": counts, "rows": rows}
    write_json(Path(out_dir, f"{stem}.json"), payload)
    table = [
        [
            r["group"],
            r["name"],
            *(cell_text(r["cells"][p]) for p in platforms),
            (
                f"{r['round_trip_max_abs_diff']:.1e}"
                if "round_trip_max_abs_diff" in r
                else r.get("round_trip_error", "–")
            ),
        ]
        for r in rows
        if "cells" in r
    ]
    md = "\n\n".join(
        [
            "# Lowering matrix: every entry point exported per platform by the compiler",
            "\n".join(f"- {k}: `{v}`" if k in ("command", "commit") else f"- {k}: {v}" for k, v in meta.items()),
            __doc__.split("\n\n", 2)[2].split("Writes ``lowering")[0].strip(),
            f"Cells: {counts['lowers']} lower, {counts['refused']} refused, {counts['fails']} fail inside JAX"
            + (
                f"; {len(build_errors)} entries could not be built: "
                + "; ".join(f"{r['name']}: {r['build_error']}" for r in build_errors)
                if build_errors
                else ""
            )
            + ".",
            markdown_table(
                ["group", "entry point", *platforms, f"{meta.get('round_trip', 'cpu')} round trip (max abs diff)"],
                table,
            ),
        ]
    )
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(md + "\n")
    return md


def run(
    groups=None,
    platforms=PLATFORMS,
    out_dir: str = RESULTS,
    log=print,
    stem: str = "lowering",
    meta: dict | None = None,
) -> dict:
    """Every entry of ``groups`` (default all) exported for ``platforms``; writes ``out_dir/STEM.{md,json}`` and returns the
    JSON's content."""
    from isojax.spectral import current_platform

    rows = []
    for group in groups or list(GROUPS):
        for entry in GROUPS[group]():
            row = run_entry(entry, platforms)
            rows.append(row)
            log(
                f"{entry.group:9s} {entry.name}: "
                + (row.get("build_error") or " | ".join(f"{p} {row['cells'][p]['status']}" for p in platforms))
            )
    os.makedirs(out_dir, exist_ok=True)
    meta = {**(meta or provenance("lowering")), "round_trip": current_platform()}
    write(rows, platforms, out_dir, meta, stem)
    with open(os.path.join(out_dir, f"{stem}.json")) as f:
        return json.load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated of {list(GROUPS)}")
    ap.add_argument("--platforms", default=",".join(PLATFORMS))
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    rows = run(args.groups.split(","), args.platforms.split(","), args.out)["rows"]
    fails = [(r["name"], p) for r in rows for p, c in r.get("cells", {}).items() if c["status"] == "fails"]
    print(f"{len(fails)} cells fail inside JAX" + (": " + ", ".join(f"{n} on {p}" for n, p in fails) if fails else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
