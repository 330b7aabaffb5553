"""A vocabulary size asked for and not reached (a small corpus runs out of merges) warns with
both sizes; one reached, or the default size, does not."""

import warnings

import pytest

from attnlab.tokenizers import Tokenizer

SMALL = ["hello world, the quick brown fox"] * 5


@pytest.mark.parametrize("kind,requested,ran_out_of", [
    ("bpe", 5000, "pairs to merge seen at least min_frequency=2 times"),
    ("wordpiece", 5000, "pieces seen at least min_frequency=2 times"),
    ("char", 500, "distinct characters;"),
    ("word", 500, "distinct words;"),
])
def test_a_size_not_reached_warns_with_both_numbers(kind, requested, ran_out_of):
    with pytest.warns(UserWarning, match=f"vocab_size={requested} was asked for") as record:
        tok = Tokenizer.train(SMALL, kind=kind, vocab_size=requested)
    assert tok.vocab_size < requested
    message = str(record[0].message)
    assert f"{tok.vocab_size} reached" in message and ran_out_of in message
    assert record[0].filename == __file__  # it points at the call, not inside attnlab


@pytest.mark.parametrize("kind,requested", [("bpe", 262), ("wordpiece", 40), ("char", 10), ("word", 5)])
def test_a_size_reached_or_the_default_does_not_warn(kind, requested):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tokenizer.train(SMALL, kind=kind, vocab_size=requested).vocab_size == requested
        assert Tokenizer.train(SMALL, kind=kind).vocab_size < 8000  # default size: nobody asked for it


def test_a_run_config_size_not_reached_warns_when_the_pipeline_trains(tmp_path, isolated_cache):
    from attnlab.training.config import DataConfig
    from attnlab.training.data.batches import DataPipeline

    (tmp_path / "train.txt").write_text("\n".join(SMALL * 20))
    (tmp_path / "valid.txt").write_text("\n".join(SMALL * 4))
    cfg = DataConfig(source=str(tmp_path / "train.txt"), valid=str(tmp_path / "valid.txt"), seq_len=8, batch_size=2,
                     tokenizer={"kind": "bpe", "vocab_size": 1000})
    with pytest.warns(UserWarning, match=r"vocab_size=1000 was asked for, \d+ reached"):
        pipe = DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    assert pipe.tokenizer.vocab_size < 1000
