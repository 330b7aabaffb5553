"""The `pairs_lm` objective: a decoder over `source [SEP] target EOS` rows (Liu et al. 2018's
decoder-only summariser). Its rows against their definition, its target tokens against seq2seq's,
its loss against a reference over the full logits (the source takes none, padding changes
nothing), a run through the Trainer, and generation from `source [SEP]` cached and uncached."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model, generate
from attnlab.data import objectives as batches
from attnlab.data.objectives import IGNORE, pairs_lm, pairs_lm_prompt
from attnlab.training import TrainConfig, Trainer
from attnlab.training.data.objectives import OBJECTIVES
from attnlab.training.tasks.batch_loss import batch_loss
from tests.training.helpers import tiny_config

PAD, SEP, EOS = 0, 3, 2


def _random_pairs(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (n, 2), generator=g).tolist()
    draw = lambda k: torch.randint(5, 40, (k,), generator=g).tolist()
    return [draw(a) for a, _ in lengths], [draw(b) for _, b in lengths]


@pytest.mark.parametrize("max_len", [None, 4])
def test_rows_are_source_sep_target_and_only_the_target_is_labelled(max_len):
    src, tgt = _random_pairs(16)
    b = pairs_lm(src, tgt, pad_id=PAD, sep_id=SEP, eos_id=EOS, max_len=max_len)
    cut = (lambda x: x[:max_len]) if max_len else (lambda x: x)
    for r, (s, t) in enumerate(zip(src, tgt)):
        s, t = cut(s), cut(t)
        n = len(s) + 1 + len(t)
        assert b["input_ids"][r, :n].tolist() == s + [SEP] + t
        assert b["attention_mask"][r].tolist() == [1] * n + [0] * (b["input_ids"].shape[1] - n)
        assert (b["input_ids"][r, n:] == PAD).all()
        labels = b["labels"][r].tolist()
        assert labels[:len(s)] == [IGNORE] * len(s)  # nothing predicts the source (nor SEP, given at inference)
        assert labels[len(s):n] == t + [EOS]  # from SEP on, the next token: the target, then EOS
        assert labels[n:] == [IGNORE] * (len(labels) - n)
    assert pairs_lm_prompt(src[0], SEP, max_len) == cut(src[0]) + [SEP]


def test_the_target_tokens_are_seq2seqs():
    """The same pairs give the decoder and the encoder-decoder the same target tokens (cut
    alike), so their per-token losses compare."""
    src, tgt = _random_pairs(16, seed=1)
    for max_len in (None, 5):
        lm = pairs_lm(src, tgt, pad_id=PAD, sep_id=SEP, eos_id=EOS, max_len=max_len)["labels"]
        s2s = batches.seq2seq(src, tgt, pad_id=PAD, bos_id=1, eos_id=EOS, max_len=max_len)["labels"]
        for a, b in zip(lm, s2s):
            assert a[a != IGNORE].tolist() == b[b != IGNORE].tolist()


def test_perturbing_the_source_leaves_the_labels():
    src, tgt = _random_pairs(8, seed=2)
    other = [[(x * 7) % 35 + 5 for x in s] for s in src]  # other tokens, the same lengths
    a = pairs_lm(src, tgt, pad_id=PAD, sep_id=SEP, eos_id=EOS)
    b = pairs_lm(other, tgt, pad_id=PAD, sep_id=SEP, eos_id=EOS)
    assert not torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["attention_mask"], b["attention_mask"])


def test_bad_pairs_are_refused():
    with pytest.raises(ValueError, match="src and tgt must be non-empty and of one length, got 2 and 1"):
        pairs_lm([[5], [6]], [[7]], pad_id=PAD, sep_id=SEP, eos_id=EOS)
    with pytest.raises(ValueError, match="non-empty"):
        pairs_lm([], [], pad_id=PAD, sep_id=SEP, eos_id=EOS)


def _decoder(variant: str = "dense", vocab: int = 40) -> torch.nn.Module:
    fields = {"dense": {}, "dmca": {"attention": {"kernel": "memory_compressed",
                                                  "kernel_options": {"compression": 2, "block_size": 4}}},
              "moe": {"moe": {"num_experts": 4, "top_k": 2, "every": 1}}}[variant]
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=vocab, d_model=32, num_layers=2, num_heads=2, d_ff=64, dropout=0.0,
                      pad_token_id=PAD, position={"scheme": "sinusoidal", "max_len": 64}, **fields)
    return build_model(cfg).eval()


@pytest.mark.parametrize("variant", ["dense", "dmca"])
def test_the_loss_is_the_targets_nll_under_the_full_forward_and_ignores_padding(variant):
    """batch_loss of a padded batch = the mean, over every target token and EOS of every pair,
    of -log p(token | all before it), each pair run alone through the plain forward."""
    model = _decoder(variant)
    src, tgt = _random_pairs(6, seed=3)
    with torch.no_grad():
        got = batch_loss(model, pairs_lm(src, tgt, pad_id=PAD, sep_id=SEP, eos_id=EOS))
    total, count = 0.0, 0
    with torch.no_grad():
        for s, t in zip(src, tgt):
            row = s + [SEP] + t + [EOS]
            logits = model(torch.tensor([row[:-1]]))[0]  # (T, V), no padding
            log_probs = F.log_softmax(logits, -1)
            for i in range(len(s) + 1, len(row)):  # the target tokens and EOS, each from the tokens before it
                total -= float(log_probs[i - 1, row[i]])
                count += 1
    assert float(got) == pytest.approx(total / count, rel=1e-5)


def test_the_objective_needs_a_separator():
    class NoSep:
        sep_token_id, eos_token_id, pad_token_id = None, EOS, PAD

    class Cfg:
        batch_size, max_pair_len, batch_tokens = 2, 8, None

    class Side:  # a TokenFile of two one-token documents
        num_documents = 2
        document = staticmethod(lambda i: torch.tensor([5 + i]))

    with pytest.raises(ValueError, match=r"pairs_lm' needs a tokenizer with a separator \(<sep>, \[SEP\]\)"):
        OBJECTIVES["pairs_lm"].train_batch(Cfg(), NoSep(), (Side(), Side()), torch.Generator())


@pytest.mark.usefixtures("isolated_cache")
def test_pairs_lm_trains_through_the_trainer_and_validates_on_the_pairs_in_order(tmp_path):
    rows = [("the king speaks to the queen", "king speaks"), ("a night of love and death", "night"),
            ("the lord hath a sword and a crown", "lord sword crown"), ("thou and thee by day", "day")]
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in rows * 10))
    (tmp_path / "valid.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in rows))
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2, checkpoint_every=2)
    cfg["data"].update(source=str(tmp_path / "train.tsv"), valid=str(tmp_path / "valid.tsv"), objective="pairs_lm",
                       tokenizer={"kind": "char"}, max_pair_len=24)
    cfg["model"]["position"]["max_len"] = 64
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    assert trainer.model.config.arch == "decoder" and trainer.model.config.head == "lm"
    tok = trainer.pipeline.tokenizer
    assert tok.sep_token_id is not None
    summary = trainer.fit()
    assert summary["steps"] == 2 and math.isfinite(summary["val_loss"])
    first = next(iter(trainer.pipeline.eval_batches(1)))
    expected = pairs_lm([tok.encode(s) for s, _ in rows], [tok.encode(t) for _, t in rows], pad_id=tok.pad_token_id,
                        sep_id=tok.sep_token_id, eos_id=tok.eos_token_id, max_len=24)
    assert all(torch.equal(first[k], expected[k]) for k in expected)

    # data.batch_tokens: pairs of similar length, rows x (longest source + longest target + 1) within the budget
    bucketed = dataclasses.replace(trainer.pipeline.cfg, batch_tokens=150)
    lengths = set()
    for seed in range(20):
        b = OBJECTIVES["pairs_lm"].train_batch(bucketed, tok, trainer.pipeline.train, torch.Generator().manual_seed(seed))
        assert len(b["input_ids"]) == 1 or b["input_ids"].numel() <= 150
        lengths.add(len(b["input_ids"]))
    assert len(lengths) > 1  # short pairs come more to a batch than long ones


@pytest.mark.parametrize("variant", ["dense", "dmca", "moe"])
def test_generation_from_source_sep_cached_equals_the_full_forward(variant):
    """Greedy decoding from `source [SEP]` with the KV cache = re-running the whole sequence at
    every step; its first token is the argmax the training row's SEP position predicts."""
    model = _decoder(variant)
    src, tgt = _random_pairs(3, seed=4)
    for s, t in zip(src, tgt):
        prompt = torch.tensor([pairs_lm_prompt(s, SEP)])
        cached = generate(model, prompt, 12, eos_token_id=EOS)
        full = generate(model, prompt, 12, eos_token_id=EOS, use_cache=False)
        assert torch.equal(cached, full)
        row = pairs_lm([s], [t], pad_id=PAD, sep_id=SEP, eos_id=EOS)
        with torch.no_grad():
            logits = model(row["input_ids"])[0, len(s)]  # the SEP position, labelled with the target's first token
        assert int(cached[0, len(s) + 1]) == int(logits.argmax())
