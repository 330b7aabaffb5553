"""A run with a `lora` section (attnlab.training.setup.adapters): a pretrained tiny model (model.init_from)
is wrapped before the optimizer is made, only its adapters change and its validation loss falls;
the run folder keeps the adapters alone and the merged model, each reproducing the trained
model's outputs; resume is exact; fine-tuning trains the adapters and the new head; bad `lora`
sections are errors naming the field."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config.validate import ConfigError
from attnlab.finetune import Example, Finetuner, LabelMap, Recipe, with_head
from attnlab.nn.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, load_adapters, lora_layers
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup.start import resolve_init_from
from tests.finetune.helpers import char_tokenizer, colour_rows, tiny
from tests.training.helpers import tiny_config

LORA = {"rank": 4, "alpha": 8, "target_modules": ["q", "v", "out_proj", "w1", "w2"]}


def _quiet(config: TrainConfig) -> Trainer:
    return Trainer(config, show_progress=False, log=lambda _: None)


def _lora_config(folder: Path, base_run: Path, out: Path, **train) -> TrainConfig:
    """A 16-step LoRA run from `base_run` on text of three of its words (a shifted domain)."""
    cfg = tiny_config(folder, out_dir=str(out), max_steps=16, eval_every=16, checkpoint_every=4, **train)
    rng = random.Random(0)
    for split, n in (("lora-train", 400), ("lora-valid", 60)):
        lines = (" ".join(rng.choice(["love", "night", "crown"]) for _ in range(8)) for _ in range(n))
        (folder / f"{split}.txt").write_text("\n".join(lines))
    cfg["data"].update(source=str(folder / "lora-train.txt"), valid=str(folder / "lora-valid.txt"))
    cfg["model"] = {"init_from": str(base_run)}
    cfg["optim"] = {"lr": 0.01}
    cfg["lora"] = dict(LORA)
    return resolve_init_from(TrainConfig.from_dict(cfg))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 12-step base run, then a 16-step LoRA run from it: (trainer, base run folder, val loss before, summary)."""
    tmp = tmp_path_factory.mktemp("lora")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(tmp / "cache"))
        base = _quiet(TrainConfig.from_dict(tiny_config(tmp / "base", max_steps=12, eval_every=12)))
        base.fit()
        trainer = _quiet(_lora_config(tmp / "data", base.out, tmp / "run"))
        before = trainer.evaluate()["val_loss"]
        summary = trainer.fit()
    torch.set_num_threads(threads)
    return trainer, base.out, before, summary


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.eval()(ids)


def test_only_the_adapters_train_and_the_validation_loss_falls(lora_run):
    trainer, base_run, before, summary = lora_run
    assert summary["val_loss"] < before - 0.1 and math.isfinite(summary["val_loss"])
    base = attnlab.load(base_run).state_dict()
    state = trainer.model.state_dict()
    adapters = {n for n in state if ".lora_" in n}
    assert set(state) - adapters == set(base)
    for name, tensor in base.items():
        assert torch.equal(state[name], tensor), name  # frozen: bitwise the pretrained weights
    assert len(adapters) == 2 * 5  # 1 layer: parts q, v of qkv_proj; out_proj, w1, w2
    assert all(state[n].abs().max() > 0 for n in adapters if ".lora_B." in n)  # B moved from zero
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in trainer.model.named_parameters() if ".lora_" in n}


