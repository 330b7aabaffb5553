"""Recurrent encoder-decoders in the training pipeline: the fused loss equals PyTorch's
cross-entropy over the model's logits, `attnlab train` runs a recurrent config on a TSV corpus,
and `attnlab translate` / `attnlab eval` / `attnlab.load` read the run folder; bad recurrent
configs are one-line errors that name the field."""

import json

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.data.objectives import seq2seq
from attnlab.decoding import generate
from attnlab.training.tasks.batch_loss import batch_loss

PAIRS = [(f"the {w} is {a} .", f"der {w} ist {b} .") for w in ("king", "queen", "lord", "sword", "crown")
         for a, b in (("here", "hier"), ("there", "dort"), ("old", "alt"))]


pytestmark = pytest.mark.usefixtures("isolated_cache")


@pytest.mark.parametrize("attention", ["none", "additive", "general"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_batch_loss_equals_cross_entropy_of_the_forward_logits(attention, label_smoothing):
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=31, d_model=16, dropout=0.0,
                      rnn={"cell": "gru", "attention": attention, "hidden_size": 12, "bidirectional": True,
                           "attention_hidden": 8})
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = seq2seq([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15, 16, 17]], pad_id=0, bos_id=2, eos_id=3)
    loss = batch_loss(model, batch, label_smoothing=label_smoothing)
    logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"], batch["tgt_mask"])
    ref = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                          label_smoothing=label_smoothing)
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref.backward()
    for mine, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(mine, want, atol=1e-5, rtol=1e-4)


def _run_config(tmp_path, **rnn):
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS * 4), encoding="utf-8")
    return {"model": {"arch": "rnn_encoder_decoder", "d_model": 16, "dropout": 0.0,
                      "rnn": {"cell": "lstm", "attention": "additive", "hidden_size": 16, **rnn}},
            "data": {"source": str(tmp_path / "pairs.tsv"), "valid": str(tmp_path / "pairs.tsv"), "objective": "seq2seq",
                     "batch_size": 4, "max_pair_len": 16, "tokenizer": {"kind": "char"}},
            "optim": {"lr": 0.01},
            "schedule": {"name": "constant", "warmup_steps": 0},
            "train": {"out_dir": str(tmp_path / "run"), "max_steps": 2, "eval_every": 2, "eval_batches": 1,
                      "log_every": 1, "checkpoint_every": 2, "bleu_samples": 4, "seed": 0, "threads": 1}}


@pytest.mark.parametrize("given_tokenizer", [False, True])
def test_train_two_steps_then_translate_eval_and_load_the_run_folder(tmp_path, capsys, given_tokenizer):
    cfg = _run_config(tmp_path)
    if given_tokenizer:  # data.tokenizer.path: the run folder still gets its own tokenizer.json
        from attnlab.tokenizers import Tokenizer

        Tokenizer.train([side for pair in PAIRS for side in pair], kind="char",
                        special_tokens=["<pad>", "<unk>", "<s>", "</s>"]).save(tmp_path / "tok.json")
        cfg["data"]["tokenizer"]["path"] = str(tmp_path / "tok.json")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg))
    assert main(["train", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.split("summary: ")[1])
    assert summary["steps"] == 2 and 0 <= summary["bleu"] <= 100 and 0 <= summary["chrf"] <= 100
    run = tmp_path / "run"
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["arch"] == "rnn_encoder_decoder" and saved["model"]["rnn"]["attention"] == "additive"
    if given_tokenizer:
        assert json.loads((run / "tokenizer.json").read_text()) == json.loads((tmp_path / "tok.json").read_text())

    assert main(["eval", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)

    model, tok = attnlab.load(run, with_tokenizer=True)
    assert type(model).__name__ == "RNNEncoderDecoder" and not model.training
    lines = ["the king is here .", "", "the sword is old ."]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["translate", str(run), "--input", str(tmp_path / "in.en"), "--output", str(tmp_path / "out.de"),
            "--num-beams", "1", "--max-new-tokens", "10", "--quiet"]
    assert main(args) == 0
    out = (tmp_path / "out.de").read_text(encoding="utf-8").split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""
    # the command line gives what the library gives (greedy, the tokenizer's bos/eos)
    eos, bos = tok.token_to_id("</s>"), tok.token_to_id("<s>")
    src = torch.tensor([tok.encode(lines[2], add_special_tokens=True)])
    ids = generate(model, src, 10, eos_token_id=eos, decoder_start_token_id=bos)[0, 1:].tolist()
    ids = ids[:ids.index(eos)] if eos in ids else ids
    assert out[2] == tok.decode(ids, skip_special_tokens=True)
    assert main(args[:-3] + ["--num-beams", "3", "--quiet"]) == 0  # beam search reads the same folder


@pytest.mark.parametrize("override,message", [
    (["--model.rnn.cell", "transformer"], "rnn.cell"),
    (["--model.rnn.hidden_size", "0"], "rnn.hidden_size"),
    (["--model.rnn.attention", "dot", "--model.rnn.bidirectional", "true"], "rnn.attention: 'dot'"),
    (["--model.rnn.cells", "lstm"], "unknown rnn field"),
    (["--data.objective", "causal_lm", "--data.source", "{text}", "--data.valid", "{text}"],
     "model.arch: 'rnn_encoder_decoder' needs data.objective"),
])
def test_a_bad_recurrent_config_is_an_error_naming_the_field(tmp_path, capsys, override, message):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_run_config(tmp_path)))
    (tmp_path / "plain.txt").write_text("the king is here .\n" * 20, encoding="utf-8")
    override = [o.replace("{text}", str(tmp_path / "plain.txt")) for o in override]
    assert main(["train", str(path), *override]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after any tokenisation progress lines
    assert message in last and last.startswith("attnlab train: error:")
    assert not (tmp_path / "run" / "checkpoints").exists()
