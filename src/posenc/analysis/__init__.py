"""See and check any positional scheme: the positional kernel, property checks, plots, the report.

Everything works through the hooks (``embed`` / ``rotate`` / ``score_bias``) and the registry,
never by scheme name, so a newly registered scheme is analysed like the built-in ones. Plots and
the report need matplotlib (``pip install posenc[viz]``) and are imported lazily.

Legend: ``h`` heads, ``m`` query positions, ``n`` key positions, ``s`` positions, ``d`` width.
"""

from .claims import Claim, common_claims, study_claims
from .kernel import (
    DEFAULT_CONTEXT,
    Probe,
    display_kernel,
    encodings,
    kernel_curve,
    make_probe,
    positional_kernel,
    rotation_frequencies,
)
from .properties import (
    PROPERTIES,
    PropertyResult,
    check,
    fit_shift_map,
    roformer_bound,
    scheme_frequencies,
    verify,
)

__all__ = [
    "DEFAULT_CONTEXT",
    "PROPERTIES",
    "Claim",
    "Probe",
    "PropertyResult",
    "check",
    "common_claims",
    "display_kernel",
    "encodings",
    "fit_shift_map",
    "kernel_curve",
    "make_probe",
    "positional_kernel",
    "roformer_bound",
    "rotation_frequencies",
    "scheme_frequencies",
    "study_claims",
    "verify",
]
