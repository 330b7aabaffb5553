"""Sequence scoring: each text's log-probability equals the sum of its tokens' log-softmax from
a plain forward pass of that text alone (batching and padding change nothing), for decoder-only
and encoder-decoder models, and `attnlab score` prints those numbers, most likely first."""

import json

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.decoding.scoring import score_texts
from attnlab.interop.serialization import save
from attnlab.tokenizers import Tokenizer

TEXTS = ["turn off the lights", "off turn the lights", "the", "lights off, turn them"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXTS + ["hello world"], kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>"])


def _model(arch, vocab, **config):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=vocab, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      position={"scheme": "learned", "max_len": 64}, init_std=0.3, **config)
    return build_model(cfg).eval()


def _alone(model, ids, src=None):
    """log P of ids[1:] given ids[0] (and the source), one unpadded forward pass."""
    ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(torch.tensor([src]), ids) if src is not None else model(ids)
    logp = logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, ids[0, 1:, None]).sum().item()


def test_decoder_scores_equal_each_text_alone(tok):
    model = _model("decoder", tok.vocab_size)
    bos = tok.token_to_id("<s>")
    scores = score_texts(model, tok, TEXTS, batch_size=3)  # two batches, padded rows in each
    for text, s in zip(TEXTS, scores):
        ids = [bos] + tok.encode(text)
        assert s.tokens == len(ids) - 1
        assert s.log_prob == pytest.approx(_alone(model, ids), abs=1e-4)
    with_eos = score_texts(model, tok, TEXTS[:1], with_eos=True)[0]
    assert with_eos.tokens == scores[0].tokens + 1 and with_eos.log_prob < scores[0].log_prob


def test_encoder_decoder_scores_the_target_given_the_source(tok):
    model = _model("encoder_decoder", tok.vocab_size)
    sources = ["hello world", "the lights"] * 2
    scores = score_texts(model, tok, TEXTS, sources=sources, batch_size=4)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    for text, src, s in zip(TEXTS, sources, scores):  # the source as the seq2seq objective trains it: pieces + EOS
        ref = _alone(model, [bos] + tok.encode(text), src=tok.encode(src) + [eos])
        assert s.log_prob == pytest.approx(ref, abs=1e-4)
    with pytest.raises(ValueError, match="one source per text"):
        score_texts(model, tok, TEXTS)


def test_bad_inputs_are_refused(tok):
    model = _model("decoder", tok.vocab_size)
    with pytest.raises(ValueError, match="at least one"):
        score_texts(model, tok, [])
    with pytest.raises(ValueError, match="decoder-only"):
        score_texts(model, tok, ["the"], sources=["x"])


@pytest.mark.parametrize("arch, config, what", [
    ("encoder", {"head": "mlm"}, "arch='encoder', head='mlm'"),
    ("encoder", {}, "arch='encoder', head='none'"),
    ("encoder", {"head": "classification", "num_labels": 2}, "arch='encoder', head='classification'"),
    ("decoder", {"head": "classification", "num_labels": 2}, "arch='decoder', head='classification'"),
])
def test_a_model_that_does_not_predict_the_next_token_is_refused(tok, arch, config, what):
    """A masked-LM's logits at a position see the token there: scored as next-token
    probabilities they give a perplexity that looks fine and means nothing."""
    with pytest.raises(ValueError) as err:
        score_texts(_model(arch, tok.vocab_size, **config), tok, TEXTS[:2])
    assert str(err.value).startswith("score needs a causal language model") and what in str(err.value)
    assert ("attnlab fill-mask" in str(err.value)) == (config.get("head") == "mlm")


def test_a_recurrent_encoder_decoder_is_scored(tok):
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="rnn_encoder_decoder", vocab_size=tok.vocab_size, d_model=16,
                                    rnn={"cell": "gru", "hidden_size": 16}))
    assert all(s.tokens > 0 for s in score_texts(model, tok, TEXTS[:2], sources=["hello world"] * 2))


def test_the_command_refuses_a_masked_lm_in_one_line(tmp_path, tok, capsys):
    save(_model("encoder", tok.vocab_size, head="mlm"), tmp_path / "mlm", tokenizer=tok)
    assert main(["score", str(tmp_path / "mlm"), "turn off the lights"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert captured.err.startswith("attnlab score: error: score needs a causal language model") and \
        "attnlab fill-mask" in captured.err


def test_the_command_prints_each_score_most_likely_first(tmp_path, tok, capsys):
    model = _model("decoder", tok.vocab_size)
    save(model, tmp_path / "lm", tokenizer=tok)
    assert main(["score", str(tmp_path / "lm"), *TEXTS[:2], "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = {s.text: s.log_prob for s in score_texts(model, tok, TEXTS[:2])}
    assert {r["text"]: r["log_prob"] for r in rows} == pytest.approx(expected)
    assert rows[0]["log_prob"] >= rows[1]["log_prob"]
    assert main(["score", str(tmp_path / "lm")]) == 2  # no texts: a one-line error
    assert "give texts" in capsys.readouterr().err
