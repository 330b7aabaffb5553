"""Patching heatmaps and viewer pages: the page's two heads decode back to the score's positive
and negative parts, labels are checked, the PNG is written."""

import base64
import zlib

import pytest
import torch

from attnlab.inspect.ablation import AblationResult
from attnlab.inspect.patching import PatchResult
from attnlab.inspect.patching_plots import patching_view, plot_patching, write_patching_html
from attnlab.inspect.viewer import page_data


def _result():
    values = torch.tensor([[0.0, 1.0, 0.5], [2.0, -0.5, float("nan")]], dtype=torch.float64)  # clean 1, corrupted 0
    return PatchResult(values, ["layers.0.hook_resid_pre", "layers.1.hook_resid_pre"], ["0", "1", "2"], "position",
                       1.0, 0.0, "denoise")


def test_the_page_holds_the_scores_positive_and_negative_parts():
    view = patching_view(_result(), column_labels=["a", "b", "c"])
    assert view.source == ["layers.0.hook_resid_pre", "layers.1.hook_resid_pre"]
    assert view.target == ["0:a", "1:b", "2:c"]
    data = page_data(view)
    raw = zlib.decompress(base64.b64decode(data["blob"]))
    entry = data["kinds"][0]["maps"][0]
    assert entry["shape"] == [2, 2, 3] and entry["heads"] == [0, 1]
    w = torch.frombuffer(bytearray(raw[entry["offset"]:entry["offset"] + 12]), dtype=torch.uint8).float().view(2, 2, 3) / 255
    expected = torch.tensor([[0.0, 1.0, 0.5], [1.0, -0.5, 0.0]])  # cut at 1, NaN drawn as 0
    torch.testing.assert_close(w[0] - w[1], expected, atol=1 / 255, rtol=0)
    assert data["model"]["direction"] == "denoise" and "normalised score" in data["notice"]


def test_ablation_results_draw_their_effect(tmp_path):
    result = AblationResult(torch.tensor([[1.0, 3.0]], dtype=torch.float64), ["layers.0.self_attn.hook_z"],
                            ["h0", "h1"], "head", 2.0, "zero")
    view = patching_view(result)
    torch.testing.assert_close(view.kinds[0].maps[0].weights, torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]]))
    assert plot_patching(result, tmp_path / "a.png").endswith("a.png")
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_labels_and_paths_are_checked(tmp_path):
    with pytest.raises(ValueError, match="column_labels has 2 entries; the result has 3 position columns"):
        plot_patching(_result(), tmp_path / "x.png", column_labels=["a", "b"])
    with pytest.raises(ValueError, match="is a folder"):
        write_patching_html(tmp_path, _result())
    with pytest.raises(TypeError, match="PatchResult or an AblationResult"):
        patching_view("nothing")
    assert not list(tmp_path.iterdir())
    page = write_patching_html(tmp_path / "p.html", _result())
    assert open(page).read().startswith("<!DOCTYPE html>")
