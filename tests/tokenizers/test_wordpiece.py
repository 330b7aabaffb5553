"""WordPiece: BERT's real vocab.txt gives BertTokenizerFast's ids, alone and in pairs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.wordpiece import WordPieceModel, greedy_pieces, split_words
from tokenizer_samples import VARIED_TEXTS

# Scripts whose character classes are the same in Python's Unicode 14 tables and in those of
# Hugging Face's Rust crates (see normalizers.py): ASCII with controls, Latin, combining
# marks, Greek, Cyrillic, general punctuation, CJK, kana, Hangul, full-width forms, emoji.
_RANGES = [(0x0, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x2000, 0x206F), (0x3000, 0x30FF),
           (0x4E00, 0x4EFF), (0xAC00, 0xAC80), (0xFF00, 0xFFEF), (0xFFFD, 0xFFFD), (0x1F300, 0x1F64F)]
MATURE_TEXT = st.text(st.one_of([st.characters(min_codepoint=lo, max_codepoint=hi) for lo, hi in _RANGES]),
                      max_size=60)


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_matches_bert_tokenizer_fast(bert_shared, hf_bert, text):
    assert bert_shared.encode(text) == hf_bert.encode(text, add_special_tokens=False)
    assert bert_shared.encode(text, add_special_tokens=True) == hf_bert.encode(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=MATURE_TEXT)
def test_matches_bert_tokenizer_fast_on_random_text(bert_shared, hf_bert, text):
    assert bert_shared.encode(text) == hf_bert.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("first, second", [
    ("Hello, world!", "How are you?"),
    ("The café's naïve résumé", "中文 and 日本語"),
    ("", "only second"),
    ("[CLS] inside [SEP] text [MASK]", "x [PAD] y"),
])
def test_pairs_match_bert_tokenizer_fast(bert_shared, hf_bert, first, second):
    ours = bert_shared(first, second)
    theirs = hf_bert(first, second)
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["token_type_ids"] == theirs["token_type_ids"]
    assert ours["attention_mask"] == theirs["attention_mask"]
    assert ours["input_ids"][0] == bert_shared.cls_token_id == 101
    assert ours["input_ids"].count(bert_shared.sep_token_id) >= 2


def test_special_tokens_in_text_are_kept_whole(bert_shared, hf_bert):
    text = "[CLS] x [MASK] y [SEP]"
    assert bert_shared.tokenize(text) == ["[CLS]", "x", "[MASK]", "y", "[SEP]"]
    assert bert_shared.encode(text) == hf_bert.encode(text, add_special_tokens=False)


def test_long_words_become_unk(bert_shared):
    unk = bert_shared.unk_token_id
    assert bert_shared.encode("a" * 100) != [unk]  # 100 characters: still split
    assert bert_shared.encode("a" * 101) == [unk]  # over max_input_chars_per_word
    assert bert_shared.encode("ok " + "b" * 101 + " ok") == [bert_shared.token_to_id("ok"), unk,
                                                             bert_shared.token_to_id("ok")]


def test_unspellable_word_is_one_unk():
    model = WordPieceModel({"[UNK]": 0, "ab": 1, "##c": 2}, normalizer=None)
    assert model.encode_text("abc abx") == [1, 2, 0]


@pytest.mark.parametrize("text", VARIED_TEXTS[:12])
def test_decode_matches_hf_decoder(bert_shared, hf_bert, text):
    ids = hf_bert.encode(text)
    backend = hf_bert.backend_tokenizer
    assert bert_shared.decode(ids) == backend.decode(ids, skip_special_tokens=False)
    assert bert_shared.decode(ids, skip_special_tokens=True) == backend.decode(ids, skip_special_tokens=True)


def test_cased_loading_matches_hf(bert_dir):
    import transformers
    lines = (bert_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    hf = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(lines)}, do_lower_case=False)
    ours = Tokenizer.load(bert_dir / "vocab.txt", lowercase=False)
    for text in VARIED_TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False)


def test_greedy_longest_match_first():
    vocab = {"un": 0, "##aff": 1, "##able": 2, "una": 3, "##ffable": 4}
    assert greedy_pieces("unaffable", vocab) == ["una", "##ffable"]  # longest first piece wins
    assert greedy_pieces("unaffable", {"un": 0, "##aff": 1, "##able": 2}) == ["un", "##aff", "##able"]
    assert greedy_pieces("xyz", vocab) is None


def test_split_words():
    assert split_words("Hello,  world! (ok)\tgo") == ["Hello", ",", "world", "!", "(", "ok", ")", "go"]
    assert split_words("$5+3^2") == ["$", "5", "+", "3", "^", "2"]  # ASCII symbols split too


def test_model_needs_its_unk_token():
    with pytest.raises(ValueError, match="unk_token"):
        WordPieceModel({"a": 0}, unk_token="[UNK]")
