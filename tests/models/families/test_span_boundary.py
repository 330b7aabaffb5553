"""SpanBERT's span-boundary objective (SBO): the boundaries are the tokens just outside each span,
the loss equals a loop over the spans written from the paper's equations (with the MLM head's
output matrix shared), the head survives save/load, the config refuses what does not fit naming
the field, and a short training run lowers the SBO loss."""

import pytest
import torch
import torch.nn.functional as F

import attnlab.models
import attnlab.models.build
from attnlab.config import ModelConfig
from attnlab.config.validate import ConfigError
from attnlab.data.objectives import IGNORE, span_boundaries, span_masked_lm
from attnlab.interop.serialization import load, save
from attnlab.models.heads import SpanBoundaryHead, span_boundary_head
from attnlab.training.config import DataConfig
from attnlab.training.data.objectives import OBJECTIVES
from attnlab.models.families.span_boundary import sbo_eval_sums, sbo_logits, sbo_loss

V, MASK = 30, 4  # ids 0..4 are special ([PAD] [UNK] [CLS] [SEP] [MASK])
SPECIAL = (0, 1, 2, 3, 4)


def encoder_config(**kw) -> ModelConfig:
    base = dict(arch="encoder", head="mlm", vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                dropout=0.0, position={"scheme": "learned", "max_len": 64}, sbo_head=True, sbo_max_span=8)
    return ModelConfig(**{**base, **kw})


def draw(B=6, T=24, seed=0, padded=True, **kw):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = 2  # [CLS]
    mask = torch.ones(B, T, dtype=torch.long)
    if padded:
        mask[0, T - 5:] = 0
        ids[0, T - 5:] = 0
    starts = torch.rand(B, T, generator=g) < 0.7  # words of one to a few tokens
    return ids, mask, span_masked_lm(ids, g, vocab_size=V, mask_id=MASK, special_ids=SPECIAL, word_starts=starts,
                                     attention_mask=mask, mask_prob=0.3, span_boundary=True, **kw)


def runs(row_labels):
    """Maximal runs (s, e) of labelled positions of one row, by a plain loop."""
    out, s = [], None
    for i, label in enumerate(row_labels.tolist() + [IGNORE]):
        if label != IGNORE and s is None:
            s = i
        elif label == IGNORE and s is not None:
            out.append((s, i - 1))
            s = None
    return out


# ---- the boundaries --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_the_boundaries_are_the_tokens_just_outside_each_span(seed):
    ids, mask, batch = draw(seed=seed)
    T = ids.shape[1]
    left, right = batch["span_left"], batch["span_right"]
    expect_l, expect_r = torch.full_like(ids, -1), torch.full_like(ids, -1)
    n_targets = 0
    for b in range(ids.shape[0]):
        for s, e in runs(batch["labels"][b]):
            if s - 1 < 0 or e + 1 >= T or not mask[b, s - 1] or not mask[b, e + 1]:
                continue  # no boundary on one side: no SBO target
            assert batch["labels"][b, s - 1] == IGNORE and batch["labels"][b, e + 1] == IGNORE  # unmasked
            expect_l[b, s:e + 1], expect_r[b, s:e + 1] = s - 1, e + 1
            n_targets += e - s + 1
    assert n_targets > 10
    assert torch.equal(left, expect_l) and torch.equal(right, expect_r)


def test_the_flag_does_not_change_the_draws():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ids = torch.randint(5, V, (4, 20), generator=torch.Generator().manual_seed(9))
    a = span_masked_lm(ids, g1, vocab_size=V, mask_id=MASK, special_ids=SPECIAL, mask_prob=0.3)
    b = span_masked_lm(ids, g2, vocab_size=V, mask_id=MASK, special_ids=SPECIAL, mask_prob=0.3, span_boundary=True)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert set(b) == {"input_ids", "labels", "span_left", "span_right"} and set(a) == {"input_ids", "labels"}


