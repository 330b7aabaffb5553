"""examples/studies/translation/run.py: it trains the recipe file as written (only the corpus, the
run folder and the clock change), and, slow, the study's goal at half its budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.studies import STUDIES, load_study

SCRIPT = STUDIES / "translation" / "run.py"


def study():
    return load_study("translation")


def test_the_recipe_is_trained_as_written(tmp_path):
    """run_config changes the corpus, the run folder and what the CPU-time clock replaces (step and
    minute limits, periodic evaluation and checkpoints); model, data, optimiser and schedule are
    the recipe's."""
    from attnlab.training import TrainConfig

    s = study()
    recipe = yaml.safe_load(s.RECIPE.read_text(encoding="utf-8"))
    got = s.run_config("bible-en-es-books", tmp_path / "run", s.RECIPE)
    TrainConfig.from_dict(got)  # a valid `attnlab train` config
    for section in ("model", "optim", "schedule"):
        assert got[section] == recipe[section]
    assert got["data"] == {**recipe["data"], "source": "bible-en-es-books"}
    changed = {k for k in recipe["train"] if got["train"][k] != recipe["train"][k]}
    assert changed <= {"out_dir", "max_minutes", "max_steps", "eval_every", "checkpoint_every", "keep_last"}
    assert got["train"]["out_dir"] == str(tmp_path / "run") and got["train"]["max_minutes"] is None


@pytest.mark.slow
def test_bleu_20_on_held_out_verses_within_half_the_budget(tmp_path):
    """The study's goal (BLEU >= 20 on held-out bible-en-es verses within an hour of one core) at
    half the budget: translation_en_es.yaml for 30 CPU-minutes, beam 4 on all 1,071 held-out
    verses (the study measured 23.25 at 30 minutes, 28.48 at 60). CPU-minutes buy different
    amounts of training on different CPUs (`precision: auto` is bf16 where the CPU has it natively):
    this threshold was set on a 2-core machine with native bf16."""
    out = tmp_path / "study"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--corpora", "bible-en-es", "--marks", "30"],
                   check=True, timeout=3 * 3600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads((out / "results.json").read_text())["results"]["bible-en-es"]["30"]
    assert result["sentences"] == 1071
    assert result["bleu"] >= 20
