"""Slow: the real all-MiniLM-L6-v2 fine-tuned on the translation-pair task after the
dictionary-word intermediate task: the two recipes of examples/finetune, run as its README says."""

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "finetune"


def _finetune(name: str, data: dict, out: Path, model: str | None = None) -> dict:
    from attnlab.finetune.job import run_finetune

    config = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    config["data"].update({split: str(p) for split, p in data.items()})
    config["out_dir"] = str(out)
    if model is not None:
        config["model"] = model
    summary = run_finetune(config, show_progress=False, log=print)
    print(f"{name}: test {summary['test']}")
    return summary


@pytest.mark.slow
def test_minilm_reaches_90_percent_on_held_out_translation_pairs(tmp_path):
    from attnlab.finetune.tasks import lexicon_pairs, translation_pairs
    from attnlab.interop.sentence import minilm_folder

    words = _finetune("translation_pairs_lexicon_minilm.json",
                      lexicon_pairs(tmp_path / "lexicon", seed=0, vocabulary=minilm_folder() / "vocab.txt"),
                      tmp_path / "lexicon-out")
    assert words["test"]["accuracy"] >= 0.7, words["test"]  # the intermediate task was learnt
    summary = _finetune("translation_pairs_minilm.json", translation_pairs(tmp_path / "pairs", seed=0),
                        tmp_path / "out", model=str(tmp_path / "lexicon-out" / "model"))
    assert summary["test"]["n"] == 1000
    assert summary["test"]["accuracy"] >= 0.90, summary["test"]
