"""GPT-2's byte alphabet and split pattern."""

from __future__ import annotations

import regex
from hypothesis import given
from hypothesis import strategies as st

from attnlab.tokenizers.bytelevel import (
    GPT2_PATTERN, alphabet, byte_to_char, char_to_byte, decode_byte_tokens, split_text, to_byte_chars,
)

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


def test_byte_alphabet_is_a_printable_bijection():
    table = byte_to_char()
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā"
    assert alphabet()[:3] == ["!", '"', "#"] and alphabet()[-1] == "Ń"
    assert all(char_to_byte()[c] == b for b, c in table.items())


@given(TEXT)
def test_byte_chars_round_trip(text):
    assert decode_byte_tokens([to_byte_chars(text)]) == text


def test_tokens_outside_the_alphabet_decode_as_themselves():
    assert decode_byte_tokens(["Hello", "Ġ", "<my special>", "Ġworld"]) == "Hello <my special> world"


@given(TEXT)
def test_split_covers_the_text(text):
    for pattern in (GPT2_PATTERN, r"[a-z]+"):  # the second leaves gaps, which are kept
        pieces = split_text(text, regex.compile(pattern))
        assert "".join(pieces) == text
        assert all(pieces)


def test_gpt2_split():
    pieces = split_text("I'm  here, 12345 times!\n\n", regex.compile(GPT2_PATTERN))
    assert pieces == ["I", "'m", " ", " here", ",", " 12345", " times", "!", "\n\n"]
