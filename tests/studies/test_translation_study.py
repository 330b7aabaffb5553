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


@pytest.mark.parametrize("corpus", ["bible-en-es", "bible-en-es-books", "en-de"])
def test_the_recipe_is_trained_as_written(tmp_path, corpus):
    """run_config changes the corpus, the run folder and what the CPU-time clock replaces (step and
    minute limits, periodic evaluation and checkpoints); model, data, optimiser and schedule are
    the recipe's."""
    from attnlab.training import TrainConfig

    s = study()
    path = s.recipe(corpus, s.parse_args([]))
    recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert recipe["data"]["source"] == corpus.removesuffix("-books")  # the recipe names its own corpus
    got = s.run_config(corpus, tmp_path / "run", path)
    TrainConfig.from_dict(got)  # a valid `attnlab train` config
    for section in ("model", "optim", "schedule"):
        assert got[section] == recipe[section]
    assert got["data"] == {**recipe["data"], "source": corpus}
    changed = {k for k in recipe["train"] if got["train"][k] != recipe["train"][k]}
    assert changed <= {"out_dir", "max_minutes", "max_steps", "eval_every", "checkpoint_every", "keep_last"}
    assert got["train"]["out_dir"] == str(tmp_path / "run") and got["train"]["max_minutes"] is None


def test_the_two_recipes_differ_only_in_their_corpus():
    """EN->DE trains with the EN->ES settings: only the source, the run folder and the number of
    validation batches (its held-out pairs) differ."""
    s = study()
    es, de = (yaml.safe_load(s.CORPORA[c][0].read_text(encoding="utf-8")) for c in ("bible-en-es", "en-de"))
    assert es["model"] == de["model"] and es["optim"] == de["optim"] and es["schedule"] == de["schedule"]
    assert {k for k in es["data"] if es["data"][k] != de["data"][k]} == {"source"}
    assert {k for k in es["train"] if es["train"][k] != de["train"][k]} == {"out_dir", "eval_batches"}


def test_recipe_flag_overrides_every_corpus(tmp_path):
    s = study()
    mine = tmp_path / "mine.yaml"
    assert s.recipe("en-de", s.parse_args(["--recipe", str(mine)])) == mine


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
