"""data.pack: causal-LM rows packed with several documents that do not see each other
(`document_masked`), or one document per padded row (`pad`), against plain packing.

Properties: editing one document leaves the other documents' logits in the row unchanged (and
plain packing does change them); a document packed at any offset gets the logits it gets alone
at a row's start (positions restart); the loss of a packed row is the token-weighted mean of its
documents' losses alone, without the prediction across a boundary; bad combinations are refused
naming data.pack.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab import build_model, presets
from attnlab.config import ConfigError
from attnlab.data.objectives import IGNORE
from attnlab.data.packing import document_masked_batch, padded_batch
from attnlab.data.tokenized import TokenFile
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import document_mask, positions_from_documents
from attnlab.training.config import DataConfig, TrainConfig
from attnlab.training.data.batches import DataPipeline
from attnlab.training.run_checks import check_packing

SCHEMES = ["none", "sinusoidal", "learned", "binary", "relative", "rotary", "alibi", "t5_bias"]
LENGTHS = (7, 9, 8)  # the three documents of the test row: 24 tokens


def _model(scheme="learned", kernel="sdpa", seed=0, **fields):
    torch.manual_seed(seed)
    cfg = presets.get("tiny-decoder", vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      position={"scheme": scheme, "max_len": 64}, attention={"kernel": kernel}, **fields)
    model = build_model(cfg).eval()
    with torch.no_grad():  # weights far from their small initialisation: tokens then sway each other visibly
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _row(seed=0):
    """ids (1, 24) of three documents and their document ids (1, 24)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (1, sum(LENGTHS)), generator=g)
    docs = torch.cat([torch.full((n,), i) for i, n in enumerate(LENGTHS)])[None]
    return ids, docs


def _spans():
    ends = np.cumsum(LENGTHS)
    return [slice(int(e - n), int(e)) for e, n in zip(ends, LENGTHS)]


# ---------------------------------------------------------------- masks and positions
def test_document_mask_and_positions_match_a_loop():
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [4, 4, 4, 4, 4, 4, 4, 4], [1, 2, 3, 3, 5, 5, 5, 6]])
    mask, pos = document_mask(docs), positions_from_documents(docs)
    assert mask.shape == (3, 1, 8, 8)
    for b in range(3):
        for i in range(8):
            start = max(j for j in range(i + 1) if j == 0 or docs[b, j] != docs[b, j - 1])
            assert pos[b, i] == i - start
            for j in range(8):
                assert mask[b, 0, i, j] == (j <= i and docs[b, i] == docs[b, j])


# ---------------------------------------------------------------- no attention across documents
@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_editing_one_document_leaves_the_others_unchanged(scheme, kernel):
    if kernel == "sdpa" and scheme == "relative":  # Shaw's values term is scored by the eager path only
        kernel = "auto"
    model = _model(scheme, kernel)
    ids, docs = _row()
    edited = ids.clone()
    middle = _spans()[1]
    edited[0, middle] = (edited[0, middle] + 7) % 49 + 1  # every token of the middle document changed
    with torch.no_grad():
        masked = model(ids, document_ids=docs), model(edited, document_ids=docs)
        plain = model(ids), model(edited)
    first, last = _spans()[0], _spans()[2]
    for span in (first, last):
        torch.testing.assert_close(masked[1][:, span], masked[0][:, span], atol=1e-6, rtol=0)
    assert not torch.allclose(masked[1][:, middle], masked[0][:, middle])  # the edit is seen where it is
    # plain packing: the third document attends to the edited one
    assert (plain[1][:, last] - plain[0][:, last]).abs().max() > 1e-3
    torch.testing.assert_close(plain[1][:, first], plain[0][:, first], atol=1e-6, rtol=0)  # causal: before it


# ---------------------------------------------------------------- positions restart
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_document_packed_at_an_offset_gets_its_logits_alone(scheme):
    model = _model(scheme, "auto")
    ids, docs = _row(seed=1)
    with torch.no_grad():
        packed = model(ids, document_ids=docs)
        for span in _spans():
            alone = model(ids[:, span])
            torch.testing.assert_close(packed[:, span], alone, atol=1e-5, rtol=1e-5)


def test_positions_that_do_not_restart_change_an_absolute_scheme():
    """The reference above can fail: the same mask with positions counted along the row gives
    the third document other logits under learned positions."""
    model = _model("learned")
    ids, docs = _row(seed=1)
    last = _spans()[2]
    with torch.no_grad():
        along = model(ids, document_ids=docs, position_ids=torch.arange(ids.shape[1])[None])
        alone = model(ids[:, last])
    assert (along[:, last] - alone).abs().max() > 1e-3


