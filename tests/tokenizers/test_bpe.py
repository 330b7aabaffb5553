"""Byte-level BPE: GPT-2's files give tiktoken's and transformers' ids; decoding round-trips."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import bpe
from attnlab.tokenizers.bpe import BPEModel, apply_merges
from attnlab.tokenizers.bytelevel import alphabet
from tokenizer_samples import VARIED_TEXTS

# Any Unicode text: all planes, combining marks, controls, whitespace (surrogates excluded:
# they have no UTF-8 encoding).
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
# Text from a few characters that make long, tricky runs (spaces, apostrophes, digits...).
RUNS_TEXT = st.text(st.sampled_from(list(" \t\n'sdtlmvre0123456789aéZ!?.,😀中\u0301\u00a0\u3000")), max_size=80)


def test_hello_world(gpt2_shared):
    assert gpt2_shared.encode("Hello world!") == [15496, 995, 0]
    assert gpt2_shared.vocab_size == 50257
    assert gpt2_shared.eos_token_id == gpt2_shared.bos_token_id == 50256


def test_gpt2_gives_the_byte_alphabet_ids_0_to_255(gpt2_shared):
    assert [gpt2_shared.id_to_token(i) for i in range(256)] == alphabet()


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_gpt2_matches_tiktoken(gpt2_shared, tiktoken_gpt2, text):
    assert gpt2_shared.encode(text) == tiktoken_gpt2.encode_ordinary(text)


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_gpt2_matches_transformers(gpt2_shared, hf_gpt2, text):
    assert gpt2_shared.encode(text) == hf_gpt2.encode(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(ANY_TEXT, RUNS_TEXT))
@example(text="x <|endoftext|>y<|endoftext|")
def test_gpt2_matches_tiktoken_on_random_text(gpt2_shared, tiktoken_gpt2, text):
    # special tokens written in the text are never split (Hypothesis also draws strings found in
    # the source, such as "<|endoftext|>"): tiktoken's allowed_special="all" has the same rule
    assert gpt2_shared.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(ANY_TEXT, RUNS_TEXT))
def test_decode_inverts_encode(gpt2_shared, text):
    assert gpt2_shared.decode(gpt2_shared.encode(text)) == text


def test_decode_of_a_cut_character_gives_replacement(gpt2_shared):
    ids = gpt2_shared.encode("😀")
    assert len(ids) > 1  # the emoji's four bytes take several tokens
    assert gpt2_shared.decode(ids[:1]) == "\ufffd"


def test_cache_gives_the_same_ids(gpt2_dir):
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.load(gpt2_dir)
    first = tok.encode_batch(VARIED_TEXTS)
    assert tok.model._cache  # words were cached
    assert tok.encode_batch(VARIED_TEXTS) == first
    tok.model._cache.clear()
    tok.model.CACHE_SIZE = 3  # forces the cache to clear itself while encoding
    assert tok.encode_batch(VARIED_TEXTS) == first


def test_apply_merges_lowest_rank_first():
    ranks = {("a", "b"): 1, ("b", "c"): 0, ("a", "bc"): 2}
    assert apply_merges("abc", ranks) == ["abc"]  # bc first, then a+bc
    assert apply_merges("abab", ranks) == ["ab", "ab"]
    assert apply_merges("aaa", {("a", "a"): 0}) == ["aa", "a"]  # left to right, no overlap
    assert apply_merges("", ranks) == []
    long = "aaaaaaa" + "b" + "ab" * 2  # past SHORT_WORD: the heap takes it, with the same rules
    assert len(long) > bpe.SHORT_WORD
    assert apply_merges(long, {("a", "a"): 0, ("a", "b"): 1}) == ["aa", "aa", "aa", "ab", "ab", "ab"]
    assert apply_merges("x" * 9, {}) == ["x"] * 9


def test_long_words_merge_as_the_rescanning_loop_merges_them(monkeypatch):
    """The heap path (words longer than SHORT_WORD) against the rescanning loop, on a merge table
    BPE learned from text over a small alphabet (long words, many merges, repeated pairs)."""
    import random

    from attnlab.tokenizers import Tokenizer

    rng = random.Random(0)
    word = lambda: "".join(rng.choice("abcab ") for _ in range(rng.randint(7, 60))).replace(" ", "")
    texts = [" ".join(word() for _ in range(20)) for _ in range(300)]
    ranks = Tokenizer.train(texts, kind="bpe", vocab_size=600, lowercase=False).model.ranks
    words = [w for w in (word() for _ in range(2000)) if len(w) > bpe.SHORT_WORD]
    by_heap = [apply_merges(w, ranks) for w in words]
    monkeypatch.setattr(bpe, "SHORT_WORD", 10**9)  # every word through the rescanning loop
    assert by_heap == [apply_merges(w, ranks) for w in words]
    assert sum(map(len, by_heap)) < sum(map(len, words)) / 2  # the table merged a lot


def test_model_rejects_merges_outside_vocab():
    with pytest.raises(ValueError, match="merges"):
        BPEModel({"a": 0, "b": 1}, [("a", "b")])


def test_model_rejects_bad_pattern():
    with pytest.raises(ValueError, match="pattern"):
        BPEModel({"a": 0}, [], pattern="(unclosed")


def test_no_pattern_keeps_text_whole():
    model = BPEModel({"a": 0, "Ġ": 1, "Ġa": 2}, [("Ġ", "a")], pattern=None)
    assert model.encode_text("a a") == [0, 2]
    assert model.pieces("a a") == ["a a"]


def test_lone_surrogate_is_a_value_error(gpt2_shared):
    with pytest.raises(ValueError, match="text"):
        gpt2_shared.encode("a\ud800b")


def test_bytes_missing_from_the_vocabulary_become_unk_or_are_dropped():
    """A vocabulary without every byte (not byte-level complete): a missing byte gives unk_token
    when there is one, else nothing (as Hugging Face's BPE does), and merges around it still apply."""
    from attnlab.tokenizers.bytelevel import to_byte_chars

    vocab = {"a": 0, "b": 1, "ab": 2, "<unk>": 3}
    with_unk = BPEModel(vocab, [("a", "b")], unk_token="<unk>")
    assert with_unk.encode_text("abzab") == [2, 3, 2]
    assert with_unk.encode_text("é") == [3, 3]  # two UTF-8 bytes, each unknown
    assert to_byte_chars("é") not in vocab
    assert BPEModel(vocab, [("a", "b")]).encode_text("abzab") == [2, 2]
    # a missing byte next to a known symbol must not look like another pair of ids to the merge table
    dense = {to_byte_chars(chr(c)): c - 97 for c in range(97, 123)}  # a-z as ids 0-25
    dense.update({"ab": 26, "<unk>": 27})
    for left in "abcdxyz":  # d (3), R (byte 82): once the key of (a, b) when missing bytes had negative ids
        for missing in "ABRZé":
            model = BPEModel(dense, [("a", "b")], unk_token="<unk>")
            assert model.encode_text(left + missing) == [dense[left]] + [27] * len(missing.encode())
