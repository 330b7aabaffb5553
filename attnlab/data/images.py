"""Images for the vision models: scikit-learn's 8 x 8 handwritten digits, fetched from PyPI.

The digits (1,797 images, 10 classes, 16 grey levels; the UCI "optical recognition of handwritten
digits" test set, BSD-licensed) ship inside every scikit-learn wheel as
`sklearn/datasets/data/digits.csv.gz`. `load_digits` takes that one file out of a pinned wheel
(`pip download --no-deps`, nothing installed), checks its sha256 and caches it as
`$ATTNLAB_CACHE/datasets/digits/digits.csv.gz` (attnlab.io.downloads), so scikit-learn itself is
never imported or installed.

    images, labels = load_digits()                  # (1797, 1, 8, 8) float in [0, 1], (1797,) long
    train, test = stratified_split(labels, 0.2, seed=0)
    x_train, y_train = images[train], labels[train]

File format: one image per line, 65 comma-separated numbers: the 64 pixels row by row (0..16),
then the label (0..9).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import torch
from torch import Tensor

from attnlab.io.downloads import PackageFiles, fetch

__all__ = ["DIGITS", "digits_file", "load_digits", "random_shift", "read_digits_csv", "stratified_split"]

# The file is byte-identical in scikit-learn 1.5.2 and 1.7.2 (and has not changed in years): any
# wheel works when passed as `wheel=`; the pin only says what pip fetches (1.7.2 has wheels for
# CPython 3.10-3.14).
DIGITS = PackageFiles("digits", "scikit-learn==1.7.2", subdir="datasets", files={
    "sklearn/datasets/data/digits.csv.gz":
        ("digits.csv.gz", "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"),
})

DIGITS_SIZE, DIGITS_LEVELS, DIGITS_CLASSES = 8, 16, 10


def digits_file(wheel: str | os.PathLike | None = None) -> Path:
    """The verified `digits.csv.gz` in the cache (downloaded once).

    Args:
        wheel: a scikit-learn wheel already on disk (skips pip), e.g. for a machine offline.

    Raises:
        attnlab.io.downloads.DownloadError: pip failed, or the file's sha256 differs.
    """
    return fetch(DIGITS, wheel) / "digits.csv.gz"


def load_digits(wheel: str | os.PathLike | None = None) -> tuple[Tensor, Tensor]:
    """scikit-learn's digits as (images (N, 1, 8, 8) float32 in [0, 1], labels (N,) long).

    Pixels are the 16 grey levels divided by 16, so 0 is background and 1 full ink.

    Raises:
        attnlab.io.downloads.DownloadError: see `digits_file`.
        ValueError: the file is malformed (names the line).
    """
    return read_digits_csv(digits_file(wheel))


def read_digits_csv(path: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """Parse a digits file (gzip or plain CSV): see the module docstring for the format.

    Raises:
        ValueError: a line without 65 numbers, a pixel outside 0..16, a label outside 0..9, or no
            line at all; the message names the file and the line.
    """
    path = Path(path)
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("ascii")
    pixels, labels = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            row, label = _parse_row(line, f"{path}: line {number}")
            pixels.append(row)
            labels.append(label)
    if not labels:
        raise ValueError(f"{path}: no images (expected lines of 64 pixels and a label)")
    images = torch.tensor(pixels, dtype=torch.float32).view(-1, 1, DIGITS_SIZE, DIGITS_SIZE) / DIGITS_LEVELS
    return images, torch.tensor(labels, dtype=torch.long)


def _parse_row(line: str, where: str) -> tuple[list[float], int]:
    n = DIGITS_SIZE * DIGITS_SIZE
    try:
        values = [float(v) for v in line.split(",")]
    except ValueError:
        raise ValueError(f"{where}: expected {n + 1} comma-separated numbers, got {line[:60]!r}") from None
    if len(values) != n + 1:
        raise ValueError(f"{where}: expected {n + 1} numbers ({n} pixels and a label), got {len(values)}")
    pixels, label = values[:n], values[n]
    if min(pixels) < 0 or max(pixels) > DIGITS_LEVELS:
        raise ValueError(f"{where}: pixels must lie in 0..{DIGITS_LEVELS}, got {min(pixels):g}..{max(pixels):g}")
    if label != int(label) or not 0 <= label < DIGITS_CLASSES:
        raise ValueError(f"{where}: the label (last number) must be an integer 0..{DIGITS_CLASSES - 1}, got {label:g}")
    return pixels, int(label)


def stratified_split(labels: Tensor, test_fraction: float = 0.2, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Indices (train, test), each sorted, with every class split in the same proportion.

    Class c with n_c examples puts round(n_c * test_fraction) of them, drawn with a generator
    seeded by `seed`, in the test set: the class balance of the two sets then differs by at most
    one example per class, which a plain random split of 1,797 digits does not promise.

    Raises:
        ValueError: test_fraction outside (0, 1), or labels not a 1-D integer tensor.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    if labels.dim() != 1 or labels.is_floating_point():
        raise ValueError(f"labels must be a 1-D integer tensor, got {labels.dtype} of shape {tuple(labels.shape)}")
    generator = torch.Generator().manual_seed(seed)
    test = []
    for c in torch.unique(labels).tolist():  # sorted: the draws do not depend on the order of the data
        members = (labels == c).nonzero().flatten()
        chosen = members[torch.randperm(len(members), generator=generator)]
        test.append(chosen[:round(len(members) * test_fraction)])
    in_test = torch.zeros(len(labels), dtype=torch.bool)
    in_test[torch.cat(test)] = True
    return (~in_test).nonzero().flatten(), in_test.nonzero().flatten()


def random_shift(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Each image moved by its own whole-pixel offset (dy, dx), each in [-max_shift, max_shift],
    with zeros shifted in: the classic augmentation for digits (a digit drawn a pixel off-centre
    is the same digit), which a model without convolution's built-in translation invariance (a
    Transformer over patches) needs more than a CNN.

    Args:
        images: (B, C, H, W).
        max_shift: 0 returns `images` itself.
        generator: draws the offsets (seeded runs are repeatable).
    """
    if max_shift == 0:
        return images
    B, _, H, W = images.shape
    m = max_shift
    padded = torch.nn.functional.pad(images, (m, m, m, m))  # (B, C, H + 2m, W + 2m)
    offsets = torch.randint(0, 2 * m + 1, (B, 2), generator=generator)
    rows = offsets[:, :1] + torch.arange(H)  # (B, H): the padded rows each output row reads
    cols = offsets[:, 1:] + torch.arange(W)  # (B, W)
    batch = torch.arange(B)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
