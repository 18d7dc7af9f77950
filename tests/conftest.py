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
