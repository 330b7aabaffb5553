import numpy as np
import pytest
import torch

from attnlab.data.sources import read_documents, read_pairs, read_pieces
from attnlab.data.tokenized import TokenFile, token_dtype


def encode(text):
    return [ord(c) % 200 for c in text]


def test_build_and_read_windows(tmp_path):
    docs = ["hello world", "second doc", "third"]
    tf = TokenFile.build(tmp_path / "t", docs, encode, 256, eos_id=255, show_progress=False)
    flat = sum((encode(d) + [255] for d in docs), [])
    assert len(tf) == len(flat) and tf.tokens.dtype == np.uint16
    assert tf.window(3, 5).tolist() == flat[3:8]
    assert tf.document(1).tolist() == encode("second doc") + [255]
    w1 = tf.random_windows(4, 6, torch.Generator().manual_seed(0))
    w2 = tf.random_windows(4, 6, torch.Generator().manual_seed(0))
    assert torch.equal(w1, w2) and w1.dtype == torch.long
    for row in w1.tolist():
        assert any(flat[i: i + 6] == row for i in range(len(flat) - 5))
    assert not list(tmp_path.glob(".tmp-*"))


def test_dtype_follows_vocabulary():
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_large_vocab_round_trip(tmp_path):
    tf = TokenFile.build(tmp_path / "big", ["x"], lambda _: [70_000, 3], 100_000, show_progress=False)
    assert tf.tokens.dtype == np.uint32 and tf.window(0, 2).tolist() == [70_000, 3]


def test_truncated_file_is_a_clear_error(tmp_path):
    TokenFile.build(tmp_path / "t", ["abcdefgh"], encode, 256, show_progress=False)
    data = (tmp_path / "t.bin").read_bytes()
    (tmp_path / "t.bin").write_bytes(data[:-4])
    with pytest.raises(ValueError, match="truncated"):
        TokenFile(tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="unfinished"):
        TokenFile(tmp_path / "missing")


def test_an_encoder_failure_leaves_nothing(tmp_path):
    def bad(text):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        TokenFile.build(tmp_path / "t", ["abc"], bad, 256, show_progress=False)
    assert list(tmp_path.iterdir()) == []


def test_streamed_pieces_equal_whole_documents(tmp_path):
    text = "\n".join(f"line {i} of the first document" for i in range(300)) + "\n\f\nsecond one\nends here\n"
    path = tmp_path / "c.txt"
    path.write_text(text)
    docs = list(read_documents(path))
    pieces = list(read_pieces(path, max_chars=500))
    assert len(pieces) > 3 and sum(ends for _, ends in pieces) == 2
    joined, current = [], ""
    for piece, ends in pieces:
        current += piece
        if ends:
            joined.append(current)
            current = ""
    assert joined == docs
    whole = TokenFile.build(tmp_path / "a", docs, encode, 256, eos_id=1, show_progress=False)
    streamed = TokenFile.build(tmp_path / "b", pieces, encode, 256, eos_id=1, show_progress=False)
    assert np.array_equal(whole.tokens, streamed.tokens) and np.array_equal(whole.offsets, streamed.offsets)


def test_pairs_from_tsv_csv_jsonl(tmp_path):
    (tmp_path / "p.tsv").write_text("Hello.\tHallo.\nBye.\tTschüss.\n\n")
    (tmp_path / "p.csv").write_text('"Hello, you.",Hallo.\n')
    (tmp_path / "p.jsonl").write_text('{"src": "a", "tgt": "b"}\n')
    assert read_pairs(tmp_path / "p.tsv") == [("Hello.", "Hallo."), ("Bye.", "Tschüss.")]
    assert read_pairs(tmp_path / "p.csv") == [("Hello, you.", "Hallo.")]
    assert read_pairs(tmp_path / "p.jsonl") == [("a", "b")]
    (tmp_path / "bad.tsv").write_text("only one column\n")
    with pytest.raises(ValueError, match="bad.tsv:1"):
        read_pairs(tmp_path / "bad.tsv")
    (tmp_path / "p.txt").write_text("x")
    with pytest.raises(ValueError, match="extension"):
        read_pairs(tmp_path / "p.txt")


def test_text_folder_and_jsonl_documents(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("one")
    (tmp_path / "d" / "b.md").write_text("two")
    (tmp_path / "d" / "skip.bin").write_text("no")
    assert list(read_documents(tmp_path / "d")) == ["one", "two"]
    (tmp_path / "x.jsonl").write_text('{"text": "t1"}\n{"body": "t2"}\n')
    with pytest.raises(ValueError, match="x.jsonl:2"):
        list(read_documents(tmp_path / "x.jsonl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(read_documents(tmp_path / "nope"))
