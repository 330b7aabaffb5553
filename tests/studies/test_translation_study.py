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
    with pytest.raises(SystemExit):  # a recipe that is not there is refused before anything trains
        s.parse_args(["--recipe", str(mine)])
    mine.write_text("model: {}\n", encoding="utf-8")
    assert s.recipe("en-de", s.parse_args(["--recipe", str(mine)])) == mine


def test_en_de_is_scored_by_part_and_other_corpora_whole(monkeypatch):
    """en-de's held-out pairs split into Ding's (those of de-en's held-out side) and the rest."""
    s = study()
    ding = [("It rains.", "Es regnet."), ("I am here.", "Ich bin hier.")]
    monkeypatch.setattr(s, "held_out", lambda corpus: ding if corpus == "de-en" else [])
    pairs = [("a package", "ein Paket"), ding[1], ("a library", "eine Bibliothek"), ding[0]]
    assert s.parts("en-de", pairs) == {"ding": [1, 3], "descriptions": [0, 2]}
    assert s.parts("bible-en-es", pairs) == {}


def test_the_report_has_a_row_per_part(tmp_path):
    s = study()
    args = s.parse_args(["--out", str(tmp_path), "--corpora", "en-de", "--marks", "15", "30"])
    row = lambda bleu: {"bleu": bleu, "chrf": 2 * bleu, "sentences": 3}
    evaluation = {"15": {**row(5.0), "by_part": {"ding": row(1.0), "descriptions": row(7.0)}},
                  "30": {**row(9.0), "by_part": {"ding": row(2.0), "descriptions": row(12.0)}}}
    clock = {"marks": {"15": {"step": 100}, "30": {"step": 200}}}
    (tmp_path / "en-de").mkdir()
    s.write_json(tmp_path / "en-de" / "evaluation.json", {m: {**r, "samples": []} for m, r in evaluation.items()})
    s.write_json(tmp_path / "en-de" / "clock.json", clock)
    text = s.report(args, 0.0)
    assert "| of which ding (3) | 100 / 1.00 / 2.0 | 200 / 2.00 / 4.0 |" in text
    assert "| of which descriptions (3) | 100 / 7.00 / 14.0 | 200 / 12.00 / 24.0 |" in text


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
