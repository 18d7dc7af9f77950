"""See and check any positional scheme: the positional kernel, property checks, plots, the report.

Everything works through the hooks (``embed`` / ``rotate`` / ``score_bias``) and the registry,
never by scheme name, so a newly registered scheme is analysed like the built-in ones. Plots and
the report need matplotlib (``pip install posenc[viz]``) and are imported lazily.

Names load on first use, so importing this package (as the command line does to read its
arguments) does not import torch.

Legend: ``h`` heads, ``m`` query positions, ``n`` key positions, ``s`` positions, ``d`` width.
"""

from __future__ import annotations

from .._lazy import lazy_attributes

#: public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "Claim": "claims",
    "common_claims": "claims",
    "study_claims": "claims",
    "DEFAULT_CONTEXT": "context",
    "Probe": "kernel",
    "display_kernel": "kernel",
    "encodings": "kernel",
    "kernel_curve": "kernel",
    "make_probe": "kernel",
    "positional_kernel": "kernel",
    "rotation_frequencies": "kernel",
    "PROPERTIES": "measures",
    "PropertyResult": "properties",
    "check": "properties",
    "verify": "properties",
    "fit_shift_map": "spectrum",
    "roformer_bound": "spectrum",
    "scheme_frequencies": "spectrum",
}

__all__ = sorted(_EXPORTS)


#: submodules reachable as attributes (``posenc.analysis.properties``), imported on first use
_SUBMODULES = (
    "claims",
    "commands",
    "context",
    "embeddings",
    "explore",
    "input_layer",
    "interactive",
    "kernel",
    "measures",
    "page",
    "plots",
    "properties",
    "report",
    "sections",
    "spectrum",
    "trained",
)


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, _SUBMODULES)
