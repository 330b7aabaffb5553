"""The tokenizer.json of Llama-family models, read by attnlab.Tokenizer.load, encodes and decodes
as Hugging Face `tokenizers` does: the byte-level BPE of Qwen2 (NFC, a regex Split, then
ByteLevel without its own regex) and of Llama 3 (no normalizer, `ignore_merges`), each trained
here with `tokenizers` on the same small corpus; and the SentencePiece-style BPE of Llama 2 and
Mistral (characters, "▁" for spaces, byte fallback)."""

import json

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import attnlab
from tests.tokenizers.tokenizer_samples import VARIED_TEXTS, training_corpus

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(split: str, nfc: bool, ignore_merges: bool) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    return tok


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_byte_level_bpe_encodes_and_decodes_as_tokenizers(tmp_path, style):
    theirs = _byte_level(QWEN2_SPLIT if style == "qwen2" else LLAMA3_SPLIT, nfc=style == "qwen2",
                         ignore_merges=style == "llama3")
    theirs.save(str(tmp_path / "tokenizer.json"))
    ours = attnlab.Tokenizer.load(tmp_path / "tokenizer.json")
    texts = VARIED_TEXTS + ["<|im_start|>user\nhello<|endoftext|>"]
    for text in texts:
        ids = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False), text
    assert ours.token_to_id("<|endoftext|>") == theirs.token_to_id("<|endoftext|>")


def _sentencepiece_style(metaspace: bool, byte_fallback: bool = True) -> Tokenizer:
    """A Llama-2-style tokenizer: BPE over characters with byte fallback, "▁" for spaces (legacy
    Prepend + Replace normalizers, or a Metaspace pre-tokenizer), <s> added in front."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    # a small alphabet: most characters of the varied texts are spelled by their bytes (or are unknown)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    data = json.loads(tok.to_str())  # the 256 byte tokens go after the specials, as in Llama 2's vocabulary
    learned = sorted(((t, i) for t, i in data["model"]["vocab"].items() if i > 2), key=lambda ti: ti[1])
    data["model"]["vocab"] = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)},
                              **{t: 259 + n for n, (t, _) in enumerate(learned)}}
    return Tokenizer.from_str(json.dumps(data))


@pytest.mark.parametrize("style", ["legacy", "metaspace", "unk-without-byte-fallback"])
def test_sentencepiece_style_bpe_encodes_and_decodes_as_tokenizers(tmp_path, style):
    theirs = _sentencepiece_style(metaspace=style == "metaspace", byte_fallback=style != "unk-without-byte-fallback")
    theirs.save(str(tmp_path / "tokenizer.json"))
    ours = attnlab.Tokenizer.load(tmp_path / "tokenizer.json")
    fell_back = 0
    for text in VARIED_TEXTS + [" two  spaces", "▁already", "<s>inside</s> text"]:
        ids = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text).ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False), text
        fell_back += any(theirs.id_to_token(i).startswith("<0x") for i in ids)
    assert fell_back > 3 if style != "unk-without-byte-fallback" else fell_back == 0  # the fallback was exercised
    ours.save(tmp_path / "again")  # written back as it was read
    again = Tokenizer.from_file(str(tmp_path / "again" / "tokenizer.json"))
    assert [again.encode(t).ids for t in VARIED_TEXTS] == [theirs.encode(t).ids for t in VARIED_TEXTS]


def test_sentencepiece_style_blocks_attnlab_does_not_compute_are_refused_by_name(tmp_path):
    tok = _sentencepiece_style(metaspace=True)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"^normalizer/pre_tokenizer: a SentencePiece-style BPE .*prepend_scheme"):
        attnlab.Tokenizer.load(tmp_path / "tokenizer.json")
