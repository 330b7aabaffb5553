"""examples/studies/summarisation/run.py: its summaries (batched by length) against one document
at a time through `attnlab.generate`, for each kind of model; and, slow, the study's claim at a
reduced budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from attnlab import ModelConfig, build_model, generate
from attnlab.data.objectives import pairs_lm, seq2seq
from attnlab.tokenizers import Tokenizer
from attnlab.training.tasks.batch_loss import batch_loss

from tests.studies import STUDIES, load_study

SCRIPT = STUDIES / "summarisation" / "run.py"
DOCUMENTS = ["a tool to fix the disk", "library for parsing the json files", "a tool to fix the nets",
             "the daemon", "fonts", "library for reading json and yaml files of all kinds"]


def study():
    return load_study("summarisation")


def _model(arch: str, tok: Tokenizer) -> torch.nn.Module:
    fields = {"rnn_encoder_decoder": {"rnn": {"cell": "lstm", "attention": "additive", "hidden_size": 16,
                                              "bidirectional": True}},
              "encoder_decoder": {},
              "decoder": {"attention": {"kernel": "memory_compressed",
                                        "kernel_options": {"compression": 3, "block_size": 8}}}}[arch]
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=tok.vocab_size, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      dropout=0.0, pad_token_id=tok.pad_token_id, position={"scheme": "sinusoidal", "max_len": 128},
                      **fields)
    model = build_model(cfg)
    # a few steps on "document -> its last word" with the study's objective, so that what a model
    # writes depends on the document (untrained, most write one string for every input)
    src, tgt = [tok.encode(d) for d in DOCUMENTS], [tok.encode(d.split()[-1]) for d in DOCUMENTS]
    batch = seq2seq(src, tgt, pad_id=tok.pad_token_id, bos_id=tok.bos_token_id, eos_id=tok.eos_token_id) \
        if arch != "decoder" else pairs_lm(src, tgt, pad_id=tok.pad_token_id, sep_id=tok.sep_token_id,
                                           eos_id=tok.eos_token_id)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(40):
        optimizer.zero_grad()
        batch_loss(model, batch).backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("arch", ["rnn_encoder_decoder", "encoder_decoder", "decoder"])
def test_summaries_in_batches_equal_one_document_at_a_time(arch):
    """Documents of equal length share a batch (the first and third here); each summary equals
    generating from that document alone: the source + EOS from BOS for an encoder-decoder,
    `document [SEP]` for a decoder, up to EOS."""
    tok = Tokenizer.train(DOCUMENTS, kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>", "<sep>"])
    model, s = _model(arch, tok), study()
    got = s.summarise(model, tok, DOCUMENTS, max_new_tokens=6, batch_size=4)
    eos = tok.eos_token_id
    for document, summary in zip(DOCUMENTS, got):
        ids = tok.encode(document)[:s.MAX_LEN]
        if arch == "decoder":
            prompt = torch.tensor([ids + [tok.sep_token_id]])
            new = generate(model, prompt, 6, eos_token_id=eos)[0, prompt.shape[1]:].tolist()
        else:
            new = generate(model, torch.tensor([ids + [eos]]), 6, eos_token_id=eos,
                           decoder_start_token_id=tok.bos_token_id)[0, 1:].tolist()
        new = new[:new.index(eos)] if eos in new else new
        assert summary == tok.decode(new, skip_special_tokens=True)
    assert len(tok.encode(DOCUMENTS[0])) == len(tok.encode(DOCUMENTS[2]))  # a batch of two was decoded
    assert len(set(got)) > 2  # the summaries depend on the documents


def test_the_baseline_is_the_first_words():
    assert study().first_words("  Daemon for   exposing legacy ALSA MIDI in JACK MIDI systems", 3) == "Daemon for exposing"


@pytest.mark.slow
def test_the_encoder_decoder_leads_the_decoder_alone_at_five_cpu_minutes(tmp_path):
    """The study's robust claim at a reduced budget (5 CPU-minutes each on debian-summaries): at
    equal time the Transformer encoder-decoder predicts the summaries better than the decoder-only
    Transformer of as many layers, which runs all six over document and summary where the
    encoder-decoder's decoder reads the summary alone (measured in the full study: perplexity
    304 against 539 at 5 minutes, 145 against 280 at 10)."""
    out = tmp_path / "study"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--marks", "5", "--models", "transformer",
                    "decoder", "--rouge-docs", "50", "--val-pairs", "640", "--jobs", "2"], check=True, timeout=3600,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    results = json.loads((out / "results.json").read_text())["results"]
    encoder_decoder, decoder = results["transformer"]["5"], results["decoder"]["5"]
    assert encoder_decoder["val_ppl"] < 0.8 * decoder["val_ppl"]
