import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Tiny models on a shared, loaded machine run many times faster on one intra-op thread
    (two spinning OpenMP threads fight the other processes for the cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
