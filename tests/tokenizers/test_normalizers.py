"""BERT's normalization steps and the Hugging Face normalizer blocks attnlab reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.tokenizers.normalizers import (
    Normalizer, clean_text, is_punctuation, is_whitespace, lowercase, space_cjk, strip_accents,
)


def test_bert_normalizer_steps():
    assert clean_text("a\tb\x00c\u200bd\ufffde\u3000f") == "a bcde f"
    assert space_cjk("a中b") == "a 中 b"
    assert strip_accents("Café Ångström") == "Cafe Angstrom"
    assert lowercase("ΟΔΟΣ") == "οδοσ"  # one character at a time: no final sigma
    uncased = Normalizer.bert(lowercase=True)
    assert uncased("Héllo\tWORLD中") == "hello world 中 "
    assert Normalizer.bert(lowercase=False)("Héllo") == "Héllo"  # cased keeps accents


def test_unsupported_normalizer_names_the_type():
    with pytest.raises(ValueError, match="Precompiled"):
        Normalizer({"type": "Precompiled"})


def test_character_classes():
    assert all(is_whitespace(c) for c in " \t\n\r\u00a0\u2028\u3000")
    assert not is_whitespace("\u200b")  # zero-width space is a format character, dropped instead
    assert all(is_punctuation(c) for c in "!$+^`~«»¿、。")
    assert not any(is_punctuation(c) for c in "a1 中é")


@pytest.mark.parametrize("form", ["NFC", "NFD", "NFKC", "NFKD"])
def test_unicode_forms(form):
    import unicodedata

    text = "ﬁ Å e\u0301 ①"
    assert Normalizer({"type": form})(text) == unicodedata.normalize(form, text)


def test_sequence_runs_in_order():
    seq = Normalizer({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})
    assert seq("ＡＢＣ") == "abc"


@given(st.text(max_size=40))
def test_bert_normalizer_matches_hf_on_mature_scripts(text):
    from tokenizers import normalizers
    text = "".join(c for c in text if ord(c) < 0x0600 or 0x2000 <= ord(c) <= 0x206F or 0x4E00 <= ord(c) <= 0x9FFF)
    for lower in (True, False):
        ref = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                         lowercase=lower)
        assert Normalizer.bert(lowercase=lower)(text) == ref.normalize_str(text)


def test_ascii_fast_path_matches_hf():
    from tokenizers import normalizers
    text = "".join(map(chr, range(128))) * 2
    for lower in (True, False):
        ref = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                         lowercase=lower)
        assert Normalizer.bert(lowercase=lower)(text) == ref.normalize_str(text)
