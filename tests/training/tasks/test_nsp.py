"""Next-sentence prediction end to end: segment sampling, the 50/50 split, [CLS] A [SEP] B [SEP]
batches with MLM on top, the MLM + NSP loss against a reference, and `attnlab train` with
`data.nsp`."""

import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.cli.main import main
from attnlab.config import ModelConfig
from attnlab.data import objectives as obj
from attnlab.models import build_model
from attnlab.training.config import TrainConfig
from attnlab.nn.losses import IGNORE
from attnlab.training.data.batches import DataPipeline
from attnlab.models.families.encoder import nsp_logits
from attnlab.training.tasks.batch_loss import batch_loss, eval_sums

WORDS = "alpha beta gamma delta epsilon zeta theta iota kappa lambda sigma omega".split()


pytestmark = pytest.mark.usefixtures("isolated_cache")


def _numbered_corpus(lengths):
    """Token i of document d is d * 1000 + i: every token tells where it came from."""
    tokens = np.concatenate([d * 1000 + np.arange(n) for d, n in enumerate(lengths)]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return tokens, offsets


def test_positives_are_the_next_segment_and_negatives_another_document():
    tokens, offsets = _numbered_corpus([40, 4, 120, 25, 9, 60])  # documents 1 and 4 are too short for A + B
    g = torch.Generator().manual_seed(0)
    first, second, other = obj.segment_pairs(tokens, offsets, 3000, 6, 5, g)
    doc_a, pos_a = first // 1000, first % 1000
    assert torch.equal(doc_a, doc_a[:, :1].expand_as(doc_a))  # A lies in one document ...
    assert torch.equal(pos_a, pos_a[:, :1] + torch.arange(6))  # ... consecutively
    assert torch.equal(second, first[:, -1:] + 1 + torch.arange(5))  # B = the 5 tokens right after A
    assert set(doc_a[:, 0].tolist()) == {0, 2, 3, 5}  # every document long enough, and only those
    doc_r = other // 1000
    assert torch.equal(doc_r, doc_r[:, :1].expand_as(doc_r)) and torch.equal(other, other[:, :1] + torch.arange(5))
    assert bool((doc_r[:, 0] != doc_a[:, 0]).all())  # the random B comes from another document
    assert set(doc_r[:, 0].tolist()) == {0, 2, 3, 4, 5}  # document 4 (9 tokens) holds a B; 1 (4) does not
    # uniform over start positions: document 2 offers 110 of the 30+110+15+50 = 205 starts
    assert abs(float((doc_a[:, 0] == 2).float().mean()) - 110 / 205) < 0.03


def test_segment_pairs_errors_name_the_problem():
    tokens, offsets = _numbered_corpus([10, 10])
    with pytest.raises(ValueError, match="len_a"):
        obj.segment_pairs(tokens, offsets, 2, 0, 3, torch.Generator())
    with pytest.raises(ValueError, match="no document holds 30 tokens"):
        obj.segment_pairs(tokens, offsets, 2, 15, 15, torch.Generator())
    tokens, offsets = _numbered_corpus([12])
    with pytest.raises(ValueError, match="two documents"):
        obj.segment_pairs(tokens, offsets, 2, 3, 3, torch.Generator())


def test_half_of_the_pairs_are_random_and_the_draw_is_seeded():
    tokens, offsets = _numbered_corpus([50, 80, 35, 64])
    labels = []
    g = torch.Generator().manual_seed(7)
    for _ in range(20):  # 20 batches of 1000 pairs
        first, second, other = obj.segment_pairs(tokens, offsets, 1000, 4, 4, g)
        batch = obj.next_sentence(first, second, other, g, cls_id=-1, sep_id=-2)
        b = batch["input_ids"][:, 6:10]
        random_b = batch["nsp_labels"].bool()
        assert torch.equal(b[~random_b], second[~random_b]) and torch.equal(b[random_b], other[random_b])
        labels.append(batch["nsp_labels"])
    share = float(torch.cat(labels).float().mean())
    assert abs(share - 0.5) < 0.015  # 20,000 fair coins: sd 0.0035, so this is over 4 sd
    runs = [obj.segment_pairs(tokens, offsets, 8, 4, 4, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(*runs))


def _documents_corpus(folder, n_docs=8, seed=0):
    """Plain text files whose documents are separated by form-feed lines (as the built-in corpora)."""
    rng = random.Random(seed)
    docs = lambda n: "\n\f\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 120))) for _ in range(n))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(docs(n_docs))
    (folder / "valid.txt").write_text(docs(3))
    return folder / "train.txt", folder / "valid.txt"


def _nsp_config(folder, **train):
    train_path, valid_path = _documents_corpus(folder)
    run = {"out_dir": str(folder / "run"), "max_steps": 4, "eval_every": 2, "eval_batches": 2, "log_every": 1,
           "checkpoint_every": 2, "seed": 0, "threads": 1, **train}
    return {"model": {"preset": "tiny-encoder", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64,
                      "position": {"scheme": "learned", "max_len": 32}},
            "data": {"source": str(train_path), "valid": str(valid_path), "objective": "masked_lm", "nsp": True,
                     "whole_word_mask": True, "seq_len": 24, "batch_size": 8,
                     "tokenizer": {"kind": "wordpiece", "vocab_size": 200}},
            "optim": {"lr": 0.003}, "schedule": {"name": "constant", "warmup_steps": 0}, "train": run}


def test_pipeline_builds_cls_a_sep_b_sep_and_never_masks_specials(tmp_path):
    cfg = TrainConfig.from_dict(_nsp_config(tmp_path))
    pipe = DataPipeline.build(cfg.data, tmp_path / "run", show_progress=False)
    tok, files = pipe.tokenizer, pipe.train
    stream = files.tokens.tolist()
    doc_of = np.searchsorted(files.offsets, np.arange(len(stream)), side="right") - 1

    def find(segment):  # documents where `segment` occurs
        return {int(doc_of[i]) for i in range(len(stream) - len(segment) + 1) if stream[i: i + len(segment)] == segment}

    g = torch.Generator().manual_seed(0)
    picked = specials_seen = 0
    for _ in range(30):
        batch = pipe.make_batch(files, g)
        ids, labels, types = batch["input_ids"], batch["labels"], batch["token_type_ids"]
        assert ids.shape == labels.shape == types.shape == (8, 24)
        special = torch.zeros_like(ids, dtype=torch.bool)
        special[:, [0, 11, 23]] = True  # [CLS] A(10) [SEP] B(11) [SEP]
        assert bool((ids[:, 0] == tok.cls_token_id).all()) and bool((ids[:, [11, 23]] == tok.sep_token_id).all())
        assert bool((labels[special] == IGNORE).all())  # never picked, never replaced
        assert torch.equal(types, (torch.arange(24) > 11).long().expand(8, 24))
        specials_seen += int(special.sum())
        picked += int((labels != IGNORE).sum())
        original = torch.where(labels != IGNORE, labels, ids)
        for row, is_random in zip(original.tolist(), batch["nsp_labels"].tolist()):
            a, b = row[1:11], row[12:23]
            together = find(a + b)
            if is_random:
                assert not together and find(b) - find(a)  # B is found in some document A is not from
            else:
                assert together  # A then B, consecutively, in one document
    assert picked > 0 and specials_seen == 30 * 8 * 3


def test_mlm_plus_nsp_loss_and_eval_sums_match_a_reference():
    torch.manual_seed(0)
    cfg = ModelConfig(arch="encoder", vocab_size=50, d_model=32, num_layers=1, num_heads=2, d_ff=64, head="mlm",
                      type_vocab_size=2, pooler=True, nsp_head=True, dropout=0.0,
                      position={"scheme": "learned", "max_len": 16})
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (6, 16), generator=g)
    labels = torch.where(torch.rand(6, 16, generator=g) < 0.3, ids, torch.full_like(ids, IGNORE))
    types = (torch.arange(16) >= 8).long().expand(6, 16)
    nsp = torch.tensor([0, 1, 1, 0, 1, 0])
    batch = {"input_ids": ids, "labels": labels, "token_type_ids": types, "nsp_labels": nsp}
    with torch.no_grad():
        logits = model(ids, token_type_ids=types)  # (B, T, V) MLM logits
        hidden = model.features(ids, token_type_ids=types)
    pooled = torch.tanh(F.linear(hidden[:, 0], model.pooler.dense.weight, model.pooler.dense.bias))
    nsp_ref = F.linear(pooled, model.nsp_head.proj.weight, model.nsp_head.proj.bias)
    mlm_ref = F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), ignore_index=IGNORE)
    with torch.no_grad():
        assert torch.allclose(nsp_logits(model, hidden), nsp_ref)
        assert torch.allclose(batch_loss(model, batch), mlm_ref + F.cross_entropy(nsp_ref, nsp), atol=1e-5)
        sums = eval_sums(model, batch)
    keep = labels != IGNORE
    assert sums["tokens"] == int(keep.sum()) and math.isclose(sums["loss_sum"] / sums["tokens"], float(mlm_ref),
                                                              rel_tol=1e-5)
    assert sums["correct"] == int((logits.argmax(-1)[keep] == labels[keep]).sum())
    assert sums["nsp_correct"] == int((nsp_ref.argmax(-1) == nsp).sum()) and sums["nsp_count"] == 6
    with pytest.raises(ValueError, match="nsp_head=True"):
        batch_loss(build_model(cfg.replace(nsp_head=False)), batch)