# ---------------------------------------------------------------- the loss
def test_the_boundary_prediction_takes_no_loss_and_the_row_loss_is_its_documents_losses():
    """A window of T + 1 tokens holding three whole documents and the first token of a fourth:
    the loss over the packed row equals the token-weighted mean of the three documents' losses
    alone (each predicting its own tokens after the first); the predictions from a document's
    last token to the next document's first are left out."""
    model = _model("rotary", "auto")
    ids, docs = _row(seed=2)
    window = torch.cat([ids, torch.tensor([[11]])], 1)  # + the next document's first token
    documents = torch.cat([docs, torch.tensor([[3]])], 1)
    batch = document_masked_batch(window, documents)
    boundaries = [int(s.stop) - 1 for s in _spans()]  # each document's last token: it predicts the next one's first
    assert [i for i in range(ids.shape[1]) if batch["labels"][0, i] == IGNORE] == boundaries
    assert torch.equal(batch["document_ids"], docs)
    with torch.no_grad():
        logits = model(batch["input_ids"], document_ids=batch["document_ids"])
        loss = F.cross_entropy(logits[0], batch["labels"][0], ignore_index=IGNORE)
        sums = [F.cross_entropy(model(ids[:, s])[0, :-1], ids[0, s][1:], reduction="sum") for s in _spans()]
    count = sum(n - 1 for n in LENGTHS)
    torch.testing.assert_close(loss, sum(sums) / count, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the data side
def _token_file(tmp_path, lengths, seed=0):
    rng = np.random.default_rng(seed)
    docs = ["".join(rng.choice(list("abcdefgh"), n)) for n in lengths]
    encode = lambda text: [ord(c) - ord("a") + 2 for c in text]
    return TokenFile.build(tmp_path / "tokens", docs, encode, 12, eos_id=1, show_progress=False)


def test_chunks_and_document_index_match_a_loop(tmp_path):
    files = _token_file(tmp_path, [3, 0, 1, 12, 5, 40])  # documents of 4, 1, 2, 13, 6, 41 tokens with EOS
    for length in (2, 5, 9, 64):
        starts, lengths = files.chunks(length)
        want = []
        for a, b in zip(files.offsets[:-1], files.offsets[1:]):
            s = a
            while s < b - 1:
                want.append((s, min(length, b - s)))
                s += length - 1
        assert list(zip(starts.tolist(), lengths.tolist())) == want
    where = files.document_index(torch.tensor([0, 3, 20]), 6)
    ref = [[int(np.searchsorted(files.offsets, p, "right")) - 1 for p in range(s, s + 6)] for s in (0, 3, 20)]
    assert where.tolist() == ref


def _write_documents(path, docs):
    path.write_text("\n\f\n".join(docs) + "\n")  # form feeds separate documents in a text file
    return path


WORDS = "the king queen lord speak hath thou thee love death night day".split()


def _documents(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(1, 9)))) for _ in range(n)]


def _pipeline(tmp_path, pack, seq_len=24):
    train = _write_documents(tmp_path / "train.txt", _documents(200, 0))
    valid = _write_documents(tmp_path / "valid.txt", _documents(30, 1))
    cfg = DataConfig(source=str(train), valid=str(valid), seq_len=seq_len, batch_size=4, pack=pack)
    return DataPipeline.build(cfg, tmp_path / "run", show_progress=False)


def test_document_masked_batches_from_the_pipeline(tmp_path, isolated_cache):
    pipe = _pipeline(tmp_path, "document_masked")
    eos = pipe.tokenizer.eos_token_id
    plain_cfg = dataclasses.replace(pipe.cfg, pack="plain")
    for batch, same in ((pipe.train_batch(torch.Generator().manual_seed(3)),
                         DataPipeline(plain_cfg, pipe.tokenizer, pipe.train, pipe.valid).train_batch(
                             torch.Generator().manual_seed(3))),
                        (next(iter(pipe.eval_batches(1))), None)):
        ids, labels, docs = batch["input_ids"], batch["labels"], batch["document_ids"]
        assert ids.shape == labels.shape == docs.shape == (4, 24)
        if same is not None:  # the windows plain packing draws with the same generator
            assert torch.equal(ids, same["input_ids"])
        starts = torch.zeros_like(docs, dtype=torch.bool)
        starts[:, 1:] = docs[:, 1:] != docs[:, :-1]
        assert bool((ids[:, 1:][starts[:, 1:]] != eos).all()) and bool((ids[:, :-1][starts[:, 1:]] == eos).all())
        assert bool((labels[:, :-1][starts[:, 1:]] == IGNORE).all())  # EOS -> the next document: no loss
        assert int((labels == IGNORE).sum()) == int(starts.sum()) + int((labels[:, -1] == IGNORE).sum())
        assert bool((docs[:, 0] == 0).all())


