"""Attention over image patches (attnlab.inspect.patch_maps) and `attnlab inspect attention` on a
Vision Transformer: the patch grid lies where `patchify` cut the patches, the captured weights are
the model's own (checked by hand for layer 0), the PNGs, tensors and the viewer page come out of
the command line, and bad input is refused naming the flag."""

import math

import numpy as np
import pytest
import torch

from attnlab.cli.main import main
from attnlab.data import images as images_module
from attnlab.data.images import stratified_split
from attnlab.inspect.attention_maps import attention_maps
from attnlab.inspect.patch_maps import (DIGITS_SPLIT_SEED, DIGITS_TEST_FRACTION, image_attention, image_view,
                                        on_grid, patch_labels, plot_cls_attention, plot_patch_attention)
from attnlab.inspect.viewer import render_html
from attnlab.interop.serialization import save
from attnlab.io.weights import read_safetensors
from attnlab.models.vision import VisionConfig, VisionEncoder, patchify
from tests.inspect.test_viewer import QUANTUM, decode_page


def tiny_vit(patch_size: int = 2, channels: int = 1, **encoder) -> VisionEncoder:
    torch.manual_seed(0)
    enc = {"d_model": 16, "num_layers": 2, "num_heads": 2, "d_ff": 32, "dropout": 0.0, **encoder}
    return VisionEncoder(VisionConfig(image_size=8, patch_size=patch_size, channels=channels, encoder=enc)).eval()


def test_patch_labels_are_cls_then_raster_order():
    assert patch_labels(2) == ["[CLS]", "p(0,0)", "p(0,1)", "p(1,0)", "p(1,1)"]
    assert len(patch_labels(4)) == 17 and patch_labels(4)[1 + 2 * 4 + 3] == "p(2,3)"


@pytest.mark.parametrize("patch_size", [1, 2, 4])
def test_the_grid_puts_each_key_where_patchify_cut_its_patch(patch_size):
    """An image whose pixels hold the number of the grid cell they lie in: patchify's patch n is
    all n, and on_grid must put key 1 + n back in that cell."""
    g = 8 // patch_size
    y, x = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    cell = (y // patch_size) * g + x // patch_size  # (8, 8)
    patches = patchify(cell[None, None].float(), patch_size)[0]  # (N, P P)
    assert bool((patches == patches[:, :1]).all())
    row = torch.cat([torch.tensor([-1.0]), patches[:, 0]])  # [CLS], then patch n's number
    grid = on_grid(row, g)
    assert torch.equal(grid, cell[::patch_size, ::patch_size].float())
    with pytest.raises(ValueError, match="1 \\+ 2\\^2 = 5 keys"):
        on_grid(torch.ones(6), 2)


def test_the_weights_are_the_models_own_checked_by_hand_for_layer_0():
    model = tiny_vit()
    image = torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(1))
    maps = image_attention(model, image)
    assert list(maps) == ["layers.0.self_attn", "layers.1.self_attn"]
    w = maps["layers.0.self_attn"]  # (H, T, T)
    assert w.shape == (2, 17, 17)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 17))
    # by hand: pre-LN layer 0 sees norm(embed(image)); scores q k^T / sqrt(Dh), softmax over keys
    layer, attn = model.layers[0], model.layers[0].self_attn
    with torch.no_grad():
        x = layer.self_attn_block.norm(model.embed(image[None]))[0]  # (T, D)
        q, k, _ = attn.qkv_proj(x).split(16, dim=-1)
        q, k = q.view(17, 2, 8).transpose(0, 1), k.view(17, 2, 8).transpose(0, 1)  # (H, T, Dh)
        ref = (q @ k.transpose(1, 2) / math.sqrt(8)).softmax(-1)
    torch.testing.assert_close(w, ref)
    # a (S, S) image, a (1, C, S, S) batch and a batch of three agree; heads keep the chosen rows
    batch = torch.cat([torch.rand(1, 1, 8, 8), image[None], torch.rand(1, 1, 8, 8)])
    torch.testing.assert_close(attention_maps(model, batch)["layers.0.self_attn"][1], w)
    torch.testing.assert_close(image_attention(model, image[0])["layers.1.self_attn"], maps["layers.1.self_attn"])
    torch.testing.assert_close(image_attention(model, image, heads=[1])["layers.0.self_attn"], w[1:])


@pytest.mark.parametrize("image, words", [
    (torch.rand(8, 8, 1), "1 x 8 x 8"),
    (torch.rand(2, 8, 8), "1 x 8 x 8"),
    (torch.full((8, 8), float("nan")), "NaN"),
])
def test_a_wrong_image_is_refused_naming_the_shape(image, words):
    with pytest.raises(ValueError, match=words):
        image_attention(tiny_vit(), image)


