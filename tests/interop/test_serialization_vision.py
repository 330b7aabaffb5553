"""attnlab.save / attnlab.load of a Vision Transformer (VisionEncoder): identical logits, the
VisionConfig kept field for field, and a Trainer run folder of a ViT loads like a text model's."""

import json

import pytest
import torch

from attnlab.interop.serialization import load, save
from attnlab.models.vision import VisionConfig, VisionEncoder
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


def _vit(**encoder) -> VisionEncoder:
    enc = {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 48, "dropout": 0.0, **encoder}
    torch.manual_seed(0)
    return VisionEncoder(VisionConfig(image_size=8, patch_size=2, channels=1, encoder=enc))


@pytest.mark.parametrize("encoder", [
    {},
    {"position": {"scheme": "rotary"}, "classifier_pooling": "mean", "norm": "rmsnorm"},
    {"position": {"scheme": "alibi"}, "head": "none"},
], ids=["learned-cls", "rotary-mean", "alibi-hidden"])
def test_a_vit_round_trips_with_the_same_logits_and_config(encoder, tmp_path):
    model = _vit(**encoder)
    with torch.no_grad():  # weights that init alone would not give: a loader that re-inits is caught
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save(model, tmp_path / "vit")
    data = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert data["image_size"] == 8 and "arch" not in data  # the VisionConfig, not its encoder's ModelConfig
    back = load(tmp_path / "vit")
    assert isinstance(back, VisionEncoder) and not back.training
    assert isinstance(back.config, VisionConfig) and back.config == model.config
    images = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(images), back(images))
    assert model.state_dict().keys() == back.state_dict().keys()


def test_a_changed_geometry_is_kept(tmp_path):
    """patch_size and channels come back from config.json: the loaded model takes RGB images of 4 x 4 patches."""
    model = VisionEncoder(VisionConfig(image_size=8, patch_size=4, channels=3,
                                       encoder={"d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 16,
                                                "num_labels": 3})).eval()
    save(model, tmp_path / "vit")
    back = load(tmp_path / "vit")
    assert (back.config.patch_size, back.config.channels, back.config.encoder.num_labels) == (4, 3, 3)
    images = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(images), back(images))


def test_a_mismatched_weights_file_is_refused_naming_the_file(tmp_path):
    save(_vit(), tmp_path / "a")
    save(_vit(d_model=16), tmp_path / "b")
    (tmp_path / "a" / "model.safetensors").write_bytes((tmp_path / "b" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="model.safetensors"):
        load(tmp_path / "a")


def test_a_bad_vision_config_names_the_field(tmp_path):
    save(_vit(), tmp_path / "vit")
    path = tmp_path / "vit" / "config.json"
    data = json.loads(path.read_text())
    data["patch_size"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="patch_size"):
        load(tmp_path / "vit")


def test_a_trainer_run_of_a_vit_loads_its_best_checkpoint(tmp_path):
    from attnlab.training.config import TrainConfig
    from attnlab.training.tasks.images import ImageClassificationTask
    from attnlab.training.trainer import Trainer

    torch.manual_seed(0)
    images, labels = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    task = ImageClassificationTask(images, labels, batch_size=8, valid=(images[:8], labels[:8]), seed=0)
    cfg = TrainConfig.from_dict({"train": {"out_dir": str(tmp_path / "run"), "max_steps": 2, "eval_every": 2,
                                           "checkpoint_every": 2, "log_every": 1},
                                 "schedule": {"warmup_steps": 1}})
    trainer = Trainer(cfg, task=task, model=_vit().train(), show_progress=False, log=lambda _: None)
    trainer.fit()
    back = load(tmp_path / "run")
    assert isinstance(back, VisionEncoder) and back.config == trainer.model.config
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(back(images), trainer.model(images))
