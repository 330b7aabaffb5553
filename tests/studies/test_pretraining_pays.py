"""examples/studies/pretraining_pays/: the encoder recipe is a valid `attnlab train` config for a
masked LM; the random twin is the pretrained encoder's architecture and tokenizer with fresh
weights; both encoders fine-tune under one config that differs only in the model; the table pairs
the two by seed."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnlab import ModelConfig, build_model
from attnlab.interop.serialization import load, save
from attnlab.tokenizers import Tokenizer

from tests.studies import STUDIES, load_study


def study():
    return load_study("pretraining_pays")


def test_the_encoder_recipe_is_a_masked_lm_config():
    from attnlab.training import TrainConfig

    cfg = TrainConfig.from_dict(yaml.safe_load((STUDIES / "pretraining_pays" / "bert.yaml").read_text()))
    assert cfg.data.objective == "masked_lm" and cfg.model_config().arch == "encoder"
    assert cfg.train.precision == "auto"  # bf16 only where the CPU has it natively


def test_the_random_twin_shares_config_and_tokenizer_not_weights(tmp_path):
    tok = Tokenizer.train(["a tool to fix the disk", "library for json"], kind="char",
                          special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    torch.manual_seed(1)
    cfg = ModelConfig(arch="encoder", head="mlm", vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, position={"scheme": "learned", "max_len": 32})
    save(build_model(cfg), tmp_path / "pretrained", tokenizer=tok)
    twin = study().random_twin(tmp_path / "pretrained", tmp_path)
    (a, tok_a), (b, tok_b) = load(tmp_path / "pretrained", with_tokenizer=True), load(twin, with_tokenizer=True)
    assert a.config == b.config
    assert tok_a.get_vocab() == tok_b.get_vocab()
    wa, wb = a.state_dict(), b.state_dict()
    assert wa.keys() == wb.keys()
    assert not torch.equal(wa["embed.token.weight"], wb["embed.token.weight"])


def test_both_encoders_fine_tune_under_one_config(tmp_path):
    from attnlab.finetune.job import FinetuneJobConfig

    s = study()
    args = argparse.Namespace(lr=2e-4, steps=150, dropout=0.1)
    data = {split: tmp_path / f"{split}.tsv" for split in ("train", "valid", "test")}
    pre = s.finetune_config(Path("pre"), data, tmp_path / "a", 0, args)
    rand = s.finetune_config(Path("rand"), data, tmp_path / "b", 0, args)
    assert {k for k in pre if pre[k] != rand[k]} == {"model", "out_dir"}
    job = FinetuneJobConfig.from_dict(pre)
    assert job.dropout == 0.1 and job.recipe.max_steps == 150 and job.seeds == [0]


def test_the_table_pairs_the_encoders_by_seed():
    acc = {"pretrained": [0.70, 0.60, 0.65], "random": [0.60, 0.62, 0.55]}
    runs = [{"init": init, "seed": seed, "test": {"accuracy": acc[init][seed]}} for seed in range(3)
            for init in ("pretrained", "random")]
    last = study().table(runs).strip().splitlines()[-1]
    diffs = [p - r for p, r in zip(acc["pretrained"], acc["random"])]
    assert last.startswith("| difference (paired by seed) | +0.100 | -0.020 | +0.100 |")
    assert f"{statistics.mean(diffs):+.3f} | {statistics.stdev(diffs):.3f} |" in last


@pytest.mark.slow
def test_the_encoder_recipe_at_a_quarter_of_its_steps(tmp_path):
    """bert.yaml on python-docs for 1,500 of its 6,000 steps (its own cosine, shortened): masked-token
    accuracy on the held-out documents >= 27%. Measured with this command: 30.0% (18 minutes of one
    core with native bf16; the shortened schedule did worse at step 1,500 than the full one, 35.2%);
    the full recipe reaches 40.1% at step 2,000 and 53.2% at 6,000."""
    run = tmp_path / "bert"
    subprocess.run([sys.executable, "-m", "attnlab.cli.main", "train", str(STUDIES / "pretraining_pays" / "bert.yaml"),
                    "--train.out_dir", str(run), "--train.max_steps", "1500"], check=True, timeout=3 * 3600,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "val_mlm_accuracy" in line]
    assert evals[-1]["step"] == 1500
    assert evals[-1]["val_mlm_accuracy"] >= 0.27


@pytest.mark.slow
def test_pretraining_pays_in_domain_at_a_quarter_of_the_pretraining(tmp_path):
    """The study at a reduced budget: the encoder pretrained on debian-text for 1,500 of bert.yaml's
    6,000 steps (its cosine shortened; still on the masked-LM plateau, 13.7% masked-token accuracy)
    against its random twin, fine-tuned on debian-sections with the study's settings, seeds 0-2.
    Claim: it wins on every seed. Measured with this command (2026-11-28, 62 minutes of wall-clock
    at load 1.5-5): +0.034 / +0.041 / +0.038, mean +0.038 (0.620 against 0.582); the full
    6,000-step encoder wins by +0.139."""
    out = tmp_path / "study"
    subprocess.run([sys.executable, str(STUDIES / "pretraining_pays" / "run.py"), "--corpus", "debian-text",
                    "--pretrain-steps", "1500", "--out", str(out)], check=True, timeout=4 * 3600)
    runs = json.loads((out / "results.json").read_text())["runs"]
    acc = {init: {r["seed"]: r["test"]["accuracy"] for r in runs if r["init"] == init} for init in ("pretrained", "random")}
    assert sorted(acc["pretrained"]) == sorted(acc["random"]) == [0, 1, 2]
    diffs = [acc["pretrained"][s] - acc["random"][s] for s in range(3)]
    assert all(d > 0 for d in diffs), diffs
    assert statistics.mean(diffs) >= 0.02, diffs
