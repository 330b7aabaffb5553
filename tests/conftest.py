import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """An empty $ATTNLAB_CACHE under tmp_path, and torch's thread count restored afterwards
    (runs may set train.threads)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield tmp_path / "cache"
    torch.set_num_threads(threads)
