"""Tests of posenc._alloc: factory_kwargs checks device and dtype, available_memory reads what is
free, and check_allocation refuses a table that cannot fit before allocating it (the library's
entry points raise InsufficientMemoryError, a ValueError, naming the sizes and the fix)."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import _alloc
from posenc._alloc import InsufficientMemoryError, available_memory, check_allocation, factory_kwargs


def test_insufficient_memory_is_a_memory_and_a_value_error():
    assert issubclass(InsufficientMemoryError, MemoryError)
    assert issubclass(InsufficientMemoryError, ValueError)  # the CLI reports it as a bad configuration


def test_factory_kwargs():
    assert factory_kwargs() == {"device": None, "dtype": None}
    assert factory_kwargs("cpu", torch.bfloat16) == {"device": torch.device("cpu"), "dtype": torch.bfloat16}
    assert factory_kwargs(torch.device("meta"))["device"] == torch.device("meta")
    with pytest.raises(TypeError, match=r"device must be a torch\.device or a string like 'cpu', got float"):
        factory_kwargs(1.5)
    with pytest.raises(ValueError, match=r"device 'gpu0' is not a device; use e\.g\. 'cpu'"):
        factory_kwargs("gpu0")
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch.dtype .*torch.int64"):
        factory_kwargs(None, torch.int64)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        factory_kwargs(None, "float32")


def test_available_memory_of_the_cpu_is_a_positive_byte_count():
    free = available_memory("cpu")
    assert type(free) is int and free > 0


def test_check_allocation_compares_the_bytes_with_the_free_memory(monkeypatch):
    monkeypatch.setattr(_alloc, "available_memory", lambda device: 2**20)  # 1 MiB free
    check_allocation((1024, 128), torch.float32, "n=1024", "use less", device="cpu")  # 512 KiB: fits
    with pytest.raises(
        InsufficientMemoryError,
        match=r"n=1024 needs a \[1024, 256\] table of about 1.0 MiB, but only 1.0 MiB is free on cpu; "
        r"use less",
    ):
        check_allocation((1024, 256), torch.float32, "n=1024", "use less", device="cpu")  # > 90% of free
    check_allocation((1024, 256), torch.float32, "n", "fix", device="cpu", headroom=1.0)  # exactly all
    check_allocation((1024, 256), torch.float16, "n", "fix", device="cpu")  # half the bytes
    with torch.device("meta"):  # the default device: nothing is allocated, nothing checked
        check_allocation((2**40, 2**10), None, "n", "fix")
    with pytest.raises(InsufficientMemoryError, match=r"about 2.00 GiB, but only 1.0 MiB"):
        check_allocation((2**29,), None, "n", "fix", device="cpu")  # None: the default dtype (float32)


def test_sizes_are_refused_before_allocating():
    """One estimate-and-refuse mechanism: a ValueError (InsufficientMemoryError) in the library,
    before any of the memory is touched; the meta device allocates nothing and is not checked."""
    import time

    from posenc._alloc import InsufficientMemoryError
    from posenc.model import ModelConfig, TransformerLM

    t0 = time.perf_counter()
    with pytest.raises(InsufficientMemoryError, match=r"max_len=1099511627776, d_model=512 needs a"):
        posenc.build("learned", d_model=512, max_len=2**40)
    with pytest.raises(ValueError, match=r"vocab_size=1099511627776, d_model=8 needs .* GiB is free"):
        posenc.InputEmbedding(vocab_size=2**40, d_model=8)
    with pytest.raises(ValueError, match="a model with d_model=1048576, num_layers=4, vocab_size=256"):
        TransformerLM(ModelConfig(vocab_size=256, d_model=2**20, num_layers=4, num_heads=4))
    assert time.perf_counter() - t0 < 5
    with torch.device("meta"):
        assert posenc.build("learned", d_model=512, max_len=2**40).weight.shape == (2**40, 512)
