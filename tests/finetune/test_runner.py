"""The fine-tuning path: decoder classification on the last real token, GPT's auxiliary LM
loss, data errors, intermediate-task transfer."""

import json

import pytest
import torch
import torch.nn.functional as F

from attnlab.finetune import Example, Finetuner, LabelMap, Recipe, read_examples, task_loss, with_head
from attnlab.finetune.data import encode_batch
from tests.finetune.helpers import char_tokenizer, colour_rows, tiny, write_csv

EXAMPLES = [Example("the cat"), Example("a dog ran far away"), Example("sun")]


def test_decoder_classifies_the_last_real_token_under_left_and_right_padding():
    torch.manual_seed(0)
    model = with_head(tiny("decoder"), "classification", 3, seed=0).eval()
    tok = char_tokenizer()
    logits = {}
    for side in ("left", "right"):
        run = Finetuner(model, tok, EXAMPLES, [0, 1, 2], Recipe(padding_side=side, precision="fp32"), seed=0)
        logits[side] = run.predict(EXAMPLES)
    alone = torch.cat([run.predict([e]) for e in EXAMPLES])  # no padding at all
    torch.testing.assert_close(logits["left"], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits["right"], alone, rtol=1e-5, atol=1e-5)
    # and it really is the last real token: the head applied to that position's hidden state
    batch = encode_batch(tok, EXAMPLES, max_length=32, padding_side="left")
    hidden = model.features(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(model.head(hidden[:, -1]), logits["left"], rtol=1e-5, atol=1e-5)


def test_auxiliary_lm_loss_is_cls_plus_lambda_lm_by_hand():
    model = with_head(tiny("decoder", tie_embeddings=True), "classification", 2, seed=0).eval()
    tok = char_tokenizer()
    batch = encode_batch(tok, EXAMPLES, max_length=32, padding_side="right")
    labels = torch.tensor([0, 1, 1])
    lam = 0.5
    loss, parts = task_loss(model, batch, labels, lm_weight=lam)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    cls = F.cross_entropy(model(ids, mask), labels)
    hidden = model.features(ids, mask)
    total, count = 0.0, 0
    for b in range(ids.shape[0]):  # position by position, real tokens followed by a real token only
        for t in range(ids.shape[1] - 1):
            if mask[b, t] and mask[b, t + 1]:
                logits = hidden[b, t] @ model.embed.token.weight.T
                total = total + F.cross_entropy(logits[None], ids[b, t + 1][None])
                count += 1
    lm = total / count
    torch.testing.assert_close(loss, cls + lam * lm, rtol=1e-5, atol=1e-6)
    assert parts["cls"] == pytest.approx(cls.item(), rel=1e-5) and parts["lm"] == pytest.approx(lm.item(), rel=1e-5)
    with pytest.raises(ValueError, match="decoder"):
        task_loss(with_head(tiny("encoder"), "classification", 2), batch, labels, lm_weight=lam)


@pytest.mark.parametrize("steps", [30, pytest.param(60, marks=pytest.mark.slow)])  # 30 reach 1.0 here
def test_finetuning_learns_a_toy_task_and_transfers_to_another(steps):
    torch.manual_seed(0)
    tok = char_tokenizer()
    rows = colour_rows(96)
    exs = [Example(t, label=y) for t, y in rows]
    labels = LabelMap.from_examples(exs)
    model = with_head(tiny("encoder", num_layers=2), "classification", len(labels), pooling="mean", seed=0)
    run = Finetuner(model, tok, exs[:64], labels.encode(exs[:64]),
                    Recipe(lr=3e-3, max_steps=steps, batch_size=16, warmup_ratio=0.0), seed=0)
    run.train(steps)
    assert run.evaluate(exs[64:], labels.encode(exs[64:]))["accuracy"] >= 0.9
    # task B (2 labels: does the text contain "red"?) starts from task A's backbone with a new head
    b_model = with_head(run.model, "classification", 2, seed=1)
    assert b_model.head.proj.out_features == 2
    for name, p in run.model.named_parameters():
        if not name.startswith("head."):
            assert torch.equal(p, dict(b_model.named_parameters())[name])


@pytest.mark.parametrize("steps", [30, pytest.param(60, marks=pytest.mark.slow)])  # 30 reach 1.0 here
def test_bf16_recipe_runs_the_forward_in_bf16_keeps_fp32_weights_and_learns(steps):
    torch.manual_seed(0)
    tok = char_tokenizer()
    exs = [Example(t, label=y) for t, y in colour_rows(96)]
    labels = LabelMap.from_examples(exs)
    model = with_head(tiny("encoder", num_layers=2), "classification", len(labels), pooling="mean", seed=0)
    seen = []
    model.head.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    run = Finetuner(model, tok, exs[:64], labels.encode(exs[:64]),
                    Recipe(lr=3e-3, max_steps=steps, batch_size=16, warmup_ratio=0.0, precision="bf16"), seed=0)
    run.train(steps)
    assert set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert run.predict(exs[:2]).dtype == torch.float32 and seen[-1] == torch.bfloat16
    assert run.evaluate(exs[64:], labels.encode(exs[64:]))["accuracy"] >= 0.9
    with pytest.raises(ValueError, match="recipe.precision: 'fp8' is not one of auto, fp32, bf16, fp16"):
        Recipe(precision="fp8")


def test_data_errors_name_the_row_or_column(tmp_path):
    good = write_csv(tmp_path / "a.csv", ["text", "label"], [["x y", "pos"], ["z", "neg"]])
    with pytest.raises(ValueError, match=r"text_column='sentence' is not a column"):
        read_examples(good, text_column="sentence")
    with pytest.raises(ValueError, match=r"label_column='y'"):
        read_examples(good, label_column="y")
    empty = tmp_path / "e.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        read_examples(empty)
    header_only = write_csv(tmp_path / "h.csv", ["text", "label"], [])
    with pytest.raises(ValueError, match="empty"):
        read_examples(header_only)
    blank = write_csv(tmp_path / "b.csv", ["text", "label"], [["ok", "pos"], ["", "neg"]])
    with pytest.raises(ValueError, match="row 3"):
        read_examples(blank)
    jl = tmp_path / "d.jsonl"
    jl.write_text(json.dumps({"text": "a", "label": "pos"}) + "\n" + json.dumps({"txt": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="row 2"):
        read_examples(jl)
    with pytest.raises(ValueError, match=r"example 1 has label 'maybe'.*\['neg', 'pos'\]"):
        LabelMap(["neg", "pos"]).encode([Example("a", label="pos"), Example("b", label="maybe")], "valid.csv")
    unknown = write_csv(tmp_path / "u.csv", ["text", "label"], [["ok", "pos"], ["fine", "neg"], ["hm", "maybe"]])
    with pytest.raises(ValueError, match=r"u.csv: row 4 has label 'maybe'"):
        LabelMap(["neg", "pos"]).encode(read_examples(unknown), str(unknown))
    with pytest.raises(FileNotFoundError):
        read_examples(tmp_path / "missing.csv")


@pytest.mark.parametrize("pretraining", [{"sbo_head": True}, {"type_vocab_size": 2, "pooler": True, "nsp_head": True}])
def test_an_encoder_pretrained_with_span_boundary_or_next_sentence_heads_fine_tunes(pretraining):
    """SpanBERT's SBO head and BERT's NSP classifier are pretraining-only: the task model drops
    them and keeps every backbone tensor (the pooler and segment embeddings included)."""
    pretrained = tiny("encoder", head="mlm", **pretraining)
    model = with_head(pretrained, "classification", 3, seed=0)
    assert not model.config.sbo_head and not model.config.nsp_head
    kept = model.state_dict()
    for name, tensor in pretrained.state_dict().items():
        if name.startswith(("head.", "sbo_head.", "nsp_head.")):
            assert name not in kept or name.startswith("head.")
        else:
            torch.testing.assert_close(kept[name], tensor, rtol=0, atol=0)
    batch = encode_batch(char_tokenizer(), EXAMPLES, max_length=32, padding_side="right")
    assert model(batch["input_ids"], batch["attention_mask"]).shape == (3, 3)