def test_span_boundaries_by_hand():
    left, right = span_boundaries(torch.tensor([[IGNORE, 7, 8, IGNORE, 9], [5, IGNORE, 6, IGNORE, IGNORE]]))
    assert left.tolist() == [[-1, 0, 0, -1, -1], [-1, -1, 1, -1, -1]]
    assert right.tolist() == [[-1, 3, 3, -1, -1], [-1, -1, 3, -1, -1]]
    left, _ = span_boundaries(torch.tensor([[IGNORE, 7, IGNORE]]), attention_mask=torch.tensor([[1, 1, 0]]))
    assert left.tolist() == [[-1, -1, -1]]  # its right boundary is padding


# ---- the loss --------------------------------------------------------------------------------

def reference_sbo_loss(model, hidden, labels):
    """Joshi et al. 2020, eq. (1)-(2), one span at a time: h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}],
    h1 = LayerNorm(GELU(W1 h0)), y = LayerNorm(GELU(W2 h1)), logits = y E^T + b with E the token
    embedding (tied to the MLM output); the mean cross-entropy over every token of every span."""
    head = model.sbo_head
    E = model.embed.token.weight
    T, losses = hidden.shape[1], []
    for b in range(hidden.shape[0]):
        for s, e in runs(labels[b]):
            if s == 0 or e == T - 1:
                continue
            for i in range(s, e + 1):
                p = head.position.weight[min(i - s, head.position.num_embeddings - 1)]
                h0 = torch.cat([hidden[b, s - 1], hidden[b, e + 1], p])
                h1 = F.layer_norm(F.gelu(head.dense1.weight @ h0 + head.dense1.bias), (h0.shape[0] // 3,),
                                  head.norm1.weight, head.norm1.bias, head.norm1.eps)
                y = F.layer_norm(F.gelu(head.dense2.weight @ h1 + head.dense2.bias), h1.shape,
                                 head.norm2.weight, head.norm2.bias, head.norm2.eps)
                logits = E @ y + head.decoder.bias
                losses.append(F.cross_entropy(logits[None], labels[b, i][None]))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("max_span", [8, 2])  # 2: tokens past the table take its last row
def test_the_sbo_loss_equals_a_per_span_loop_reference(max_span):
    torch.manual_seed(0)
    model = attnlab.models.build_model(encoder_config(sbo_max_span=max_span))
    assert model.sbo_head.decoder.weight is model.embed.token.weight  # the output embedding is shared
    with torch.no_grad():  # weights away from their init, so every term matters
        for p in model.sbo_head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ids, mask, batch = draw(padded=False, seed=5)
    hidden = model.features(batch["input_ids"])
    loss = sbo_loss(model, hidden, batch)
    ref = reference_sbo_loss(model, hidden, batch["labels"])
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    g1 = torch.autograd.grad(loss, [model.sbo_head.dense1.weight, model.embed.token.weight], retain_graph=True)
    g2 = torch.autograd.grad(ref, [model.sbo_head.dense1.weight, model.embed.token.weight])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    sums = sbo_eval_sums(model, hidden, batch)
    assert sums["sbo_count"] == int((batch["span_left"] >= 0).sum())
    assert sums["sbo_loss_sum"] / sums["sbo_count"] == pytest.approx(float(ref.detach()), rel=1e-5)


def test_a_model_without_the_head_is_named_in_the_error():
    model = attnlab.models.build.build_model(encoder_config(sbo_head=False))
    _, _, batch = draw()
    with pytest.raises(ValueError, match="sbo_head=True"):
        sbo_loss(model, model.features(batch["input_ids"]), batch)


def test_a_batch_without_targets_costs_nothing():
    model = attnlab.models.build_model(encoder_config())
    ids = torch.randint(5, V, (2, 6))
    batch = {"input_ids": ids, "labels": torch.full_like(ids, IGNORE), "span_left": torch.full_like(ids, -1),
             "span_right": torch.full_like(ids, -1)}
    loss = sbo_loss(model, model.features(ids), batch)
    assert float(loss.detach()) == 0.0 and loss.requires_grad


# ---- the model field -------------------------------------------------------------------------

def test_save_and_load_keep_the_head_and_its_logits(tmp_path):
    torch.manual_seed(1)
    model = attnlab.models.build_model(encoder_config(tie_embeddings=False)).eval()
    assert model.sbo_head.decoder.weight is model.head.decoder.weight  # shared with the MLM output, untied too
    _, _, batch = draw(seed=2)
    save(model, tmp_path / "m")
    back = load(tmp_path / "m")
    assert back.config.sbo_head and back.config == model.config
    assert back.sbo_head.decoder.weight is back.head.decoder.weight
    with torch.no_grad():
        a = sbo_logits(model, model.features(batch["input_ids"]), batch)
        b = sbo_logits(back, back.features(batch["input_ids"]), batch)
    assert a.shape[0] == int((batch["span_left"] >= 0).sum()) and torch.equal(a, b)


def test_build_model_builds_the_head():
    model = attnlab.models.build.build_model(encoder_config())
    assert isinstance(getattr(model, "sbo_head", None), SpanBoundaryHead)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="^sbo_head: true sits beside the MLM head"):
        ModelConfig(arch="encoder", head="none", sbo_head=True)
    with pytest.raises(ConfigError, match="^sbo_max_span"):
        encoder_config(sbo_max_span=0)
    with pytest.raises(ConfigError, match="^data.span_boundary: true needs data.objective='span_masked_lm'"):
        DataConfig(objective="masked_lm", span_boundary=True)
    assert DataConfig(objective="span_masked_lm", span_boundary=True).span_boundary
    from attnlab.models.vision import VisionConfig

    with pytest.raises(ConfigError, match="encoder.sbo_head"):
        VisionConfig(encoder={"sbo_head": True, "head": "classification"})


