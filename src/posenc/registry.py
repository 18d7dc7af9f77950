"""Scheme name -> scheme class: list, describe and build any positional scheme by name.

One entry per scheme in :data:`SCHEMES` (a registry, never a chain of flags). Unknown names and
unknown configuration keys raise ``ValueError`` listing the valid ones::

    >>> import posenc
    >>> posenc.schemes()[:3]
    ['nope', 'sinusoidal', 'scaled_sinusoidal']
    >>> pe = posenc.build("sinusoidal", d_model=512)

A model that takes "any scheme" builds it with :func:`build_with_context`: it offers what it
knows (``d_model``, ``num_heads``, ``head_dim``, ``max_len``) and each scheme takes only the
keys its constructor declares.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from ._alloc import factory_kwargs
from ._validate import did_you_mean
from .absolute import LearnedPE, NoPE, ScaledSinusoidalPE, SinusoidalPE
from .absolute_nd import Sinusoidal2D, Sinusoidal3D
from .base import PositionalScheme
from .bias import ALiBi, T5RelativeBias
from .cope import CoPE
from .fire import FIRE
from .kerple import KerpleLog, KerplePower
from .relative import ShawRelative, TransformerXLRelative
from .rotary.modules import RotaryEmbedding
from .rotary.mrope import MultimodalRope
from .rotary.variants import Rope2D, XPos
from .temperature import QueryTemperature

__all__ = [
    "SCHEMES",
    "build",
    "build_with_context",
    "config_keys",
    "describe",
    "register",
    "scheme_class",
    "schemes",
]

SCHEMES: dict[str, type[PositionalScheme]] = {}

#: keys every :func:`build` takes besides a scheme's own: where and in which dtype its parameters live
FACTORY_KEYS = ("device", "dtype")


def register(cls: type[PositionalScheme], *, name: str | None = None) -> type[PositionalScheme]:
    """Add a scheme class to the registry under ``name`` (default ``cls.name``).

    Users may register their own schemes; they then work everywhere a name is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, PositionalScheme)):
        raise TypeError(f"register takes a PositionalScheme subclass, got {cls!r}")
    key = name or cls.name
    if not key or key != key.lower() or " " in key:
        raise ValueError(f"scheme names are short lowercase strings without spaces, got {key!r}")
    SCHEMES[key] = cls
    return cls


_BUILTIN = (
    NoPE, SinusoidalPE, ScaledSinusoidalPE, LearnedPE, Sinusoidal2D, Sinusoidal3D,  # absolute(_nd).py
    RotaryEmbedding, XPos, Rope2D,  # rotary.py
    MultimodalRope,  # rotary/mrope.py
    ALiBi, T5RelativeBias,  # bias.py
    ShawRelative, TransformerXLRelative,  # relative.py
    FIRE,  # fire.py
    KerpleLog, KerplePower,  # kerple.py
    CoPE,  # cope.py
    QueryTemperature,  # temperature.py
)  # fmt: skip
for _cls in _BUILTIN:
    register(_cls)


def schemes() -> list[str]:
    """The registered scheme names, in registration order."""
    return list(SCHEMES)


def scheme_class(name: str) -> type[PositionalScheme]:
    """The class registered under ``name``; ``ValueError`` listing the valid names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"scheme name must be a str, got {type(name).__name__} ({name!r})")
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheme {name!r}; valid schemes: {', '.join(SCHEMES)}" + did_you_mean(name, SCHEMES)
        ) from None


def config_keys(name: str) -> dict[str, Any]:
    """The configuration keys of scheme ``name`` with their defaults (``inspect.Parameter.empty``
    for required keys)."""
    params = inspect.signature(scheme_class(name).__init__).parameters
    return {
        k: p.default
        for k, p in params.items()
        if k != "self" and k not in FACTORY_KEYS and p.kind is not p.VAR_KEYWORD
    }


def describe(name: str) -> dict[str, Any]:
    """Name, hooks, one-line summary and configuration keys of scheme ``name``."""
    cls = scheme_class(name)
    keys = config_keys(name)
    return {
        "name": name,
        "hooks": list(cls.hooks),
        "summary": cls.summary,
        "causal": cls.causal_ok,
        "required": [k for k, v in keys.items() if v is inspect.Parameter.empty],
        "optional": {k: v for k, v in keys.items() if v is not inspect.Parameter.empty},
    }


def build(name: str, **config: Any) -> PositionalScheme:
    """Build scheme ``name`` from its configuration.

    Args:
        name: a name from :func:`schemes`.
        **config: the scheme's constructor arguments, e.g. ``d_model`` for absolute schemes and
            ``max_len`` for learned ones; and, for every scheme, the factory kwargs ``device`` and
            ``dtype`` (as ``nn.Linear``'s): where and in which floating dtype its parameters are
            made. Schemes without parameters (sinusoidal, rope, alibi) hold nothing to place and
            compute in the dtype of their inputs.

    Raises:
        ValueError: unknown name (lists the valid ones), unknown key (lists the scheme's keys),
            or a missing required key.
    """
    keys = config_keys(name)
    factory = factory_kwargs(config.pop("device", None), config.pop("dtype", None))
    unknown = sorted(set(config) - set(keys))
    if unknown:
        hint = "".join(did_you_mean(k, (*keys, *FACTORY_KEYS)) for k in unknown)
        raise ValueError(
            f"unknown config key(s) {unknown} for scheme {name!r}; valid keys: "
            f"{', '.join((*keys, *FACTORY_KEYS))}{hint}"
        )
    missing = [k for k, v in keys.items() if v is inspect.Parameter.empty and k not in config]
    if missing:
        raise ValueError(
            f"scheme {name!r} needs {', '.join(missing)}; e.g. posenc.build({name!r}, "
            + ", ".join(f"{k}=..." for k in missing)
            + ")"
        )
    cls = scheme_class(name)
    takes = inspect.signature(cls.__init__).parameters
    if all(k in takes for k in FACTORY_KEYS):
        return cls(**config, **factory)
    # a scheme without factory kwargs (a user's): made under the device, then cast
    with torch.device(factory["device"]) if factory["device"] is not None else contextlib.nullcontext():
        scheme = cls(**config)
    return scheme if factory["dtype"] is None else scheme.to(factory["dtype"])


def build_with_context(
    name: str, context: dict[str, Any], config: dict[str, Any] | None = None
) -> PositionalScheme:
    """Build scheme ``name`` inside a model.

    Args:
        name: a name from :func:`schemes`.
        context: what the model knows (``d_model``, ``num_heads``, ``head_dim``, ``max_len``, ...);
            each key is passed only if the scheme's constructor takes it and ``config`` does not set it.
        config: the user's scheme options; unknown keys raise as in :func:`build`.
    """
    config = dict(config or {})
    keys = config_keys(name)
    for key, value in context.items():
        if key in keys and key not in config:
            config[key] = value
    return build(name, **config)