def test_pad_batches_hold_one_document_each_and_cover_every_token(tmp_path, isolated_cache):
    pipe = _pipeline(tmp_path, "pad", seq_len=16)
    eos, pad = pipe.tokenizer.eos_token_id, pipe.pad_id
    batch = pipe.train_batch(torch.Generator().manual_seed(0))
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape[1] <= 16 and ids.shape == labels.shape == mask.shape
    assert bool(((labels == IGNORE) == (mask == 0)).all()) and bool((ids[mask == 0] == pad).all())
    assert bool((ids[mask == 1] != eos).all())  # no EOS inside a row's inputs: one document per row
    labelled = sum(int((b["labels"] != IGNORE).sum()) for b in pipe.eval_batches(10_000))
    sizes = np.diff(pipe.valid.offsets)
    assert labelled == int(np.maximum(sizes - 1, 0).sum())  # every token of every document, once


def test_padded_logits_equal_the_document_alone():
    model = _model("learned")
    docs = [torch.randint(1, 50, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 9, 3)]
    batch = padded_batch(docs, pad_id=0)
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["attention_mask"])
        for i, doc in enumerate(docs):
            torch.testing.assert_close(logits[i, : len(doc) - 1], model(doc[None, :-1])[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- refused combinations
def test_bad_combinations_are_config_errors_naming_data_pack():
    with pytest.raises(ConfigError, match=r"^data\.pack: 'packed' is not one of plain, document_masked, pad"):
        DataConfig(pack="packed")
    for objective in ("masked_lm", "prefix_lm", "span_corruption"):
        with pytest.raises(ConfigError, match=r"^data\.pack: 'document_masked' .*causal_lm"):
            DataConfig(pack="document_masked", objective=objective)
    DataConfig(pack="plain", objective="masked_lm")  # plain is every objective's
    data = DataConfig(pack="document_masked")
    for kernel in ("sliding_window", "longformer", "bigbird", "local_block", "memory_compressed"):
        with pytest.raises(ConfigError, match=rf"^data\.pack: .*attention\.kernel='{kernel}'"):
            check_packing(data, presets.get("tiny-decoder", attention={"kernel": kernel}))
    check_packing(DataConfig(pack="pad"), presets.get("tiny-decoder", attention={"kernel": "sliding_window"}))
    memory = presets.get("tiny-decoder", memory_len=8, position={"scheme": "rotary"})
    for pack in ("pad", "document_masked"):
        with pytest.raises(ConfigError, match=r"^data\.pack: .*model\.memory_len=8"):
            check_packing(DataConfig(pack=pack), memory)
    for scheme in SCHEMES:
        check_packing(data, presets.get("tiny-decoder", position={"scheme": scheme}))
    cfg = TrainConfig.from_dict({"data": {"pack": "document_masked"}})
    assert cfg.data.pack == "document_masked" and TrainConfig.from_dict(cfg.to_dict()).data.pack == "document_masked"


def test_the_decoder_refuses_document_ids_it_cannot_honour():
    ids, docs = _row()
    model = _model("rotary", "sliding_window")
    with pytest.raises(ValueError, match="sliding_window applies its own sparse pattern"):
        model(ids, document_ids=docs)
    model = _model("rotary")
    with pytest.raises(ValueError, match=r"document_ids must have shape \(B, T\) = \(1, 24\)"):
        model(ids, document_ids=docs[:, :-1])
    with pytest.raises(ValueError, match="do not apply to .*a KV cache"):
        model(ids, document_ids=docs, cache=KVCache(32))
    with pytest.raises(ValueError, match="prefix_lengths"):
        model(ids, document_ids=docs, prefix_lengths=torch.tensor([3]))


def test_batch_loss_takes_the_document_ids():
    """The trainer's loss sees the documents: without them document_masked would train as plain."""
    from attnlab.training.tasks.batch_loss import batch_loss

    model = _model("learned")
    ids, docs = _row()
    batch = document_masked_batch(torch.cat([ids, torch.tensor([[11]])], 1), torch.cat([docs, torch.tensor([[3]])], 1))
    with torch.no_grad():
        want = F.cross_entropy(model(batch["input_ids"], document_ids=batch["document_ids"])[0], batch["labels"][0])
        torch.testing.assert_close(batch_loss(model, batch), want, atol=1e-5, rtol=1e-5)


def test_train_config_refuses_a_sparse_kernel_with_document_masking():
    with pytest.raises(ConfigError, match=r"^data\.pack: .*attention\.kernel='sliding_window'"):
        TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "attention": {"kernel": "sliding_window"}},
                               "data": {"pack": "document_masked"}})
