"""Post-hoc isotropy calibration: whitening, centering / all-but-the-top, flow calibration, IsoBN, Isotropy Layer.

Every calibration fitted on data is a pair of pure functions with one naming scheme:
``fit_<name>(x, *, mask=None, ...) -> <Name>State`` estimates the statistics and
``apply_<name>(state, x, ...)`` transforms any rows with them (the state first, as in Flax's
``module.apply(variables, x)``): :func:`fit_centering` / :func:`apply_centering`, :func:`fit_all_but_the_top` /
:func:`apply_all_but_the_top`, :func:`fit_whitening` / :func:`apply_whitening`, :func:`fit_flow` /
:func:`apply_flow` (and :func:`invert_flow`). :func:`center`, :func:`scaled_center` and :func:`all_but_the_top`
fit on ``x`` and transform ``x`` in one call. ``Flow`` (the flow trained during fine-tuning), ``IsoBN`` and
``IsotropyLayer`` are Linen modules (Flax's ``init`` / ``apply``).

Conventions as in :mod:`isojax.metrics`: plain functions that the caller jits (integer settings such as ``k``,
``D`` and ``steps`` and string modes static; float settings such as ``eps`` of :func:`fit_whitening` and
``learning_rate`` of :func:`fit_flow` traced, a traced value out of range giving NaN). :func:`fit_flow` is the
exception that compiles itself: its whole training loop is one jitted ``lax.scan``. ``x`` is ``[..., n, d]``
with an optional ``mask [..., n]`` (true = real row) that selects the rows the statistics are estimated from,
while a transform is applied to every row; leading axes are independent fits (:func:`fit_flow` pools them).
"""

from isojax.calibrate.centering import (
    AllButTheTopState,
    CenteringState,
    all_but_the_top,
    apply_all_but_the_top,
    apply_centering,
    center,
    fit_all_but_the_top,
    fit_centering,
    scaled_center,
)
from isojax.calibrate.flow import Flow, FlowState, apply_flow, fit_flow, invert_flow, scale_lu_updates
from isojax.calibrate.isobn import IsoBN, isobn_scale
from isojax.calibrate.isotropy_layer import IsotropyLayer
from isojax.calibrate.whitening import WhiteningState, apply_whitening, fit_whitening

__all__ = [
    "AllButTheTopState",
    "CenteringState",
    "Flow",
    "FlowState",
    "IsoBN",
    "IsotropyLayer",
    "WhiteningState",
    "all_but_the_top",
    "apply_all_but_the_top",
    "apply_centering",
    "apply_flow",
    "apply_whitening",
    "center",
    "fit_all_but_the_top",
    "fit_centering",
    "fit_flow",
    "fit_whitening",
    "invert_flow",
    "isobn_scale",
    "scale_lu_updates",
    "scaled_center",
]
