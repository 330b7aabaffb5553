"""Data: sources (files, built-in corpora fetched into a cache), token files read by windows,
and pretraining objectives.

    from attnlab.data import corpora, TokenFile, objectives
    folder = corpora.fetch("shakespeare")
"""

from attnlab.data import corpora, objectives
from attnlab.io.cache import cache_dir
from attnlab.data.sources import read_documents, read_pairs, read_pieces, resolve_source
from attnlab.data.tokenized import TokenFile

__all__ = ["TokenFile", "cache_dir", "corpora", "objectives", "read_documents", "read_pairs", "read_pieces",
           "resolve_source"]
