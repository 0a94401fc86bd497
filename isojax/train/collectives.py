"""How one device's share of a training step sees the global batch.

The objective is written once, as a function of the batch it is given. Run under ``jit`` on a device mesh
(or on one device) it is given the *global* batch, with arrays sharded by XLA, and needs no collectives:
:data:`GLOBAL`. Run under ``pmap`` each device holds ``b = B / D`` rows, and :class:`AxisCollectives`
makes every quantity of the objective take its global value on every device while its gradient keeps only
that device's contribution, so that ``psum`` of the per-device gradients is the gradient of the global
objective (and the losses match the mesh path):

* ``total(s)``      local sum -> global sum:         ``s + stop_gradient(psum(s) - s)``;
* ``gather(x)``     local rows -> all ``B`` rows:    ``all_gather(stop_gradient(x))`` with the device's own
  block put back un-stopped; a whole-batch regulariser (IsoScore of the batch's [CLS] vectors, persistent
  entropy) is thus computed on the global batch, as on the mesh;
* ``replicated(v)`` a value every device computes identically from the parameters alone (a regulariser of
  the embedding matrix): value ``v``, gradient ``grad v / D``.

These rules hold for objectives that are *linear* in the gathered/total terms' gradients, i.e. a weighted
sum of terms with weights that carry no gradient (the task loss, regularisers, the joint-loss balancer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax


class Collectives:
    """The whole batch is on hand (single device, or ``jit`` over a mesh): every rule is the identity."""

    size: int = 1
    axis_name: str | None = None

    def total(self, x):
        return x

    def gather(self, x):
        return x

    def replicated(self, x):
        return x

    def device_key(self, key):
        """The dropout key of this device's rows: the step key itself (XLA shards the global draws)."""
        return key

    def reduce_gradients(self, grads):
        return grads


GLOBAL = Collectives()


@dataclasses.dataclass(frozen=True)
class AxisCollectives(Collectives):
    """Inside ``pmap(..., axis_name=axis_name)`` over ``size`` devices (rules in the module docstring)."""

    axis_name: str
    size: int

    def total(self, x):
        return x + lax.stop_gradient(lax.psum(x, self.axis_name) - x)

    def gather(self, x):
        x = jnp.asarray(x)
        blocks = lax.all_gather(lax.stop_gradient(x), self.axis_name)  # [size, b, ...]
        blocks = lax.dynamic_update_index_in_dim(blocks, x, lax.axis_index(self.axis_name), 0)
        return blocks.reshape((-1,) + x.shape[1:])

    def replicated(self, x):
        return x / self.size + lax.stop_gradient(x - x / self.size)

    def device_key(self, key):
        """Each device draws dropout masks for its own rows from ``fold_in(key, device index)``."""
        return jax.random.fold_in(key, lax.axis_index(self.axis_name))

    def reduce_gradients(self, grads):
        return lax.psum(grads, self.axis_name)
