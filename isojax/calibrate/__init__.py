"""Post-hoc isotropy calibration: whitening, centering / all-but-the-top, flow calibration, IsoBN, Isotropy Layer.

Fit/apply pairs are pure functions of arrays and an explicit fitted state (``fit_whitening`` -> ``whiten``,
``fit_all_but_the_top`` -> ``all_but_the_top(..., state=)``, ``fit_flow`` -> ``flow_forward`` / ``flow_inverse``);
``IsoBN`` and ``IsotropyLayer`` are Linen modules.
"""
from isojax.calibrate.centering import TopDirections, all_but_the_top, center, fit_all_but_the_top, scaled_center
from isojax.calibrate.flow import FlowState, fit_flow, flow_forward, flow_inverse
from isojax.calibrate.isobn import IsoBN, isobn_scale
from isojax.calibrate.isotropy_layer import IsotropyLayer
from isojax.calibrate.whitening import WhiteningState, fit_whitening, whiten

__all__ = [
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
    "scaled_center",
    "whiten",
]
