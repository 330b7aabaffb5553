"""`attnlab train` from pretrained weights (`model.init_from`): a Hugging Face GPT-2 folder on
text, a BART or Marian folder on sentence pairs — the first step's loss is the Hugging Face
model's loss on the same batch; the run tokenises with the folder's tokenizer; new special
tokens grow the embedding and the tied head with mean rows."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
import transformers

from attnlab.tokenizers import Tokenizer
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup.start import resize_token_embeddings
from attnlab.nn.losses import IGNORE
from tests.training.helpers import WORDS, write_corpus

SEQ2SEQ_SPECIALS = {"bart": ["<s>", "<pad>", "</s>", "<unk>"], "marian": ["</s>", "<unk>", "<pad>"]}


pytestmark = pytest.mark.usefixtures("isolated_cache")


def _tokenizer(texts, specials):
    return Tokenizer.train(texts, kind="bpe", vocab_size=300, special_tokens=specials)


def _gpt2_folder(folder, texts):
    tok = _tokenizer(texts, ["<|endoftext|>"])
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder)
    tok.save(folder)
    return hf, tok


def _seq2seq_folder(family, folder, texts):
    tok = _tokenizer(texts, SEQ2SEQ_SPECIALS[family])
    ids = {name: tok.token_to_id(t) for name, t in (("pad", "<pad>"), ("eos", "</s>"))}
    small = dict(vocab_size=tok.vocab_size, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=ids["pad"],
                 eos_token_id=ids["eos"], forced_eos_token_id=ids["eos"])
    torch.manual_seed(0)
    if family == "bart":
        bos = tok.token_to_id("<s>")
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig(bos_token_id=bos, **small))
    else:
        hf = transformers.MarianMTModel(transformers.MarianConfig(decoder_start_token_id=ids["pad"], **small))
    hf.eval().save_pretrained(folder)
    tok.save(folder)
    return hf, tok


def _run(tmp_path, model, data, **train):
    cfg = {"model": model, "data": {"seq_len": 16, "batch_size": 4, **data},
           "optim": {"lr": 1e-3}, "schedule": {"name": "constant", "warmup_steps": 0},
           "train": {"out_dir": str(tmp_path / "run"), "max_steps": 1, "eval_every": 1, "eval_batches": 1,
                     "log_every": 1, "seed": 0, "threads": 1, "bleu_samples": 0, "precision": "fp32", **train}}
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    first = trainer.task.train_batch(torch.Generator().manual_seed(0 + 1))  # the trainer's first batch
    losses = []
    trainer.fit(on_step=lambda record: losses.append(record["loss"]))
    return trainer, first, losses[0]


def test_train_from_a_hugging_face_gpt2_folder_starts_at_its_loss(tmp_path):
    train_path, valid_path = write_corpus(tmp_path / "data")
    hf, tok = _gpt2_folder(tmp_path / "gpt2", [train_path.read_text()])
    trainer, batch, loss = _run(tmp_path, {"init_from": str(tmp_path / "gpt2")},
                                {"source": str(train_path), "valid": str(valid_path),
                                 "tokenizer": {"kind": "char"}})  # ignored: the folder brings its tokenizer
    with torch.no_grad():
        logits = hf(batch["input_ids"]).logits
    want = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
    assert loss == pytest.approx(float(want), abs=1e-5)
    assert trainer.model.config.vocab_size == tok.vocab_size
    saved = json.loads((tmp_path / "run" / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved == tok.to_dict()


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_train_from_a_hugging_face_seq2seq_folder_on_pairs_starts_at_its_loss(tmp_path, family):
    pairs = [(f"the {w} is here .", f"der {w} ist hier .") for w in WORDS] * 4
    (tmp_path / "p.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    hf, tok = _seq2seq_folder(family, tmp_path / family, [s for p in pairs for s in p])
    trainer, batch, loss = _run(tmp_path, {"init_from": str(tmp_path / family)},
                                {"objective": "seq2seq", "source": str(tmp_path / "p.tsv"),
                                 "valid": str(tmp_path / "p.tsv"), "max_pair_len": 12})
    assert batch["tgt_ids"][0, 0] == (tok.bos_token_id if family == "bart" else tok.pad_token_id)
    with torch.no_grad():
        logits = hf(input_ids=batch["src_ids"], attention_mask=batch["src_mask"], decoder_input_ids=batch["tgt_ids"],
                    decoder_attention_mask=batch["tgt_mask"]).logits
    want = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
    assert loss == pytest.approx(float(want), abs=1e-5)


def test_added_special_tokens_grow_the_embedding_and_tied_head_with_mean_rows(tmp_path):
    train_path, valid_path = write_corpus(tmp_path / "data")
    hf, tok = _gpt2_folder(tmp_path / "gpt2", [train_path.read_text()])
    new = ["[START]", "[DELIM]", "[EXTRACT]"]
    trainer, _, loss = _run(tmp_path, {"init_from": str(tmp_path / "gpt2"), "add_special_tokens": new},
                            {"source": str(train_path), "valid": str(valid_path)}, max_steps=1)
    saved = Tokenizer.load(tmp_path / "run" / "tokenizer.json")
    ids = [saved.token_to_id(t) for t in new]
    assert ids == list(range(tok.vocab_size, tok.vocab_size + 3)) and saved.encode("[DELIM]") == [ids[1]]
    # the resize itself, before any step: old rows kept, new rows the mean, the head tied to the embedding
    from attnlab import from_hf

    grown = resize_token_embeddings(from_hf(hf), tok.vocab_size + 3)
    table = grown.embed.token.weight
    old = hf.transformer.wte.weight
    assert table.shape[0] == tok.vocab_size + 3 and torch.equal(table[: tok.vocab_size], old)
    assert torch.allclose(table[tok.vocab_size:], old.mean(0).expand(3, -1))
    assert any(p is table for p in grown.head.parameters())  # still tied
    assert trainer.model.config.vocab_size == tok.vocab_size + 3 and math.isfinite(loss)
    with pytest.raises(ValueError, match="smaller"):
        resize_token_embeddings(grown, 5)


def test_train_from_a_hub_name_offline_starts_at_the_cached_models_loss(tmp_path, monkeypatch):
    """model.init_from: hf:ORG/NAME, read from huggingface_hub's cache with HF_HUB_OFFLINE=1; the
    run records the name (not a path made absolute) and logs the commit it resolved to."""
    from tests.interop.hub_cache import cache_folder

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train_path, valid_path = write_corpus(tmp_path / "data")
    hf, tok = _gpt2_folder(tmp_path / "gpt2", [train_path.read_text()])
    snapshot = cache_folder(tmp_path / "hf-cache", "attnlab-tests/tiny-gpt2", tmp_path / "gpt2")
    name = "hf:attnlab-tests/tiny-gpt2"
    trainer, batch, loss = _run(tmp_path, {"init_from": name}, {"source": str(train_path), "valid": str(valid_path)})
    with torch.no_grad():
        logits = hf(batch["input_ids"]).logits
    want = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
    assert loss == pytest.approx(float(want), abs=1e-5)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["config"]["model"]["init_from"] == name, recorded
    from attnlab.training.setup.start import pretrain_setup

    lines = []
    cfg = TrainConfig.from_dict({"model": {"init_from": name},
                                 "data": {"source": str(train_path), "valid": str(valid_path), "seq_len": 16}})
    pretrain_setup(cfg, tmp_path / "setup", show_progress=False, log=lines.append)
    assert f"model.init_from: {name} (commit {snapshot.name}) (decoder, vocabulary {tok.vocab_size})" in lines
