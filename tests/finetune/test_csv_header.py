"""A header row of a CSV/TSV pairs file is never a training pair; every reader of delimited
files reads one dialect (attnlab.data.sources.csv_dialect, is_header)."""

import pytest

from attnlab.data.sources import is_header, read_pairs
from attnlab.finetune.data import read_examples

ROWS = [("Hello.", "Hallo."), ("Good night.", "Gute Nacht.")]


@pytest.mark.parametrize("header", ["src,tgt", "source,target", "English,German", "en,de", ",src,tgt",
                                    "source_text,target_text", "Source Text,Target Text"])
def test_a_csv_header_is_skipped(tmp_path, header):
    index = header.startswith(",")  # pandas' to_csv writes an unnamed index column first
    lines = [f"{i},{s},{t}" if index else f"{s},{t}" for i, (s, t) in enumerate(ROWS)]
    path = tmp_path / "pairs.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    columns = {"src_column": 1, "tgt_column": 2} if index else {}
    assert read_pairs(path, **columns) == ROWS


def test_a_tsv_header_after_blank_lines_is_skipped(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("\n\nenglish\tgerman\n" + "".join(f"{s}\t{t}\n" for s, t in ROWS))
    assert read_pairs(path) == ROWS


@pytest.mark.parametrize("first", [("Text", "Text"), ("house", "Haus"), ("Source", "Quelle"), ("src", "tgt x")])
def test_a_first_row_of_data_is_kept(tmp_path, first):
    # equal cells (a UI string translated as itself) or any word that is not a column name: data
    path = tmp_path / "pairs.csv"
    path.write_text("".join(f"{s},{t}\n" for s, t in [first, *ROWS]))
    assert read_pairs(path) == [first, *ROWS]


def test_only_the_first_row_can_be_a_header(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("Hello.,Hallo.\nsrc,tgt\n")
    assert read_pairs(path) == [("Hello.", "Hallo."), ("src", "tgt")]


def test_is_header_needs_known_distinct_names():
    assert is_header(["label", "text"]) and is_header(["Text", "text_pair", "label"])
    assert not is_header(["text", "text"]) and not is_header(["", ""]) and not is_header(["-", "en"])
    assert not is_header(["The king is dead.", "Der König ist tot."])


def test_fine_tuning_tsv_and_pairs_tsv_read_a_quote_alike(tmp_path):
    # one dialect for every delimited reader: in a TSV a quote is text, not quoting
    text = '"Hi," she said'
    (tmp_path / "examples.tsv").write_text(f"text\tlabel\n{text}\tpositive\n")
    (tmp_path / "pairs.tsv").write_text(f"{text}\t„Hallo“, sagte sie\n")
    assert read_examples(tmp_path / "examples.tsv")[0].text == text
    assert read_pairs(tmp_path / "pairs.tsv")[0][0] == text