def test_train_with_nsp_logs_nsp_loss_and_accuracy_and_eval_reads_the_run(tmp_path, capsys):
    path = tmp_path / "nsp.json"
    path.write_text(json.dumps(_nsp_config(tmp_path)))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert "val_nsp_loss" in out and "val_nsp_accuracy" in out
    evals = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert math.isclose(r["val_loss"], r["val_mlm_loss"] + r["val_nsp_loss"], rel_tol=1e-9)
        assert 0 <= r["val_nsp_accuracy"] <= 1 and 0 <= r["val_mlm_accuracy"] <= 1
        assert math.isclose(r["val_ppl"], math.exp(r["val_mlm_loss"]), rel_tol=1e-9)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["config"]["data"]["nsp"] and saved["model"]["nsp_head"] and saved["model"]["type_vocab_size"] == 2
    assert main(["eval", str(tmp_path / "run"), "--which", "latest"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert math.isclose(result["val_nsp_loss"], evals[-1]["val_nsp_loss"], rel_tol=1e-5)


@pytest.mark.parametrize("objective", ["causal_lm", "prefix_lm", "span_corruption"])
def test_nsp_without_an_encoder_objective_is_an_error_naming_the_field(tmp_path, capsys, objective):
    path = tmp_path / "nsp.json"
    path.write_text(json.dumps(_nsp_config(tmp_path)))
    assert main(["train", str(path), "--data.objective", objective, "--model.preset", "tiny-decoder"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: error:") and "data.nsp" in err and "masked_lm" in err
    with pytest.raises(ValueError, match="nsp_head"):
        ModelConfig(arch="decoder", vocab_size=50, d_model=32, num_heads=2, nsp_head=True)
