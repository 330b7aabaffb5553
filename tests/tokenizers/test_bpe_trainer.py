"""BPE training gives exactly the merges and vocabulary of Hugging Face's BpeTrainer.

The two agree on tie-breaking (equal counts: the pair with the smaller ids first; ids: the
specials, then the byte alphabet in code point order, then merges in order), so equality is
exact, on real text (the Python reference manual's prose and code, which ships with Python),
and on small random corpora full of ties.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter
from pathlib import Path

import pydoc_data.topics
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import tokenizers as hf

from attnlab.tokenizers import Tokenizer, corpus as corpus_module
from attnlab.tokenizers.bpe_trainer import _merge_pair, train_bpe
from attnlab.tokenizers.bytelevel import to_byte_chars
from tokenizer_samples import training_corpus


def hf_train(lines_or_file, vocab_size, min_frequency, special_tokens):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = hf.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    if isinstance(lines_or_file, Path):
        tok.train([str(lines_or_file)], trainer)
    else:
        tok.train_from_iterator(lines_or_file, trainer)
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
    if not "".join(lines).strip():  # HF saves a tokenizer of nothing; ours names the empty corpus instead
        with pytest.raises(ValueError, match="no text"):
            Tokenizer.train(lines, kind="bpe", vocab_size=vocab_size, min_frequency=min_frequency)
        return
    theirs = hf_train(lines, vocab_size, min_frequency, ["<|endoftext|>"])
    ours = Tokenizer.train(lines, kind="bpe", vocab_size=vocab_size, min_frequency=min_frequency)
    assert ours.model.merges == hf_merges(theirs)
    assert ours.get_vocab() == theirs.get_vocab()


@pytest.mark.parametrize("vocab_size", [3000, 12000])  # 12,000: more than the text has pairs for (it stops)
def test_same_merges_as_hf_on_real_text(tmp_path: Path, monkeypatch, vocab_size):
    """The Python reference manual (465k characters of prose and examples), read from a file in
    chunks of a few lines (as a corpus larger than memory is), against HF reading the file."""
    path = tmp_path / "reference.txt"
    path.write_text("".join(pydoc_data.topics.topics.values()), encoding="utf-8", newline="")
    monkeypatch.setattr(corpus_module, "CHUNK_CHARS", 300)
    theirs = hf_train(path, vocab_size, 2, ["<|endoftext|>"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (12,000 is not reached)
        ours = Tokenizer.train(path, kind="bpe", vocab_size=vocab_size)
    assert len(ours.model.merges) > 2500
    assert ours.model.merges == hf_merges(theirs)
    assert ours.get_vocab() == theirs.get_vocab()


def _pairs(words, counts, merged):
    """Reference: the weighted count of every adjacent pair, recounted from scratch."""
    total: Counter = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            if pair != merged:
                total[pair] += count
    return total


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=9), min_size=1, max_size=6),
       data=st.data())
def test_merge_pair_keeps_counts_equal_to_a_recount(words, data):
    """After merging (1, 2) -> 7 in every word, the counts kept up to date around the merges are
    those of a recount (the merged pair's own count aside: it is never offered again), each word
    is merged left to right, and each new pair is reported with every word it is in."""
    shift = 3
    counts = data.draw(st.lists(st.integers(1, 5), min_size=len(words), max_size=len(words)))
    before = _pairs(words, counts, None)
    pair_counts = {a << shift | b: n for (a, b), n in before.items()}
    merged = [list(w) for w in words]
    formed = _merge_pair(merged, counts, pair_counts, list(range(len(words))), 1, 2, 7, shift)
    after = _pairs(merged, counts, (1, 2))
    kept = {k: n for k, n in pair_counts.items() if k != 1 << shift | 2}
    assert kept == {a << shift | b: n for (a, b), n in after.items()}
    assert merged == [_merge_left_to_right(w, (1, 2), 7) for w in words]
    for w, word in enumerate(merged):
        for a, b in zip(word, word[1:]):
            if 7 in (a, b):
                found = formed[a << shift | b]
                assert w in ([found] if isinstance(found, int) else found)


def _merge_left_to_right(word, pair, new_id):
    out, i = [], 0
    while i < len(word):
        if tuple(word[i:i + 2]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


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


def test_text_that_is_not_unicode_is_a_clear_error():
    with pytest.raises(ValueError, match="lone surrogate"):
        Tokenizer.train(["fine", "broken \ud800 text"], kind="bpe", vocab_size=300)


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
