"""The objective registry: the config accepts exactly its keys, each spec agrees with the model
config, and an objective registered in a test trains through the Trainer with no other change."""

import math

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.config.model import ARCHS, HEADS
from attnlab.config.validate import ConfigError
from attnlab.data import objectives as batches
from attnlab.training import TrainConfig, Trainer
from attnlab.training.config import DataConfig, objective_fields
from attnlab.training.data.objectives import OBJECTIVES, Objective
from tests.training.helpers import WORDS, tiny_config, write_corpus


pytestmark = pytest.mark.usefixtures("isolated_cache")


def test_the_config_accepts_exactly_the_registry_keys():
    for name in OBJECTIVES:
        assert DataConfig(objective=name).objective == name
    with pytest.raises(ConfigError) as err:
        DataConfig(objective="gan")
    assert str(err.value) == f"data.objective: 'gan' is not one of {', '.join(OBJECTIVES)}"


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_spec_implies_a_valid_model(name):
    spec = OBJECTIVES[name]
    assert spec.arch in ARCHS and spec.head in HEADS
    for nsp in (False, True) if spec.next_sentence else (False,):
        fields = objective_fields(name, nsp, "decoder")
        ModelConfig().replace(**fields)  # validates
        assert fields["arch"] == spec.arch and fields["head"] == spec.head
    for kind in ("char", "bpe", "wordpiece", "word"):
        tokens = spec.special_tokens(kind)
        assert tokens and len(set(tokens)) == len(tokens)


def test_a_recurrent_encoder_decoder_names_the_objectives_it_fits():
    fits = [name for name, spec in OBJECTIVES.items() if spec.arch == "encoder_decoder"]
    assert fits and all(objective_fields(name, False, "rnn_encoder_decoder") == {"head": "lm"} for name in fits)
    with pytest.raises(ConfigError, match="model.arch: 'rnn_encoder_decoder' needs data.objective"):
        objective_fields("causal_lm", False, "rnn_encoder_decoder")


class ReversedLM(Objective):
    """A toy: next-token prediction right to left (the windows reversed)."""

    arch = "decoder"
    eos_between_documents = True
    drawn = 0

    def special_tokens(self, tokenizer_kind):
        return ["<pad>", "<unk>", "<|endoftext|>", "<rev>"]

    def train_batch(self, cfg, tok, files, generator):
        type(self).drawn += 1
        return batches.causal_lm(files.random_windows(cfg.batch_size, cfg.seq_len + 1, generator).flip(1))


def test_a_registered_objective_trains_through_the_trainer(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2, checkpoint_every=2)
    cfg["data"]["objective"] = "reversed_lm"
    with pytest.raises(ConfigError, match="data.objective: 'reversed_lm' is not one of"):
        TrainConfig.from_dict(cfg)

    monkeypatch.setitem(OBJECTIVES, "reversed_lm", ReversedLM())
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    monkeypatch.setattr(ReversedLM, "drawn", 0)  # building checked the data with a batch of each split
    assert trainer.pipeline.tokenizer.token_to_id("<rev>") is not None  # the spec's special tokens
    assert trainer.model.config.arch == "decoder"
    summary = trainer.fit()
    assert summary["steps"] == 2 and math.isfinite(summary["val_loss"])
    # 2 training batches and 2 validation draws (tiny_config's eval_batches), through the spec only
    assert ReversedLM.drawn == 2 + 2
    first, again = list(trainer.pipeline.eval_batches(2)), list(trainer.pipeline.eval_batches(2))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))  # fixed seed


def test_a_text_objective_on_pairs_names_what_fits(tmp_path):
    (tmp_path / "p.tsv").write_text("a b\tc d\n" * 10)
    cfg = tiny_config(tmp_path)
    cfg["data"].update(source=str(tmp_path / "p.tsv"), valid=str(tmp_path / "p.tsv"))
    with pytest.raises(ValueError, match="seq2seq, pairs_lm take pairs, the other objectives plain text"):
        Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)


def _fit(tmp_path, objective: str, preset: str, tokenizer: dict) -> Trainer:
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2, checkpoint_every=2)
    cfg["data"].update(objective=objective, tokenizer=tokenizer)
    cfg["model"]["preset"] = preset
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    summary = trainer.fit()
    assert summary["steps"] == 2 and math.isfinite(summary["val_loss"])
    return trainer


