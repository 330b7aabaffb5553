"""Tokenizers: byte-level BPE, WordPiece, characters and words; readers and writers of common formats.

>>> from attnlab.tokenizers import Tokenizer
>>> tok = Tokenizer.train(["some text", "more text"] * 50, kind="char")
>>> tok.decode(tok.encode("text"))
'text'

See ``tokenizer.py`` for the API and ``pretrained.py`` for GPT-2's and BERT's vocabularies.
"""

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.bpe import BPEModel
from attnlab.tokenizers.bytelevel import GPT2_PATTERN
from attnlab.tokenizers.char import CharModel
from attnlab.tokenizers.pretrained import DownloadError, bert_uncased_files, gpt2_files, load_pretrained
from attnlab.tokenizers.special import ROLES, AddedToken
from attnlab.tokenizers.template import Template
from attnlab.tokenizers.tokenizer import Tokenizer
from attnlab.tokenizers.word import WordModel
from attnlab.tokenizers.wordpiece import WordPieceModel

__all__ = [
    "Tokenizer", "TokenModel", "BPEModel", "WordPieceModel", "CharModel", "WordModel", "AddedToken", "Template",
    "ROLES", "GPT2_PATTERN", "gpt2_files", "bert_uncased_files", "load_pretrained", "DownloadError",
]