def test_the_run_folder_keeps_the_adapters_alone_and_the_merged_model(lora_run):
    trainer, base_run, _, _ = lora_run
    out = trainer.out
    want = _logits(trainer.model)
    meta = json.loads((out / "adapter" / ADAPTER_CONFIG).read_text())
    assert meta["rank"] == 4 and meta["settings"]["target_modules"] == LORA["target_modules"]
    checkpoint = next((out / "checkpoints").glob("step-*/model.safetensors"))
    assert (out / "adapter" / ADAPTER_WEIGHTS).stat().st_size < checkpoint.stat().st_size / 3

    merged, tokenizer = attnlab.load(out / "merged", with_tokenizer=True)  # a plain attnlab.save folder
    assert not lora_layers(merged) and tokenizer is not None
    torch.testing.assert_close(_logits(merged), want, rtol=1e-5, atol=1e-5)

    base = attnlab.load(base_run)
    assert (_logits(base) - want).abs().max() > 1e-3
    load_adapters(base, out / "adapter")  # the adapters alone, onto the same base
    torch.testing.assert_close(_logits(base), want, rtol=0, atol=1e-6)
    assert json.loads((out / "config.json").read_text())["config"]["lora"]["rank"] == 4


def test_a_resumed_lora_run_ends_bitwise_equal_to_the_uninterrupted_one(lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    full, base_run, _, _ = lora_run
    config = _lora_config(tmp_path / "data", base_run, tmp_path / "run")
    _quiet(config).fit(stop_at=8)
    assert (tmp_path / "run" / "adapter").is_dir() and not (tmp_path / "run" / "merged").exists()  # a pause
    resumed = _quiet(config)
    resumed.fit(resume=True)
    assert resumed.step == 16
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("lora, path", [({"rank": 0}, "lora.rank"), ({"rank": 1.5}, "lora.rank"),
                                        ({"alpha": -1}, "lora.alpha"), ({"dropout": 1}, "lora.dropout"),
                                        ({"target_modules": []}, "lora.target_modules"),
                                        ({"target_modules": ["q", "(v"]}, r"lora.target_modules\[1\]"),
                                        ({"ranks": 4}, "lora.ranks")])
def test_bad_lora_sections_name_the_field(tmp_path, lora, path):
    with pytest.raises(ConfigError, match=f"^{path}: "):
        TrainConfig.from_dict({**tiny_config(tmp_path), "lora": lora})
    with pytest.raises(ConfigError, match=f"^recipe.{path}: "):
        Recipe.from_dict({"lora": lora})


def test_a_target_that_matches_nothing_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    config = TrainConfig.from_dict({**tiny_config(tmp_path), "lora": {"target_modules": ["q", "query"]}})
    with pytest.raises(ConfigError, match=r"^lora.target_modules: 'query' matches no layer .*self_attn\.q"):
        _quiet(config)
    assert not (tmp_path / "run" / "tokenizer.json").exists()
    fresh = TrainConfig.from_dict({**tiny_config(tmp_path), "lora": LORA})
    with pytest.warns(UserWarning, match="lora without model.init_from"):
        _quiet(fresh)


def test_finetuning_with_lora_trains_the_adapters_and_the_new_head(tmp_path):
    torch.manual_seed(0)
    exs = [Example(t, label=y) for t, y in colour_rows(64)]
    labels = LabelMap.from_examples(exs)
    model = with_head(tiny("encoder", num_layers=2), "classification", len(labels), pooling="mean", seed=0)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    recipe = Recipe(lr=1e-2, max_steps=20, batch_size=16, warmup_ratio=0.0, precision="fp32",
                    lora={"rank": 4, "alpha": 8, "target_modules": ["q", "v", "w1"]})
    run = Finetuner(model, char_tokenizer(), exs, labels.encode(exs), recipe, seed=0, out_dir=tmp_path / "seed-0")
    run.train(20)
    changed = {n for n, t in run.model.state_dict().items() if n not in before or not torch.equal(t, before[n])}
    assert changed == {n for n in run.model.state_dict() if ".lora_" in n or n.startswith("head.")}
    losses = [h["loss"] for h in run.history]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    merged = attnlab.load(tmp_path / "seed-0" / "merged")
    with torch.no_grad():
        ids = torch.randint(3, 40, (3, 7), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(merged(ids), run.model.eval()(ids), rtol=1e-5, atol=1e-5)
