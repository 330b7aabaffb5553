import warnings
from contextlib import contextmanager

import pytest
import torch

from attnlab.training.setup import precision


@pytest.fixture
def cpu_features(monkeypatch):
    """Stand in for torch's CPU feature table (the probe is cached: cleared around the test)."""
    precision._cpu_native_bf16.cache_clear()
    yield lambda features: monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: features)
    precision._cpu_native_bf16.cache_clear()


@pytest.fixture
def cuda_capability(monkeypatch):
    """Stand in for a CUDA GPU of the given compute capability: `cuda_capability((8, 0))`."""
    def set_capability(capability: tuple[int, int]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    return set_capability


@contextmanager
def no_warnings():
    """The block must not warn: any warning raised in it fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
