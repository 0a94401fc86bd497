"""Post-hoc isotropy calibration: whitening, centering / all-but-the-top, flow calibration, IsoBN, Isotropy Layer.

Fit/apply pairs are pure functions of arrays and an explicit fitted state (``fit_whitening`` -> ``whiten``,
``fit_all_but_the_top`` -> ``all_but_the_top(..., state=)``, ``fit_flow`` -> ``flow_forward`` / ``flow_inverse``);
``Flow`` (the flow trained during fine-tuning), ``IsoBN`` and ``IsotropyLayer`` are Linen modules.

Conventions as in :mod:`isojax.metrics`: plain functions that the caller jits (integer settings such as ``k``,
``D`` and ``steps`` and string modes static; float settings such as ``eps`` of :func:`fit_whitening` and
``learning_rate`` of :func:`fit_flow` traced, a traced value out of range giving NaN). :func:`fit_flow` is the
exception that compiles itself: its whole training loop is one jitted ``lax.scan``. ``x`` is ``[..., n, d]``
with an optional ``mask [..., n]`` (true = real row) that selects the rows the statistics are estimated from,
while a transform is applied to every row; leading axes are independent fits (:func:`fit_flow` pools them).
"""

from isojax.calibrate.centering import TopDirections, all_but_the_top, center, fit_all_but_the_top, scaled_center
from isojax.calibrate.flow import Flow, FlowState, fit_flow, flow_forward, flow_inverse, scale_lu_updates
from isojax.calibrate.isobn import IsoBN, isobn_scale
from isojax.calibrate.isotropy_layer import IsotropyLayer
from isojax.calibrate.whitening import WhiteningState, fit_whitening, whiten

__all__ = [
    "Flow",
    "FlowState",
    "IsoBN",
    "IsotropyLayer",
    "TopDirections",
    "WhiteningState",
    "all_but_the_top",
    "center",
    "fit_all_but_the_top",
    "fit_flow",
    "fit_whitening",
    "flow_forward",
    "flow_inverse",
    "isobn_scale",
    "scale_lu_updates",
    "scaled_center",
    "whiten",
]
