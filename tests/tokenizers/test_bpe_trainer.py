"""BPE training gives exactly the merges and vocabulary of Hugging Face's BpeTrainer.

The two agree on tie-breaking (equal counts: the pair with the smaller ids first; ids: the
specials, then the byte alphabet in code point order, then merges in order), so equality is
exact, including on small random corpora full of ties.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import tokenizers as hf

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.bpe_trainer import _merge_word, train_bpe
from attnlab.tokenizers.bytelevel import to_byte_chars
from tokenizer_samples import training_corpus


def hf_train(lines, vocab_size, min_frequency, special_tokens):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = hf.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def hf_merges(tok) -> list[tuple[str, str]]:
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]


@pytest.fixture(scope="module")
def corpus():
    return training_corpus()


@pytest.mark.parametrize("vocab_size, min_frequency, specials", [
    (300, 2, ["<|endoftext|>"]),
    (1000, 2, ["<pad>", "<|endoftext|>"]),
    (1500, 5, []),
    (700, 0, ["<s>", "</s>", "<unk>"]),
])
def test_same_merges_and_vocab_as_hf(corpus, vocab_size, min_frequency, specials):
    theirs = hf_train(corpus, vocab_size, min_frequency, specials)
    ours = Tokenizer.train(corpus, kind="bpe", vocab_size=vocab_size, min_frequency=min_frequency,
                           special_tokens=specials)
    assert ours.model.merges == hf_merges(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.vocab_size == theirs.get_vocab_size()
    sample = corpus[::7]
    assert ours.encode_batch(sample) == [e.ids for e in theirs.encode_batch(sample)]


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(st.sampled_from(list("aabbc  \n'é😀")), max_size=30), max_size=15),
       extra=st.integers(0, 40), min_frequency=st.integers(0, 3))
def test_same_merges_as_hf_on_tie_heavy_corpora(lines, extra, min_frequency):
    vocab_size = 257 + extra
    theirs = hf_train(lines, vocab_size, min_frequency, ["<|endoftext|>"])
    ours = Tokenizer.train(lines, kind="bpe", vocab_size=vocab_size, min_frequency=min_frequency)
    assert ours.model.merges == hf_merges(theirs)
    assert ours.get_vocab() == theirs.get_vocab()


def test_merge_word_reports_count_changes():
    word = [1, 2, 2, 2, 3]
    changes = _merge_word(word, 2, 2, 9)
    assert word == [1, 9, 2, 3]  # left to right, no overlap
    assert changes == [((1, 2), -1), ((1, 9), 1), ((2, 2), -1), ((9, 2), 1)]


def test_vocab_holds_specials_bytes_then_merges():
    vocab, merges = train_bpe({to_byte_chars(" hello"): 5, to_byte_chars("hello"): 3}, 262, ["<pad>"])
    assert vocab["<pad>"] == 0
    assert vocab["!"] == 1 and vocab["Ā"] == 1 + 188  # bytes in code point order after the specials
    assert len(vocab) == 262 and len(merges) == 262 - 257
    # "he", "el", "ll", "lo" all occur 8 times: the tie goes to the smallest ids, ("e", "l").
    assert merges[0] == ("e", "l")


def test_min_frequency_stops_merging():
    vocab, merges = train_bpe({"ab": 3, "cd": 1}, 1000, min_frequency=2)
    assert merges == [("a", "b")]
    vocab, merges = train_bpe({"ab": 3, "cd": 1}, 1000, min_frequency=4)
    assert merges == []


def test_special_tokens_in_the_corpus_are_not_learned():
    tok = Tokenizer.train(["x<|endoftext|>y"] * 50, kind="bpe", vocab_size=300)
    assert not any("endoftext" in a + b for a, b in tok.model.merges)
    assert tok.encode("x<|endoftext|>y") == [tok.token_to_id("x"), tok.eos_token_id, tok.token_to_id("y")]


def test_files_train_like_their_lines(tmp_path: Path, corpus):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(corpus), encoding="utf-8", newline="")
    from_file = Tokenizer.train(path, kind="bpe", vocab_size=500)
    from_lines = Tokenizer.train(corpus, kind="bpe", vocab_size=500)
    from_paths = Tokenizer.train([path, path], kind="bpe", vocab_size=500)
    assert from_file.model.merges == from_lines.model.merges
    assert from_paths.get_vocab().keys() >= {"<|endoftext|>"}


def test_vocab_size_below_bytes_and_specials_is_rejected():
    with pytest.raises(ValueError, match="vocab_size must be at least 258"):
        Tokenizer.train(["hello"], kind="bpe", vocab_size=257, special_tokens=["<a>", "<b>"])


def test_progress_goes_to_stderr(capsys):
    Tokenizer.train(["hello world"] * 20, kind="bpe", vocab_size=270, show_progress=True)
    err = capsys.readouterr().err
    assert "merges" in err and "reading corpus" in err


@pytest.mark.slow
def test_one_megabyte_trains_in_under_a_minute(corpus):
    big = corpus * (1_000_000 // sum(map(len, corpus)) + 1)
    start = time.perf_counter()
    tok = Tokenizer.train(big, kind="bpe", vocab_size=2000)
    assert time.perf_counter() - start < 60
    assert tok.vocab_size == 2000