def test_span_masked_lm_trains_and_masks_whole_words_of_the_tokenizer(tmp_path):
    from attnlab.tokenizers.boundaries import word_starts

    # a WordPiece of 60 pieces spells the corpus's words in several pieces each
    trainer = _fit(tmp_path, "span_masked_lm", "tiny-encoder", {"kind": "wordpiece", "vocab_size": 60})
    assert trainer.model.config.arch == "encoder" and trainer.model.config.head == "mlm"
    tok, pipe = trainer.pipeline.tokenizer, trainer.pipeline
    g = torch.Generator().manual_seed(7)
    batch = pipe.train_batch(g)
    original = pipe.train.random_windows(pipe.cfg.batch_size, pipe.cfg.seq_len, torch.Generator().manual_seed(7))
    picked = batch["labels"] != batches.IGNORE
    assert picked.any() and torch.equal(batch["labels"][picked], original[picked])
    starts = word_starts(tok, original)
    assert not starts.all()  # words of more than one piece are in the windows
    for row, mask in zip(starts, picked):  # each masked run opens at a word start and stops before the next
        edges = torch.diff(torch.cat([torch.tensor([0]), mask.long(), torch.tensor([0])]))
        for s, e in zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()):
            assert row[s] and (e == len(row) or row[e])


def test_encoder_decoder_lm_trains_on_a_window_cut_in_two(tmp_path):
    trainer = _fit(tmp_path, "encoder_decoder_lm", "tiny-encoder-decoder", {"kind": "char"})
    assert trainer.model.config.arch == "encoder_decoder"
    tok, pipe = trainer.pipeline.tokenizer, trainer.pipeline
    batch = pipe.train_batch(torch.Generator().manual_seed(7))
    windows = pipe.train.random_windows(pipe.cfg.batch_size, pipe.cfg.seq_len, torch.Generator().manual_seed(7))
    for r, window in enumerate(windows.tolist()):
        n_src, n_tgt = int(batch["src_mask"][r].sum()), int(batch["tgt_mask"][r].sum())
        src, labels = batch["src_ids"][r, :n_src].tolist(), batch["labels"][r, :n_tgt].tolist()
        assert src[-1] == labels[-1] == tok.eos_token_id
        assert src[:-1] + labels[:-1] == window
        assert batch["tgt_ids"][r, 0] == tok.pad_token_id  # T5 decodes from the pad id
        assert batch["tgt_ids"][r, 1:n_tgt].tolist() == labels[:-1]


def _pairs(tmp_path) -> str:
    """Pairs on both sides longer than max_pair_len (8 characters), so batches reach the cut."""
    rows = [(" ".join(WORDS[i % 5: i % 5 + 4]), " ".join(WORDS[i % 7: i % 7 + 3])) for i in range(40)]
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in rows))
    return str(path)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_row_lengths_bound_every_batch_and_are_reached(tmp_path, name):
    """`row_lengths` is what the memory estimate reads (attnlab.training.setup.memory): no training batch
    is wider; fixed-length objectives reach it exactly, and batches of pairs longer than
    max_pair_len reach it too. encoder_decoder_lm cuts each window in two at random: its rows
    together hold the window + 2 tokens."""
    from attnlab.training.data.batches import DataPipeline

    write_corpus(tmp_path)
    spec = OBJECTIVES[name]
    source = _pairs(tmp_path) if spec.pairs else str(tmp_path / "train.txt")
    valid = source if spec.pairs else str(tmp_path / "valid.txt")
    data = DataConfig(source=source, valid=valid, objective=name, seq_len=24, batch_size=4, max_pair_len=8)
    pipe = DataPipeline.build(data, tmp_path / "run", show_progress=False)
    S, Tt = spec.row_lengths(data)
    assert (Tt is not None) == (spec.arch == "encoder_decoder")
    generator = torch.Generator().manual_seed(0)
    widths = []
    for _ in range(10):
        batch = pipe.train_batch(generator)
        widths.append((batch["src_ids"].shape[1], batch["tgt_ids"].shape[1]) if Tt else (batch["input_ids"].shape[1],))
    assert all(w[0] <= S for w in widths) and all(w[1] <= Tt for w in widths if Tt)
    if name == "encoder_decoder_lm":
        assert all(sum(w) >= data.seq_len + 2 for w in widths)
    else:
        assert max(widths) == ((S, Tt) if Tt else (S,))
