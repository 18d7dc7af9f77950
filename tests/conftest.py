"""Shared test settings: deterministic seeds and a hypothesis profile sized for 2 CPU cores."""

import os
import sys

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


@pytest.fixture(autouse=True)
def _compiled_code_forgotten():
    """torch.compile keeps its compiled variants per code object for the whole process, up to a
    limit of 8 (then ``fullgraph=True`` fails): every test that compiles starts from an empty cache,
    as in a new process, whatever ran before it in the same worker."""
    yield
    if "torch._dynamo" in sys.modules:  # something compiled (or imported the compiler)
        torch.compiler.reset()
