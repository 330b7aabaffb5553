"""The suite's `--device` option (tests/conftest.py): cpu by default, the `device` fixture follows
it, every test that takes the fixture is marked `device` (so `-m device` selects exactly those),
and `--device cuda` without a GPU stops the run with the fix instead of failing each test."""

import pytest
import torch

from tests import conftest


def test_the_fixture_follows_the_option_and_marks_its_test(device, request):
    assert device == torch.device(request.config.getoption("--device"))
    assert request.node.get_closest_marker("device") is not None


def test_a_test_without_the_fixture_is_not_marked(request):
    assert request.node.get_closest_marker("device") is None


class _Config:
    """What the hooks read of pytest's config: the --device value and the markers added."""

    def __init__(self, device: str):
        self.device, self.lines = device, []

    def getoption(self, name: str) -> str:
        assert name == "--device"
        return self.device

    def addinivalue_line(self, name: str, line: str) -> None:
        self.lines.append((name, line))


class _Item:
    def __init__(self, *fixturenames: str):
        self.fixturenames, self.marks = fixturenames, []

    def add_marker(self, mark) -> None:
        self.marks.append(mark.name)


def test_minus_m_device_selects_exactly_the_tests_that_take_the_fixture():
    items = [_Item("tmp_path", "device"), _Item("tmp_path"), _Item()]
    conftest.pytest_collection_modifyitems(_Config("cpu"), items)
    assert [item.marks for item in items] == [["device"], [], []]


def test_device_cuda_without_a_gpu_stops_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = _Config("cuda")
    with pytest.raises(pytest.UsageError, match=r"--device cuda: no CUDA device is available.*--device cpu"):
        conftest.pytest_configure(config)
    assert config.lines[0][0] == "markers" and config.lines[0][1].startswith("device:")
    conftest.pytest_configure(_Config("cpu"))  # the default needs nothing