def test_the_objective_decides_the_model_field_and_carries_the_boundaries():
    spec = OBJECTIVES["span_masked_lm"]
    assert spec.model_fields(False, span_boundary=True) == {"arch": "encoder", "head": "mlm", "sbo_head": True}
    assert "sbo_head" not in spec.model_fields(False)
    assert "sbo_head" not in OBJECTIVES["masked_lm"].model_fields(False, span_boundary=True)
    ModelConfig().replace(**spec.model_fields(False, span_boundary=True))  # validates

    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(["the cat sat on the mat", "a dog ran in the park"] * 4, kind="char",
                          special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])

    class Files:  # random windows of a token stream, as TokenFile gives them
        stream = torch.tensor(tok.encode("the cat sat on the mat and a dog ran in the park " * 6))

        def random_windows(self, n, length, generator):
            starts = torch.randint(0, len(self.stream) - length, (n,), generator=generator)
            return torch.stack([self.stream[s:s + length] for s in starts.tolist()])

    cfg = DataConfig(objective="span_masked_lm", span_boundary=True, seq_len=32, batch_size=4, mask_prob=0.2)
    batch = spec.train_batch(cfg, tok, Files(), torch.Generator().manual_seed(0))
    left, right = span_boundaries(batch["labels"])
    assert torch.equal(batch["span_left"], left) and torch.equal(batch["span_right"], right)
    assert (left >= 0).any()


# ---- training --------------------------------------------------------------------------------

def test_a_short_training_run_lowers_the_sbo_loss():
    """Rows count up by one (x_t = a + t mod 25): a masked token is its left boundary plus its
    place in the span, which only the SBO head's inputs tell; MLM + SBO trained together."""
    torch.manual_seed(0)
    model = attnlab.models.build_model(encoder_config(num_layers=1, d_ff=48)).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def batch_of(seed):
        g = torch.Generator().manual_seed(seed)
        ids = 5 + (torch.randint(0, 25, (16, 1), generator=g) + torch.arange(20)) % 25
        return span_masked_lm(ids, g, vocab_size=V, mask_id=MASK, special_ids=SPECIAL, mask_prob=0.25,
                              span_boundary=True, replace_probs=(1.0, 0.0))

    fixed = batch_of(10_000)

    def eval_loss():
        model.eval()
        with torch.no_grad():
            value = float(sbo_loss(model, model.features(fixed["input_ids"]), fixed))
        model.train()
        return value

    before = eval_loss()
    for step in range(120):
        batch = batch_of(step)
        hidden = model.features(batch["input_ids"])
        keep = batch["labels"] != IGNORE
        mlm = F.cross_entropy(model.head(hidden[keep]), batch["labels"][keep])
        loss = mlm + sbo_loss(model, hidden, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = eval_loss()
    assert before > 2.5 and after < 0.5 * before, (before, after)
