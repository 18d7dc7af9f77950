"""Shared test settings: deterministic seeds and a hypothesis profile sized for 2 CPU cores."""

import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("posenc", deadline=None, max_examples=40, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "posenc"))

torch.set_num_threads(1)  # pytest-xdist runs one worker per core


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fast_paths_from_the_environment():
    """Each test decides from POSENC_C_KERNELS afresh (the switch is read once per process, as in
    a new process); a test that flips it mid-way calls posenc.kernels.set_enabled."""
    from posenc.kernels import set_enabled

    set_enabled(None)
    yield
    set_enabled(None)
