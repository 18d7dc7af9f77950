"""Precision helpers: positional tables are computed with autocast off, in float32 or better."""

from __future__ import annotations

import contextlib

import torch


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """A context that disables autocast on ``device`` (a no-op where autocast does not exist, e.g. meta)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()
