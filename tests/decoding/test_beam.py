"""Beam search: one beam is greedy, scores are the documented length-normalised sums of
log-probabilities (recomputed by a full forward), and with enough beams it finds the exact
best sequence of a tiny vocabulary (checked by brute force)."""

import itertools

import pytest
import torch

from attnlab.decoding import generate, sequence_log_probs

from .helpers import left_padded, tiny


@pytest.mark.parametrize("with_eos", [False, True])
def test_one_beam_through_the_beam_code_equals_greedy(with_eos):
    # generate(num_beams=1) takes the greedy loop; call the beam search itself with K = 1
    from attnlab.decoding.beam import beam_search
    from attnlab.decoding.runner import make_runner
    from attnlab.decoding.search import DecodeOptions

    model = tiny("decoder", "alibi")
    x, mask = left_padded([5, 2, 4])
    eos = int(generate(model, x, 4, attention_mask=mask)[0, -1]) if with_eos else None  # met at step 4
    greedy = generate(model, x, 10, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    ids = torch.zeros(3, 15, dtype=torch.long)
    ids[:, :5] = x
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, :5] = mask.bool()
    opt = DecodeOptions(eos=torch.tensor([eos]) if eos is not None else None, pad_token_id=0)
    with torch.no_grad():
        out, _ = beam_search(make_runner(model, use_cache=True, max_len=15), ids, valid, 5, 10, opt, num_beams=1,
                             length_penalty=1.0, early_stopping=True, num_return_sequences=1, padded=True)
    assert torch.equal(out, greedy)
    if eos is not None:
        assert out[0, 8] == eos and (out[0, 9:] == 0).all()  # the first row met EOS and was padded


def _new_tokens(row: torch.Tensor, start: int, eos: int, pad: int) -> int:
    """Number of new tokens in row[start:] up to and including the first EOS."""
    new = row[start:].tolist()
    return new.index(eos) + 1 if eos in new else len(new)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_nbest_scores_are_summed_log_probs_over_length_to_the_alpha(arch, length_penalty):
    model = tiny(arch, "learned")
    x, mask = left_padded([6, 3])
    K, n = 4, 3
    kw = {"decoder_start_token_id": 1} if arch == "encoder_decoder" else {}
    eos = int(generate(model, x, 3, attention_mask=mask, **kw)[1, -1])  # a token the model likes to emit
    out, scores = generate(model, x, 8, attention_mask=mask, num_beams=K, num_return_sequences=n,
                           eos_token_id=eos, pad_token_id=0, length_penalty=length_penalty, return_scores=True,
                           **kw)
    assert out.shape[0] == 2 * n
    start = 1 if arch == "encoder_decoder" else x.shape[1]
    saw_eos = False
    for r in range(out.shape[0]):
        b = r // n
        length = _new_tokens(out[r], start, eos, 0)
        saw_eos |= length < out.shape[1] - start or bool(out[r, -1] == eos)
        seq = out[r:r + 1, :start + length]
        if arch == "encoder_decoder":
            logp = sequence_log_probs(model, seq, 1, src=x[b:b + 1], src_mask=mask[b:b + 1])
        else:
            full_mask = torch.cat([mask[b:b + 1], torch.ones(1, length, dtype=torch.long)], 1)
            logp = sequence_log_probs(model, seq, start, mask=full_mask)
        expected = logp.sum() / length ** length_penalty
        torch.testing.assert_close(scores[r], expected, atol=1e-4, rtol=1e-4)
    assert saw_eos or length_penalty > 1  # the check covered hypotheses that ended early
    for b in range(2):
        assert (scores[b * n:(b + 1) * n].diff() <= 0).all()  # best first


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_enough_beams_find_the_brute_force_best(length_penalty, seed):
    torch.manual_seed(seed)
    V, steps, eos = 4, 3, 3
    model = tiny("decoder", "rotary", vocab_size=V, init_std=0.5)
    prompt = torch.tensor([[1, 2, 0]])
    # every hypothesis: sequences that stop at their first EOS, or run `steps` tokens without one
    hyps = []
    for length in range(1, steps + 1):
        for seq in itertools.product(range(V), repeat=length):
            if eos in seq[:-1] or (length < steps and seq[-1] != eos):
                continue
            ids = torch.cat([prompt, torch.tensor([seq])], 1)
            total = sequence_log_probs(model, ids, prompt.shape[1]).sum()
            hyps.append((float(total) / length ** length_penalty, seq))
    hyps.sort(key=lambda h: -h[0])
    K = V ** steps
    out, scores = generate(model, prompt, steps, num_beams=K, num_return_sequences=5, eos_token_id=eos,
                           pad_token_id=0, length_penalty=length_penalty, return_scores=True)
    for r, (score, seq) in enumerate(hyps[:5]):
        assert out[r, 3:3 + len(seq)].tolist() == list(seq)
        assert abs(float(scores[r]) - score) < 1e-4
