"""The Vision Transformer (attnlab.models.vision): patches, what positions do and do not change,
the shared encoder layers, config errors, training through the one loop, and real digits (slow)."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import build_model
from attnlab.config.validate import ConfigError
from attnlab.inspect.attention_maps import capture_attention
from attnlab.models.vision import VisionConfig, VisionEncoder, default_encoder, patchify
from attnlab.nn.layers import TransformerLayer
from attnlab.training.tasks.images import ImageClassificationTask, evaluate_images

from .helpers import SCHEMES


def tiny_vit(scheme: str = "learned", *, patch_size: int = 2, image_size: int = 8, channels: int = 1,
             **encoder) -> VisionEncoder:
    enc = {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 64, "dropout": 0.0,
           "position": {"scheme": scheme, "relative_max_distance": 4}, **encoder}
    cfg = VisionConfig.from_dict({"image_size": image_size, "patch_size": patch_size, "channels": channels,
                                  "encoder": enc})
    return VisionEncoder(cfg).eval()


def reference_patches(images: torch.Tensor, P: int) -> torch.Tensor:
    """Patches cut one by one: row of patches i, column j, each flattened (C, P, P)."""
    B, C, H, W = images.shape
    out = []
    for b in range(B):
        out.append(torch.stack([images[b, :, i * P:(i + 1) * P, j * P:(j + 1) * P].flatten()
                                for i in range(H // P) for j in range(W // P)]))
    return torch.stack(out)


def from_patches(patches: torch.Tensor, C: int, H: int, P: int) -> torch.Tensor:
    """The image whose patches (raster order, one by one) are `patches` (B, N, C P P)."""
    B, g = patches.shape[0], H // P
    images = torch.empty(B, C, H, H)
    for n in range(g * g):
        i, j = divmod(n, g)
        images[:, :, i * P:(i + 1) * P, j * P:(j + 1) * P] = patches[:, n].view(B, C, P, P)
    return images


# ---- patches --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,P", [((2, 1, 8, 8), 2), ((2, 1, 8, 8), 4), ((3, 3, 6, 6), 3), ((1, 2, 4, 8), 2)])
def test_patchify_equals_a_reference_loop(shape, P):
    images = torch.randn(shape)
    assert torch.equal(patchify(images, P), reference_patches(images, P))


def test_patchify_refuses_images_that_do_not_tile():
    with pytest.raises(ValueError, match="do not split into 3 x 3 patches"):
        patchify(torch.zeros(1, 1, 8, 8), 3)


def test_the_patch_embedding_is_a_convolution_with_stride_p():
    """ViT's linear projection of flattened patches == Conv2d(kernel = stride = P), the way
    reference implementations write it."""
    model = tiny_vit(patch_size=2, image_size=6, channels=3)
    images = torch.randn(2, 3, 6, 6)
    lin = model.patch_embed
    conv = F.conv2d(images, lin.weight.view(-1, 3, 2, 2), lin.bias, stride=2)  # (B, D, 3, 3)
    torch.testing.assert_close(lin(patchify(images, 2)), conv.flatten(2).transpose(1, 2))


# ---- positions: the only thing that knows where a patch was ------------------------------------

def _shuffled(images: torch.Tensor, perm: torch.Tensor, P: int) -> torch.Tensor:
    """The image whose slot i holds the original patch perm[i]."""
    return from_patches(reference_patches(images, P)[:, perm], images.shape[1], images.shape[2], P)


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_permuting_patches_together_with_their_positions_changes_nothing(pooling):
    model = tiny_vit("learned", classifier_pooling=pooling)
    images = torch.rand(3, 1, 8, 8)
    perm = torch.randperm(16)
    shuffled = _shuffled(images, perm, 2)
    before = model(images)
    assert not torch.allclose(model(shuffled), before, atol=1e-4)  # the positions do tell the patches apart
    with torch.no_grad():  # slot i now holds patch perm[i]: give it that patch's position row
        table = model.positions.weight
        table[1:] = table[1:][perm].clone()
    torch.testing.assert_close(model(shuffled), before, atol=1e-5, rtol=1e-5)


def test_without_positions_the_class_token_sees_a_set_of_patches():
    model = tiny_vit("none")
    images = torch.rand(3, 1, 8, 8)
    perm = torch.randperm(16)
    torch.testing.assert_close(model(_shuffled(images, perm, 2)), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["rotary", "relative", "alibi", "t5_bias"])
def test_positions_inside_attention_also_see_the_patch_order(scheme):
    model = tiny_vit(scheme)
    images = torch.rand(2, 1, 8, 8)
    assert not torch.allclose(model(_shuffled(images, torch.randperm(16), 2)), model(images), atol=1e-4)


# ---- shapes, the shared layers, configs -------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_position_scheme_builds_and_classifies(scheme):
    model = tiny_vit(scheme)
    out = model(torch.rand(5, 1, 8, 8))
    assert out.shape == (5, 10) and torch.isfinite(out).all()


def test_shapes_of_features_hidden_states_and_attention():
    model = tiny_vit(patch_size=4, image_size=8, channels=3, head="none", num_labels=3)
    images = torch.rand(2, 3, 8, 8)
    assert model.features(images).shape == (2, 1 + 4, 32)
    assert model(images).shape == (2, 5, 32)  # head 'none': the hidden states
    with torch.no_grad(), capture_attention(model, "layers.*.self_attn") as record:
        model(images)
    weights = record["layers.1.self_attn"]
    assert weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


def test_the_layers_are_the_text_encoders_layers():
    """The same builder makes them: a text encoder from the same ModelConfig has layers with the
    same modules, parameter names and shapes."""
    cfg = VisionConfig().encoder
    vit = VisionEncoder(VisionConfig())
    text = build_model(cfg.replace(vocab_size=30, pad_token_id=0))
    assert all(isinstance(layer, TransformerLayer) for layer in vit.layers)
    assert {k: v.shape for k, v in vit.layers.state_dict().items()} == \
        {k: v.shape for k, v in text.layers.state_dict().items()}
    assert type(vit.final_norm) is type(text.final_norm)


def test_wrong_images_are_refused_naming_the_expected_shape():
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\).*got torch.float32 of shape \(2, 1, 6, 6\)"):
        model(torch.rand(2, 1, 6, 6))
    with pytest.raises(ValueError, match="float tensor"):
        model(torch.zeros(2, 1, 8, 8, dtype=torch.long))


@pytest.mark.parametrize("data,field,words", [
    ({"image_size": 8, "patch_size": 3}, "patch_size", "does not divide image_size=8"),
    ({"patch_size": 0}, "patch_size", ">"),
    ({"encoder": {"arch": "decoder"}}, "encoder.arch", "bidirectional encoder"),
    ({"encoder": {"head": "mlm"}}, "encoder.head", "not one of classification, none"),
    ({"encoder": {"classifier_pooling": "last"}}, "encoder.classifier_pooling", "not one of first, mean"),
    ({"encoder": {"position": {"combine": "concat"}}}, "encoder.position.combine", "use 'add'"),
    ({"encoder": {"type_vocab_size": 2}}, "encoder.type_vocab_size", "text tokens"),
    ({"encoder": {"num_heads": 5}}, "encoder.num_heads", "not divisible"),
])
def test_config_errors_name_the_field(data, field, words):
    with pytest.raises(ConfigError) as err:
        VisionConfig.from_dict(data)
    assert err.value.path == field and words in err.value.problem


def test_a_kernel_that_picks_tokens_by_id_is_refused():
    enc = default_encoder().to_dict()
    enc["attention"] = {"kernel": "longformer", "kernel_options": {"window": 2, "global_token_id": 0}}
    with pytest.raises(ConfigError, match="picks tokens by id") as err:
        VisionConfig.from_dict({"encoder": enc})
    assert err.value.path == "encoder.attention.kernel"


def test_config_round_trips_and_derives_the_sequence_length():
    cfg = VisionConfig.from_dict({"image_size": 8, "patch_size": 4, "encoder": {"num_layers": 2}})
    assert cfg.encoder.num_layers == 2 and cfg.encoder.d_model == default_encoder().d_model  # merged into the default
    assert (cfg.grid, cfg.num_patches, cfg.seq_len, cfg.patch_dim) == (2, 4, 5, 16)
    assert cfg.encoder.position.max_len == 5  # a learned table of exactly [CLS] + 4 patches
    assert VisionConfig.from_dict(cfg.to_dict()) == cfg
    assert VisionEncoder(cfg).positions.weight.shape == (5, cfg.encoder.d_model)
    direct = VisionConfig(image_size=8, patch_size=4, encoder={"num_layers": 2})  # the constructor merges alike
    assert direct == cfg


# ---- training ---------------------------------------------------------------------------------

def test_a_tiny_model_overfits_32_random_images():
    """32 random images with random labels: nothing to generalise, so only a model whose every
    part passes gradients can fit them all."""
    torch.manual_seed(0)
    images, labels = torch.rand(32, 1, 8, 8), torch.randint(0, 10, (32,))
    model = tiny_vit(patch_size=2).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):  # seen: all fitted after 70-150 steps (seeds 0-3)
        logits = model(images)
        if bool((logits.argmax(-1) == labels).all()):  # dropout is 0: these are the eval logits
            break
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert evaluate_images(model, images, labels)["accuracy"] == 1.0


def test_the_task_visits_every_image_once_per_epoch():
    images, labels = torch.rand(10, 1, 8, 8), torch.arange(10)
    task = ImageClassificationTask(images, labels, batch_size=4, seed=3)
    gen = torch.Generator().manual_seed(0)
    seen = torch.cat([task.train_batch(gen)["labels"] for _ in range(5)])  # 20 = two epochs
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:].tolist()) == list(range(10))
    assert not torch.equal(seen[:10], seen[10:])  # a new order each epoch
    assert task.state_dict() == {"epochs": 2, "pos": 10}


def test_task_errors_name_the_split():
    with pytest.raises(ValueError, match="valid: labels must be an integer tensor"):
        ImageClassificationTask(torch.rand(4, 1, 8, 8), torch.arange(4),
                                valid=(torch.rand(3, 1, 8, 8), torch.rand(3)))


def _trainer(tmp_path, monkeypatch, name, max_steps=4):
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import Trainer

    torch.manual_seed(0)
    images, labels = torch.rand(24, 1, 8, 8), torch.randint(0, 10, (24,))
    task = ImageClassificationTask(images, labels, batch_size=8, valid=(images[:8], labels[:8]), seed=0, max_shift=1)
    cfg = TrainConfig.from_dict({"train": {"out_dir": str(tmp_path / name), "max_steps": max_steps, "eval_every": 2,
                                           "checkpoint_every": 2, "log_every": 1},
                                 "schedule": {"warmup_steps": 1}})
    return Trainer(cfg, task=task, model=tiny_vit().train(), show_progress=False, log=lambda _: None)


def test_the_trainer_trains_it_and_resumes_exactly(tmp_path, monkeypatch):
    whole = _trainer(tmp_path, monkeypatch, "whole")
    summary = whole.fit()
    assert summary["steps"] == 4 and 0 <= summary["accuracy"] <= 1 and "val_loss" in summary
    assert (tmp_path / "whole" / "config.json").is_file()
    paused = _trainer(tmp_path, monkeypatch, "paused")
    paused.fit(stop_at=2)
    resumed = _trainer(tmp_path, monkeypatch, "paused")
    resumed.fit(resume=True)
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_the_vit_learns_the_real_digits(isolated_cache):
    """scikit-learn's digits, fetched from PyPI: 500 steps of 64 images (about 20 s on one core)
    reach >= 90% test accuracy; chance is 10%. (Seen: 94.7%, seed 0.)"""
    from attnlab.data.images import load_digits, stratified_split

    torch.set_num_threads(1)
    images, labels = load_digits()
    train, test = stratified_split(labels, 0.2, seed=0)
    torch.manual_seed(0)
    model = VisionEncoder(VisionConfig(patch_size=2)).train()
    task = ImageClassificationTask(images[train], labels[train], batch_size=64, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(500):
        loss = task.loss(model, task.train_batch(gen)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert evaluate_images(model, images[test], labels[test])["accuracy"] >= 0.90
