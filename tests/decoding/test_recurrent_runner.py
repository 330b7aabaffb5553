"""Decoding recurrent encoder-decoders (attnlab.decoding.runner.RecurrentRunner): the
incremental state gives the teacher-forced logits at every step, beams reorder it correctly,
one beam is greedy, n-best scores are the documented length-normalised log-probabilities, and
the cached and uncached paths agree for greedy, sampling and beam search."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.decoding import generate, sequence_log_probs
from attnlab.decoding.runner import RecurrentRunner, make_runner

from .helpers import V, left_padded
from .test_beam import _new_tokens

VARIANTS = [(cell, att) for cell in ("rnn", "lstm", "gru", "conv") for att in ("none", "additive", "general")]


def rnn(cell: str, attention: str, *, num_layers: int = 2, bidirectional: bool = False, seed: int = 0):
    """A random recurrent model; embeddings N(0, 1) so that next-token choices are far from ties."""
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16, dropout=0.0,
                      rnn={"cell": cell, "attention": attention, "hidden_size": 24, "num_layers": num_layers,
                           "bidirectional": bidirectional and cell != "conv"})
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.tgt_embed.weight.normal_(0, 1.0)
    return model


@pytest.mark.parametrize("cell,attention", VARIANTS)
def test_incremental_logits_equal_teacher_forcing_at_every_step(cell, attention):
    model = rnn(cell, attention, bidirectional=True)
    src, mask = left_padded([6, 3, 5], seed=1)  # source padding on the left: allowed anywhere
    tgt = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(src, tgt, mask)  # (3, 7, V)
        runner = make_runner(model, use_cache=True, max_len=8, src=src, src_mask=mask)
        assert isinstance(runner, RecurrentRunner)
        steps = [runner.start(tgt[:, :1], None)]
        steps += [runner.step(tgt[:, :t + 1], None) for t in range(1, 7)]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["none", "additive", "general"])
def test_reorder_moves_the_state_with_the_rows(attention):
    model = rnn("lstm", attention)
    src, mask = left_padded([5, 4], seed=3)
    tgt = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(4))
    expand = torch.tensor([0, 0, 1, 1])  # two beams per item
    swap = torch.tensor([1, 0, 3, 2])  # each item's beams trade places after step 2
    with torch.no_grad():
        runner = make_runner(model, use_cache=True, max_len=6, src=src, src_mask=mask)
        runner.start(tgt[:, :1], None)
        runner.expand(expand)
        rows = tgt.index_select(0, expand).clone()
        rows[1, 1:] = torch.randint(3, V, (4,), generator=torch.Generator().manual_seed(5))  # beam 1 differs
        rows[3, 1:] = torch.randint(3, V, (4,), generator=torch.Generator().manual_seed(6))
        runner.step(rows[:, :2], None)
        runner.step(rows[:, :3], None)
        runner.reorder(swap)
        rows = rows.index_select(0, swap)
        got = torch.stack([runner.step(rows[:, :t + 1], None) for t in range(3, 5)], 1)
        want = model(src.index_select(0, expand), rows, mask.index_select(0, expand))[:, 3:5]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell,attention", [("rnn", "none"), ("lstm", "additive"), ("gru", "general")])
def test_cached_equals_uncached_for_greedy_sampling_and_beams(cell, attention):
    model = rnn(cell, attention)
    src, mask = left_padded([6, 2, 4], seed=7)
    kw = dict(attention_mask=mask, decoder_start_token_id=1)
    for extra in ({}, {"num_beams": 3, "num_return_sequences": 2, "eos_token_id": 2},
                  {"do_sample": True, "top_k": 5, "num_return_sequences": 2}):
        gens = [torch.Generator().manual_seed(0) for _ in range(2)] if extra.get("do_sample") else [None, None]
        cached = generate(model, src, 6, **kw, **extra, generator=gens[0])
        full = generate(model, src, 6, **kw, **extra, generator=gens[1], use_cache=False)
        assert torch.equal(cached, full), extra
        assert (cached[:, 0] == 1).all() and cached.shape[1] <= 7


def test_greedy_is_the_argmax_of_the_teacher_forced_forward():
    model = rnn("gru", "additive")
    src, mask = left_padded([5, 3], seed=8)
    out = generate(model, src, 6, attention_mask=mask, decoder_start_token_id=1)
    with torch.no_grad():
        logits = model(src, out[:, :-1], mask)
    assert torch.equal(logits.argmax(-1), out[:, 1:])


@pytest.mark.parametrize("with_eos", [False, True])
def test_one_beam_through_the_beam_code_equals_greedy(with_eos):
    from attnlab.decoding.beam import beam_search
    from attnlab.decoding.search import DecodeOptions

    model = rnn("rnn", "general", seed=2)
    src, mask = left_padded([5, 2, 4], seed=9)
    kw = dict(attention_mask=mask, decoder_start_token_id=1)
    eos = None
    if with_eos:  # a token row 0 first emits at step >= 2, so that rows finish at different steps
        row = generate(model, src, 8, **kw)[0, 1:].tolist()
        eos = next(t for i, t in enumerate(row) if i >= 2 and t not in row[:i])
    greedy = generate(model, src, 8, **kw, eos_token_id=eos, pad_token_id=0)
    ids = torch.zeros(3, 9, dtype=torch.long)
    ids[:, 0] = 1
    opt = DecodeOptions(eos=torch.tensor([eos]) if eos is not None else None, pad_token_id=0)
    with torch.no_grad():
        runner = make_runner(model, use_cache=True, max_len=9, src=src, src_mask=mask.bool())
        out, _ = beam_search(runner, ids, torch.ones_like(ids, dtype=torch.bool), 1, 8, opt, num_beams=1,
                             length_penalty=1.0, early_stopping=True, num_return_sequences=1, padded=False)
    assert torch.equal(out, greedy)
    if with_eos:
        for r in range(3):
            new_tokens = out[r, 1:].tolist()
            if eos in new_tokens:  # a finished row is padded after its EOS
                assert all(t == 0 for t in new_tokens[new_tokens.index(eos) + 1:])
        assert eos in out[0].tolist() and out.shape[1] > 3


@pytest.mark.parametrize("attention", ["none", "additive"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_four_beams_nbest_scores_are_summed_log_probs_under_the_length_penalty(attention, length_penalty):
    model = rnn("rnn", attention)
    src, mask = left_padded([6, 3], seed=10)
    K, n = 4, 3
    kw = dict(attention_mask=mask, decoder_start_token_id=1)
    eos = int(generate(model, src, 3, **kw)[1, -1])  # a token the model likes to emit
    out, scores = generate(model, src, 8, **kw, num_beams=K, num_return_sequences=n, eos_token_id=eos,
                           pad_token_id=0, length_penalty=length_penalty, return_scores=True)
    assert out.shape[0] == 2 * n
    saw_eos = False
    for r in range(out.shape[0]):
        b = r // n
        length = _new_tokens(out[r], 1, eos, 0)
        saw_eos |= eos in out[r, 1:].tolist()
        logp = sequence_log_probs(model, out[r:r + 1, :1 + length], 1, src=src[b:b + 1], src_mask=mask[b:b + 1])
        torch.testing.assert_close(scores[r], logp.sum() / length ** length_penalty, atol=1e-4, rtol=1e-4)
    assert saw_eos  # the check covered hypotheses that ended early
    for b in range(2):
        assert (scores[b * n:(b + 1) * n].diff() <= 0).all()  # best first
