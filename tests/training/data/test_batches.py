"""The pipeline's data checks: characters a character tokenizer lacks are named once per split
when the split is tokenised (they would be read as `<unk>` without a word)."""

import warnings

import pytest

from attnlab.training.config import DataConfig
from attnlab.training.data.batches import DataPipeline

WORDS = "the king queen lord speak hath thou thee love death night day sword crown blood".split()


def _build(cfg, out):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeline = DataPipeline.build(cfg, out, show_progress=False)
    return pipeline, [str(w.message) for w in caught if "character vocabulary" in str(w.message)]


def test_characters_outside_a_char_vocabulary_are_warned_once_per_split(tmp_path, isolated_cache):
    lines = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(6)) for i in range(60)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[:20]) + "\ncafé über Ωmega Ω\n")
    cfg = DataConfig(source=str(tmp_path / "train.txt"), valid=str(tmp_path / "valid.txt"), seq_len=8, batch_size=2,
                     tokenizer={"kind": "char"})
    pipeline, caught = _build(cfg, tmp_path / "run")
    tok = pipeline.tokenizer
    missing = sorted({c for c in (tmp_path / "valid.txt").read_text() if c not in tok.model.vocab})
    assert missing == sorted("fmüéΩ")  # the training split has no 'f' or 'm'
    n = int((pipeline.valid.tokens == tok.unk_token_id).sum())  # what the model will read as <unk>
    assert n == 6 and int((pipeline.train.tokens == tok.unk_token_id).sum()) == 0
    assert caught == [f"data.valid {str(tmp_path / 'valid.txt')!r}: 6 character(s) are not in the character "
                      "vocabulary and are encoded as '<unk>' (5 distinct, most frequent: 'Ω', 'f', 'm', 'é', 'ü'); "
                      "train the tokenizer on text that holds them"]
    assert _build(cfg, tmp_path / "run")[1] == []  # the cached split: said when it was tokenised


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_other_tokenizers_are_not_checked_by_character(tmp_path, isolated_cache, kind):
    (tmp_path / "train.txt").write_text(" ".join(WORDS) * 40 + "\n")
    (tmp_path / "valid.txt").write_text(" ".join(WORDS) * 5 + "\nΩmega café\n")
    size = {"bpe": 300}.get(kind)
    cfg = DataConfig(source=str(tmp_path / "train.txt"), valid=str(tmp_path / "valid.txt"), seq_len=8, batch_size=2,
                     tokenizer={"kind": kind, "vocab_size": size})
    assert _build(cfg, tmp_path / "run")[1] == []


@pytest.mark.parametrize("name, content", [("train.jsonl", '{"text": ""}\n{"text": "  \\n "}\n'),
                                           ("train.txt", "\n \n\t\n")])
def test_a_source_of_blank_texts_is_refused_before_a_tokenizer_is_trained(tmp_path, isolated_cache, name, content):
    (tmp_path / name).write_text(content)
    (tmp_path / "valid.txt").write_text(" ".join(WORDS) + "\n")
    cfg = DataConfig(source=str(tmp_path / name), valid=str(tmp_path / "valid.txt"), seq_len=8, batch_size=2)
    with pytest.raises(ValueError, match=rf"^data.source {str(tmp_path / name)!r}: no text in it"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()  # no tokenizer.json trained on nothing