def test_the_pngs_are_written(tmp_path):
    model = tiny_vit(patch_size=4, channels=3)
    image = torch.rand(3, 8, 8)
    maps = image_attention(model, image)
    assert plot_cls_attention(image, maps, 2, tmp_path / "cls.png", heads=[0, 1]) == str(tmp_path / "cls.png")
    assert plot_patch_attention(image, maps["layers.1.self_attn"], 2, tmp_path / "l1.png") == str(tmp_path / "l1.png")
    assert (tmp_path / "cls.png").stat().st_size > 1000 and (tmp_path / "l1.png").stat().st_size > 1000
    with pytest.raises(ValueError, match=r"expected \(heads, 17, 17\).* got \(2, 5, 5\)"):  # 2x2 maps drawn as 4x4
        plot_cls_attention(image, maps, 4, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.parametrize("kernel, options", [("eager", {}), ("sliding_window", {"window": 2})])
def test_the_viewer_page_shows_patches_and_the_kernels_pattern(kernel, options):
    model = tiny_vit(attention={"kernel": kernel, "kernel_options": options})
    image = torch.rand(1, 8, 8)
    view = image_view(model, image)
    page, maps = decode_page(render_html(view, "vit"))
    assert page["tokens"]["source"] == patch_labels(4) and page["tokens"]["target"] is None
    assert [k["id"] for k in page["kinds"]] == ["layers.*.self_attn"]
    ref = image_attention(model, image)
    for name, m in maps.items():
        assert float((m["weights"] - ref[name]).abs().max()) <= QUANTUM
        if kernel == "eager":
            assert m["allowed"] is None
        else:  # the kernel's own band, |i - j| <= window, over the 17 tokens
            i = torch.arange(17)
            assert torch.equal(m["allowed"], (i[:, None] - i[None]).abs() <= 2)
            assert float(m["weights"][:, ~m["allowed"]].max()) == 0


# ---- the command line ------------------------------------------------------------------------

def _fake_digits(tmp_path, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """50 digits with random pixels (labels k % 10) in place of scikit-learn's file."""
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 17, (50, 64), generator=g)
    rows = [",".join(map(str, p.tolist() + [k % 10])) for k, p in enumerate(pixels)]
    path = tmp_path / "digits.csv"
    path.write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(images_module, "digits_file", lambda wheel=None: path)
    return pixels.float().view(50, 1, 8, 8) / 16, torch.arange(50) % 10


def test_cli_image_index_picks_the_test_split_and_writes_maps(tmp_path, monkeypatch, capsys):
    images, labels = _fake_digits(tmp_path, monkeypatch)
    model = tiny_vit()
    save(model, tmp_path / "vit")
    out = tmp_path / "maps"
    argv = ["inspect", "attention", str(tmp_path / "vit"), "--image", "3", "--out", str(out),
            "--html", str(tmp_path / "page.html")]
    assert main(argv) == 0
    _, test = stratified_split(labels, DIGITS_TEST_FRACTION, seed=DIGITS_SPLIT_SEED)
    expected = image_attention(model, images[test[3]])
    got = read_safetensors(out / "attention.safetensors")
    assert set(got) == set(expected)
    for name, w in expected.items():
        torch.testing.assert_close(got[name][0], w)
        assert (out / f"{name}.png").is_file()
    assert (out / "cls.png").is_file()
    text = capsys.readouterr().out
    assert f"label {int(labels[test[3]])}" in text and "predicted class" in text
    page, _ = decode_page((tmp_path / "page.html").read_text())
    assert page["tokens"]["source"][:3] == ["[CLS]", "p(0,0)", "p(0,1)"]
    assert main(["inspect", "attention", str(tmp_path / "vit"), "--image", str(len(test))]) == 2
    assert f"has {len(test)} images" in capsys.readouterr().err


def test_cli_image_file(tmp_path, capsys):
    model = tiny_vit(patch_size=4)
    save(model, tmp_path / "vit")
    image = np.random.default_rng(0).random((8, 8))
    np.save(tmp_path / "x.npy", image)
    argv = ["inspect", "attention", str(tmp_path / "vit"), "--image-file", str(tmp_path / "x.npy"),
            "--out", str(tmp_path / "maps"), "--heads", "1"]
    assert main(argv) == 0
    got = read_safetensors(tmp_path / "maps" / "attention.safetensors")["layers.0.self_attn"][0]
    torch.testing.assert_close(got, image_attention(model, torch.from_numpy(image).float(), heads=[1])
                               ["layers.0.self_attn"])
    assert got.shape == (1, 5, 5)


@pytest.mark.parametrize("extra, words", [
    (["--text", "the cat"], "reads images: give --image N"),
    ([], "give one of --image N"),
    (["--image", "0", "--image-file", "x.npy"], "give one of --image N"),
    (["--image-file", "{tmp}/missing.npy"], "missing.npy: no such file"),
    (["--image-file", "{tmp}/wrong.npy"], r"the array is \(4, 4\)"),
    (["--image-file", "{tmp}/objects.npy"], "objects.npy: not a .npy array"),
    (["--image-file", "{tmp}/garbage.npy"], "garbage.npy: not a .npy array"),
    (["--image", "0", "--max-tokens", "5"], "--max-tokens is for texts"),
])
def test_cli_refuses_bad_image_input(tmp_path, capsys, extra, words):
    save(tiny_vit(), tmp_path / "vit")
    np.save(tmp_path / "wrong.npy", np.zeros((4, 4)))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "garbage.npy").write_bytes(b"not numpy")
    argv = ["inspect", "attention", str(tmp_path / "vit")] + [a.format(tmp=tmp_path) for a in extra]
    assert main(argv + ["--out", str(tmp_path / "maps")]) == 2
    assert __import__("re").search(words, capsys.readouterr().err)
    assert not (tmp_path / "maps").exists()


def test_cli_refuses_image_flags_for_a_text_model_and_needs_text(tmp_path, capsys):
    from attnlab import ModelConfig, build_model
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(["the cat sat"], kind="char")
    save(build_model(ModelConfig(vocab_size=len(tok), d_model=16, num_layers=1, num_heads=2, d_ff=16)),
         tmp_path / "lm", tokenizer=tok)
    assert main(["inspect", "attention", str(tmp_path / "lm"), "--image", "0"]) == 2
    assert "--image and --image-file are for a Vision Transformer" in capsys.readouterr().err
    assert main(["inspect", "attention", str(tmp_path / "lm")]) == 2
    assert "--text is needed" in capsys.readouterr().err
