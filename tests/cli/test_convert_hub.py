"""`attnlab convert hf:ORG/NAME OUT` with HF_HUB_OFFLINE=1, from a Hub cache holding a random
small transformers GPT-2 (GPT-2's real 50,257-token vocabulary) and BERT (BERT's real uncased
WordPiece vocabulary), each with the tokenizer files a Hub repository has: the converted model
gives the transformers model's logits and tokenises as the reference tokenizer does; a model that
is not cached is a one-line error naming it."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from attnlab.cli.main import main
from attnlab.interop.serialization import load
from attnlab.tokenizers import pretrained
from tests.interop.helpers import TOL, randomize, real_max_diff
from tests.interop.hub_cache import cache_folder

TEXT = "Hello world! Attention is all you need."


@pytest.fixture(scope="module")
def gpt2_vocab():
    vocab_dir = pretrained.gpt2_files()
    vocab = json.loads((vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (vocab_dir / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    return vocab, [tuple(line.split(" ")) for line in lines if line]


@pytest.fixture(scope="module")
def bert_vocab():
    lines = (pretrained.bert_uncased_files() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines)}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hub cache under tmp_path."""
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf-cache"


def gpt2_repository(folder, vocab, merges):
    """(model, tokenizer): a random small GPT2LMHeadModel over GPT-2's vocabulary, saved with its
    tokenizer (tokenizer.json, vocab.json, merges.txt, ...) as a Hub repository holds them."""
    tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_head=2, n_layer=2, n_positions=64,
                                  bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(0)
    hf = randomize(transformers.GPT2LMHeadModel(cfg))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return hf, tok


def bert_repository(folder, vocab):
    """(model, tokenizer): a random small BertForMaskedLM over BERT's uncased vocabulary, saved
    with its tokenizer (vocab.txt, tokenizer.json, ...)."""
    tok = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = randomize(transformers.BertForMaskedLM(cfg))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    if not (folder / "vocab.txt").is_file():  # transformers 5 writes tokenizer.json alone; Hub repositories have both
        (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    return hf, tok


def test_convert_a_cached_gpt2_offline_gives_its_logits_and_tokens(hub_cache, tmp_path, gpt2_vocab, capsys):
    hf, tok = gpt2_repository(tmp_path / "repo", *gpt2_vocab)
    snapshot = cache_folder(hub_cache, "attnlab-tests/tiny-gpt2", tmp_path / "repo")
    assert main(["convert", "hf:attnlab-tests/tiny-gpt2", str(tmp_path / "ours")]) == 0
    assert f"hf:attnlab-tests/tiny-gpt2 (commit {snapshot.name})" in capsys.readouterr().err
    model, ours = load(tmp_path / "ours", with_tokenizer=True)
    ids = ours.encode(TEXT)
    assert ids == tok(TEXT)["input_ids"] and ids[:3] == [15496, 995, 0]  # "Hello world!" in GPT-2's vocabulary
    batch = torch.tensor([ids])
    direct, direct_tok = load("hf:attnlab-tests/tiny-gpt2", with_tokenizer=True)  # what generate, score, ... read
    with torch.no_grad():
        assert real_max_diff(model(batch), hf(input_ids=batch).logits) <= TOL
        assert real_max_diff(direct(batch), hf(input_ids=batch).logits) <= TOL
    assert direct_tok.encode(TEXT) == ids


def test_convert_a_cached_bert_offline_gives_its_logits_and_tokens(hub_cache, tmp_path, bert_vocab):
    hf, tok = bert_repository(tmp_path / "repo", bert_vocab)
    cache_folder(hub_cache, "attnlab-tests/tiny-bert", tmp_path / "repo", revisions=("main", "v1"))
    assert main(["convert", "hf:attnlab-tests/tiny-bert@v1", str(tmp_path / "ours")]) == 0
    model, ours = load(tmp_path / "ours", with_tokenizer=True)
    ids = ours.encode(TEXT, add_special_tokens=True)
    assert ids == tok(TEXT)["input_ids"]
    batch = torch.tensor([ids])
    with torch.no_grad():
        assert real_max_diff(model(batch), hf(input_ids=batch).logits) <= TOL


def test_convert_a_model_not_in_the_cache_is_one_line_naming_it(hub_cache, tmp_path, capsys):
    assert main(["convert", "hf:attnlab-tests/absent", str(tmp_path / "ours")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab convert: error: hf:attnlab-tests/absent is not in the Hugging Face cache")
    assert "\n" not in err
    assert not (tmp_path / "ours").exists()


def test_convert_a_revision_not_in_the_cache_is_an_error(hub_cache, tmp_path, gpt2_vocab, capsys):
    gpt2_repository(tmp_path / "repo", *gpt2_vocab)
    cache_folder(hub_cache, "attnlab-tests/tiny-gpt2", tmp_path / "repo")
    assert main(["convert", "hf:attnlab-tests/tiny-gpt2@v9", str(tmp_path / "ours")]) == 2
    assert "revision 'v9' is not in the Hugging Face cache" in capsys.readouterr().err
    assert not (tmp_path / "ours").exists()


def test_fill_mask_reads_a_cached_bert_with_only_vocab_txt(hub_cache, tmp_path, bert_vocab, capsys):
    """Commands that read a model folder take an hf: name too; a repository whose tokenizer is
    vocab.txt alone is read through it. The top token is transformers' top token."""
    hf, tok = bert_repository(tmp_path / "repo", bert_vocab)
    (tmp_path / "repo" / "tokenizer.json").unlink()
    cache_folder(hub_cache, "attnlab-tests/tiny-bert", tmp_path / "repo")
    text = "the [MASK] is here."
    assert main(["fill-mask", "hf:attnlab-tests/tiny-bert", text, "--top-k", "1", "--json"]) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    batch = tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = hf(**batch).logits[0]
    position = batch["input_ids"][0].tolist().index(tok.mask_token_id)
    want = tok.convert_ids_to_tokens(int(logits[position].argmax()))
    assert want in json.dumps(result), (want, result)
