"""Adding a model family is one file plus one `register` call: a toy "bag of embeddings" language
model (token t + 1 predicted from the mean embedding of tokens 0..t), written here and registered
at runtime, is accepted by ModelConfig, built by build_model, trained a few steps by the real
Trainer on the pretraining pipeline, evaluated, checkpointed and loaded back, without a change
anywhere else."""

import json
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS, FamilyTraits
from attnlab.config.validate import ConfigError
from attnlab.models import build_model
from attnlab.models.families import Family, family, head_loss, register, unregister
from attnlab.models.heads import LMHead
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")


# ---- the whole family: one module, one build, one loss ---------------------------------------

class BagOfEmbeddings(nn.Module):
    """h_t = mean(E[x_0..x_t]); logits = h_t E^T. Causal by construction, no attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed.weight, std=cfg.init_std)
        self.head = LMHead(cfg.d_model, cfg.vocab_size, tied=self.embed)

    def features(self, input_ids: Tensor) -> Tensor:
        x = self.embed(input_ids)  # (B, T, D)
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.features(input_ids))  # (B, T, V)


def bag_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> Tensor:
    return head_loss(model, model.features(batch["input_ids"]), batch["labels"], label_smoothing)


BAG = Family(name="bag", traits=FamilyTraits("bag-of-embeddings", heads=("lm",), pooling="last"),
             description="a bag of embeddings", build=BagOfEmbeddings, batch_loss=bag_loss, decoding="prompt")


# ---- the test --------------------------------------------------------------------------------

@pytest.fixture
def bag():
    register(BAG)
    yield BAG
    unregister(BAG.name)


def test_a_registered_family_is_configured_built_trained_and_saved_like_the_built_in_ones(bag, tmp_path):
    from attnlab.interop.serialization import load
    from attnlab.training import TrainConfig, Trainer
    from attnlab.training.data.batches import DataPipeline

    config = TrainConfig.from_dict(tiny_config(tmp_path, max_steps=12, eval_every=6, checkpoint_every=6))
    pipeline = DataPipeline.build(config.data, Path(config.train.out_dir), show_progress=False)
    model_cfg = ModelConfig(arch="bag", vocab_size=pipeline.tokenizer.vocab_size, d_model=32, num_heads=2)
    assert family(model_cfg) is bag and model_cfg.head == "lm" and model_cfg.classifier_pooling == "last"
    torch.manual_seed(0)
    model = build_model(model_cfg)
    assert isinstance(model, BagOfEmbeddings) and model.config is model_cfg

    trainer = Trainer(config, pipeline=pipeline, model=model, show_progress=False, log=lambda _: None)
    summary = trainer.fit()
    out = Path(trainer.out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(evals) == 2 and summary["val_loss"] == evals[-1] < evals[0] < math.log(model_cfg.vocab_size) + 0.01
    train = [r["train_loss"] for r in records if "train_loss" in r]
    assert train[-1] < train[0]

    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["arch"] == "bag"
    folders = sorted(p for p in out.rglob("model.safetensors"))
    assert folders, "a checkpoint with the model's weights"
    again = load(folders[-1].parent)
    assert isinstance(again, BagOfEmbeddings)
    torch.testing.assert_close(again.embed.weight, trainer.model.embed.weight)


def test_a_config_names_the_registered_family_only_while_it_is_registered(bag):
    assert FAMILY_TRAITS["bag"] is bag.traits
    with pytest.raises(ConfigError, match="^head: arch='bag' takes head='lm', got head='none'$"):
        ModelConfig(arch="bag", head="none")
    with pytest.raises(ConfigError, match="^memory_len: segment memory is for arch='decoder'"):
        ModelConfig(arch="bag", memory_len=4, position={"scheme": "rotary"})
    with pytest.raises(ValueError, match="already registered"):
        register(BAG)
    unregister("bag")
    with pytest.raises(ConfigError, match="^arch: 'bag' is not one of decoder, encoder, encoder_decoder, "
                                          "rnn_encoder_decoder$"):
        ModelConfig(arch="bag")
    register(BAG)  # for the fixture's teardown
