"""scikit-learn's digits from a PyPI wheel (no network here: pip is replaced by a fake that
writes a wheel), the stratified split and the random shift."""

import gzip
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from attnlab.data import images as images_module
from attnlab.data.images import (DIGITS, digits_file, load_digits, random_shift, read_digits_csv,
                                 stratified_split)
from attnlab.io import downloads
from attnlab.io.downloads import DownloadError, PackageFiles

MEMBER = "sklearn/datasets/data/digits.csv.gz"


def _csv(rows: list[list[int]]) -> bytes:
    return gzip.compress("".join(",".join(map(str, r)) + "\n" for r in rows).encode())


def _fake_rows(n: int = 12) -> list[list[int]]:
    """n images: image k has pixel i = (k + i) % 17, label k % 10."""
    return [[(k + i) % 17 for i in range(64)] + [k % 10] for k in range(n)]


@pytest.fixture
def fake_pypi(isolated_cache, monkeypatch):
    """`pip download` replaced by a fake that writes a wheel holding a fake digits file, whose
    sha256 the spec records; returns the list of pip calls."""
    data = _csv(_fake_rows())
    spec = PackageFiles(DIGITS.name, DIGITS.requirement, {MEMBER: ("digits.csv.gz", hashlib.sha256(data).hexdigest())},
                        subdir=DIGITS.subdir)
    monkeypatch.setattr(images_module, "DIGITS", spec)
    calls = []

    def fake_pip(args):
        calls.append(args)
        dest = Path(args[args.index("--dest") + 1])
        with zipfile.ZipFile(dest / "scikit_learn-1.7.2-cp311-cp311-manylinux_2_17_x86_64.whl", "w") as wheel:
            wheel.writestr(MEMBER, data)
        return subprocess.CompletedProcess(args, 0, stdout="", stderr="")

    monkeypatch.setattr(downloads, "run_pip", fake_pip)
    return calls


def test_load_digits_reads_scales_and_caches(fake_pypi, isolated_cache):
    images, labels = load_digits()
    rows = torch.tensor(_fake_rows(), dtype=torch.float32)
    assert images.shape == (12, 1, 8, 8) and images.dtype == torch.float32
    assert torch.equal(images.flatten(1), rows[:, :64] / 16)  # row-major pixels, 16 grey levels -> [0, 1]
    assert labels.dtype == torch.long and labels.tolist() == [k % 10 for k in range(12)]
    assert fake_pypi[0][-1] == "scikit-learn==1.7.2"  # the pinned wheel, downloaded, not installed
    assert digits_file() == isolated_cache / "datasets" / "digits" / "digits.csv.gz"
    load_digits()
    assert len(fake_pypi) == 1  # the verified cache is used, pip is not called again


def test_a_wheel_whose_file_differs_is_refused(isolated_cache, monkeypatch, tmp_path):
    wheel = tmp_path / "scikit_learn-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, _csv(_fake_rows()))  # not the real file: its hash differs from the recorded one
    monkeypatch.setattr(downloads, "run_pip", lambda args: pytest.fail("pip should not run"))
    with pytest.raises(DownloadError, match="sha256 .* differs from the recorded 09f66e6d"):
        load_digits(wheel=wheel)
    assert not (isolated_cache / "datasets" / "digits").exists()


def test_pip_failure_names_the_requirement(isolated_cache, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found")
    monkeypatch.setattr(downloads, "run_pip", lambda args: failed)
    with pytest.raises(DownloadError, match=r"scikit-learn==1\.7\.2.*No matching distribution"):
        load_digits()


@pytest.mark.parametrize("line,words", [
    ("1,2,3", "line 2: expected 65 numbers"),
    (",".join(["0"] * 64 + ["x"]), "line 2: expected 65 comma-separated numbers"),
    (",".join(["17"] + ["0"] * 63 + ["1"]), "line 2: pixels must lie in 0..16"),
    (",".join(["0"] * 64 + ["10"]), "line 2: the label (last number) must be an integer 0..9"),
])
def test_a_malformed_file_names_the_line(tmp_path, line, words):
    path = tmp_path / "digits.csv"
    path.write_text(",".join(["0"] * 64 + ["3"]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"digits.csv: {words}".replace("(", r"\(").replace(")", r"\)")):
        read_digits_csv(path)


def test_an_empty_file_is_an_error(tmp_path):
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(ValueError, match="no images"):
        read_digits_csv(tmp_path / "empty.csv")


# ---- the split ---------------------------------------------------------------------------------

def test_the_split_is_stratified_disjoint_complete_and_seeded():
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate([50, 31, 7, 100])])[torch.randperm(188)]
    train, test = stratified_split(labels, 0.2, seed=4)
    assert sorted(torch.cat([train, test]).tolist()) == list(range(188))  # every index once
    for c, n in enumerate([50, 31, 7, 100]):
        assert int((labels[test] == c).sum()) == round(n * 0.2)
    again_train, again_test = stratified_split(labels, 0.2, seed=4)
    assert torch.equal(again_test, test) and torch.equal(again_train, train)
    assert not torch.equal(stratified_split(labels, 0.2, seed=5)[1], test)


@pytest.mark.parametrize("fraction", [0, 1, 1.5])
def test_the_split_refuses_a_fraction_outside_0_1(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_split(torch.arange(10), fraction)


# ---- the random shift --------------------------------------------------------------------------

def _shifted(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Reference: pixel (y, x) of the output is input (y - dy, x - dx), zero outside."""
    out = torch.zeros_like(image)
    H, W = image.shape[-2:]
    for y in range(H):
        for x in range(W):
            if 0 <= y - dy < H and 0 <= x - dx < W:
                out[..., y, x] = image[..., y - dy, x - dx]
    return out


def test_each_image_is_shifted_by_whole_pixels_within_the_range():
    images = torch.rand(40, 2, 5, 6) + 0.1  # no zero pixel: a shift is told apart from every other
    out = random_shift(images, 1, torch.Generator().manual_seed(0))
    found = set()
    for k in range(len(images)):
        hits = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if torch.equal(out[k], _shifted(images[k], dy, dx))]
        assert len(hits) == 1, k
        found.add(hits[0])
    assert len(found) == 9  # every offset in [-1, 1]^2 occurs among 40 draws
    assert random_shift(images, 0, torch.Generator()) is images


@pytest.mark.slow
def test_the_real_digits(isolated_cache):
    """The pinned wheel from PyPI: the recorded hash matches, and the set is scikit-learn's
    (1,797 images, 10 classes of 174 to 183, full ink somewhere)."""
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and float(images.min()) == 0.0 and float(images.max()) == 1.0
    counts = torch.bincount(labels).tolist()
    assert counts == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
