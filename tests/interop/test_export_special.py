"""Special tokens of an exported Hugging Face folder: every `*_token_id` transformers knows is
written, inside the vocabulary (transformers loads the folder without a warning about them),
from the tokenizer when there is one; tokenizer_config.json makes transformers tokenize as
attnlab does."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
import transformers

import attnlab
from attnlab.interop import from_hf, hf_export, save_hf
from attnlab.interop.api import FAMILIES
from attnlab.interop.special import special_token_ids
from attnlab.tokenizers import Tokenizer
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

V = 30  # far below GPT-2's 50256 and Marian's 58100, above BART's and T5's defaults
TOKEN_MESSAGE = re.compile(r"token_id|\b(bos|eos|pad)\b", re.IGNORECASE)


@contextmanager
def transformers_messages() -> Iterator[list[str]]:
    """Every message transformers logs at warning level or above, and every Python warning,
    raised inside the block (the list is complete once the block has exited)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger("transformers"), Keep()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    getattr(transformers.utils.logging.warning_once, "cache_clear", lambda: None)()  # once-only warnings (v4)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
        messages += [str(w.message) for w in caught]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def token_messages(messages: list[str]) -> list[str]:
    """The messages that are about bos/eos/pad or another `*_token_id`."""
    return [m for m in messages if TOKEN_MESSAGE.search(m)]


def token_ids(config) -> dict[str, object]:
    """Every `*_token_id` field of a transformers config."""
    return {k: getattr(config, k) for k in config.to_dict() if k.endswith("_token_id")}


def _from_transformers(config) -> torch.nn.Module:
    model = getattr(transformers, config.architectures[0])(config)
    return from_hf(model)


def tiny_model(family: str) -> torch.nn.Module:
    """A small attnlab model of `family` with a vocabulary of V."""
    small = dict(num_layers=1, d_model=24, num_heads=2, d_ff=32, vocab_size=V)
    preset = {"gpt2": "tiny-decoder", "bert": "bert-base", "t5": "t5-small"}.get(family)
    if preset is not None:
        cfg = attnlab.presets.get(preset, **small)
        if cfg.position.scheme == "learned":
            cfg = cfg.replace(position={"scheme": "learned", "max_len": 16})
        return attnlab.build_model(cfg).eval()
    seq2seq = dict(vocab_size=V, d_model=24, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16)
    if family == "bart":
        return _from_transformers(transformers.BartConfig(architectures=["BartForConditionalGeneration"], **seq2seq))
    return _from_transformers(transformers.MarianConfig(architectures=["MarianMTModel"], pad_token_id=V - 1,
                                                        decoder_start_token_id=V - 1, **seq2seq))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.MODEL_TYPE)
def test_family_defaults_are_transformers_own(family):
    reference = transformers.AutoConfig.for_model(family.MODEL_TYPE)
    for field, (_, default) in family.SPECIAL_TOKENS.items():
        assert getattr(reference, field) == default, field


@pytest.mark.parametrize("family", [f.MODEL_TYPE for f in FAMILIES])
def test_export_without_a_tokenizer_loads_without_a_token_id_warning(family, tmp_path):
    model = tiny_model(family)
    hf_config, architecture, _ = hf_export(model)
    known = token_ids(transformers.AutoConfig.for_model(family))
    assert set(known) <= set(hf_config), "a *_token_id field left to transformers' default"
    save_hf(model, tmp_path)
    with transformers_messages() as messages:
        loaded = getattr(transformers, architecture).from_pretrained(tmp_path)
    assert token_messages(messages) == []
    for field, value in token_ids(loaded.config).items():
        assert value is None or 0 <= value < V, (field, value)
    if family in ("bart", "t5", "marian"):  # defaults inside the vocabulary are kept
        assert loaded.config.eos_token_id == {"bart": 2, "t5": 1, "marian": 0}[family]


def test_a_tokenizer_decides_every_role_it_is_asked_for():
    tok = Tokenizer.train(["the king speaks"] * 3, kind="char",
                          special_tokens={"pad": "<pad>", "unk": "<unk>", "eos": "</s>"})
    fields = {"bos_token_id": ("bos", 0), "eos_token_id": ("eos", 50256), "decoder_start_token_id": ("eos", 2)}
    ids = special_token_ids({"vocab_size": tok.vocab_size}, fields, tok)
    eos = tok.token_to_id("</s>")
    # bos: the tokenizer has none, so None even though the default 0 lies inside the vocabulary
    assert ids == {"bos_token_id": None, "eos_token_id": eos, "decoder_start_token_id": eos}
    assert special_token_ids({"vocab_size": tok.vocab_size}, fields) == {
        "bos_token_id": 0, "eos_token_id": None, "decoder_start_token_id": 2}


def test_a_tokenizer_id_outside_the_vocabulary_is_refused():
    tok = SimpleNamespace(roles={"eos": "</s>"}, eos_token_id=12)
    with pytest.raises(ValueError, match=r"eos_token_id: the tokenizer's eos token '</s>' has id 12, outside the "
                                         r"model's vocabulary of 10"):
        special_token_ids({"vocab_size": 10}, {"eos_token_id": ("eos", None)}, tok)


@pytest.mark.parametrize("kind", ["char", "wordpiece", "bpe"])
def test_transformers_tokenizes_the_export_as_attnlab_does(kind, tmp_path):
    # without tokenizer_config.json, transformers took GPT-2's tokenizer class, which adds an
    # <|endoftext|> the char and WordPiece vocabularies lack: one id past the model's
    texts = ["the king speaks to the queen, and the queen answers."] * 4
    tok = Tokenizer.train(texts, kind=kind, vocab_size={"bpe": 280, "wordpiece": 60}.get(kind),
                          special_tokens={"char": ["<pad>", "<unk>", "</s>"]}.get(kind))
    cfg = attnlab.presets.get("tiny-decoder", num_layers=1, d_model=24, num_heads=2, d_ff=32,
                              vocab_size=tok.vocab_size, position={"scheme": "learned", "max_len": 16})
    save_hf(attnlab.build_model(cfg), tmp_path, tokenizer=tok)
    with transformers_messages() as messages:
        hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
        config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert token_messages(messages) == []
    text = "the queen speaks"
    assert len(hf_tok) == tok.vocab_size
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf_tok.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    assert hf_tok.model_max_length == 16
    for role in ("bos", "eos", "pad", "unk"):
        assert getattr(hf_tok, f"{role}_token") == tok.roles.get(role), role
    assert (config.bos_token_id, config.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)
