"""generate(): the cached path equals the full-forward path, batches equal single prompts,
per-row EOS and lengths, stop strings, and clear errors for bad input."""

import pytest
import torch

from attnlab import build_model, presets
from attnlab.decoding import generate
from tests.models.helpers import SCHEMES

from .helpers import V, left_padded, tiny



def _modes():
    return {
        "greedy": {},
        "sample": {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3},
        "beam": {"num_beams": 3, "num_return_sequences": 2, "eos_token_id": 2, "no_repeat_ngram_size": 2},
    }


def _run(model, x, mask, mode, use_cache, **kw):
    opts = dict(_modes()[mode], **kw)
    if mode == "sample":
        opts["generator"] = torch.Generator().manual_seed(7)
    return generate(model, x, 10, attention_mask=mask, use_cache=use_cache, **opts)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mode", ["greedy", "sample", "beam"])
def test_decoder_cached_equals_uncached_with_left_padding(scheme, mode, device):
    model = tiny("decoder", scheme).to(device)
    x, mask = left_padded([6, 3, 1, 5])
    x, mask = x.to(device), mask.to(device)
    cached = _run(model, x, mask, mode, True)
    full = _run(model, x, mask, mode, False)
    assert cached.shape[1] > x.shape[1]
    assert torch.equal(cached, full)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mode", ["greedy", "sample", "beam"])
def test_encoder_decoder_cached_equals_uncached(scheme, mode):
    model = tiny("encoder_decoder", scheme)
    src, src_mask = left_padded([7, 4, 2])
    src_mask = src_mask.flip(1)  # sources are right-padded here: either side works
    src = src.flip(1)
    cached = _run(model, src, src_mask, mode, True, decoder_start_token_id=1)
    full = _run(model, src, src_mask, mode, False, decoder_start_token_id=1)
    assert (cached[:, 0] == 1).all()
    assert torch.equal(cached, full)


@pytest.mark.parametrize("scheme, processors", [
    ("learned", {}), ("rotary", {}), ("alibi", {}),
    ("rotary", {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}),  # padding is not "seen"
])
def test_batched_left_padded_equals_one_prompt_at_a_time(scheme, processors):
    model = tiny("decoder", scheme)
    x, mask = left_padded([6, 2, 4])
    eos = int(generate(model, x[1:2, -2:], 1, **processors)[0, -1])  # ends the second prompt at once
    batch = generate(model, x, 8, attention_mask=mask, eos_token_id=eos, pad_token_id=0, **processors)
    for b in range(3):
        alone = generate(model, x[b:b + 1, mask[b].bool()], 8, eos_token_id=eos, pad_token_id=0, **processors)
        n = alone.shape[1] - int(mask[b].sum())
        assert torch.equal(batch[b, x.shape[1]:x.shape[1] + n], alone[0, -n:])
        assert (batch[b, x.shape[1] + n:] == 0).all()  # padded after its EOS
    assert batch[1, x.shape[1]] == eos and (batch[1, x.shape[1] + 1:] == 0).all()
    assert batch.shape[1] > x.shape[1] + 1  # the other rows went on after row 1 stopped


def test_stops_early_when_every_row_is_done_and_min_new_tokens_holds_eos_back():
    model = tiny("decoder", "rotary")
    x, _ = left_padded([4, 4])
    free = generate(model, x, 12)
    eos = int(free[0, 4])
    stopped = generate(model, x, 12, eos_token_id=eos, pad_token_id=0)
    ends = [int((row[4:] == eos).nonzero()[0]) + 1 if (row[4:] == eos).any() else 12 for row in free]
    assert ends[0] == 1 and stopped.shape[1] == 4 + max(ends)
    for b, n in enumerate(ends):
        assert torch.equal(stopped[b, :4 + n], free[b, :4 + n]) and (stopped[b, 4 + n:] == 0).all()
    held = generate(model, x, 12, eos_token_id=eos, min_new_tokens=5)
    assert not (held[:, 4:9] == eos).any()


def test_max_new_tokens_zero_returns_the_prompt():
    model = tiny("decoder")
    x, mask = left_padded([3, 2])
    assert torch.equal(generate(model, x, 0, attention_mask=mask), x)


def test_stop_strings_end_a_row_right_after_the_string():
    from attnlab.tokenizers import Tokenizer

    text = "abcdefgh ijklmnop qrstuvwxyz"
    tok = Tokenizer.train([text], kind="char")
    model = tiny("decoder", "rotary", vocab_size=tok.vocab_size)
    prompt = torch.tensor([tok.encode("abc")])
    free = tok.decode(generate(model, prompt, 30)[0, 3:].tolist())
    stop = free[5:7]  # two characters the free run produces
    out = generate(model, prompt, 30, stop_strings=[stop], tokenizer=tok)
    new = tok.decode(out[0, 3:].tolist())
    end = free.index(stop) + len(stop)
    assert new == free[:end]


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = tiny("decoder", "alibi")
    x, mask = left_padded([5, 2])
    a = generate(model, x, 12, attention_mask=mask, do_sample=True, generator=torch.Generator().manual_seed(3))
    b = generate(model, x, 12, attention_mask=mask, do_sample=True, generator=torch.Generator().manual_seed(3))
    c = generate(model, x, 12, attention_mask=mask, do_sample=True, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    k1 = generate(model, x, 12, attention_mask=mask, do_sample=True, top_k=1, temperature=0.7,
                  generator=torch.Generator().manual_seed(5))
    assert torch.equal(k1, generate(model, x, 12, attention_mask=mask))


def test_num_return_sequences_samples_each_prompt_n_times():
    model = tiny("encoder_decoder", "sinusoidal")
    src, mask = left_padded([5, 3])
    out = generate(model, src, 6, attention_mask=mask, do_sample=True, num_return_sequences=3,
                   decoder_start_token_id=1, generator=torch.Generator().manual_seed(0))
    assert out.shape == (6, 7)
    assert len({tuple(r) for r in out[:3].tolist()}) > 1  # three different samples of the first source


def test_no_repeat_ngram_size_forbids_repeated_bigrams():
    model = tiny("decoder", "learned")
    x, _ = left_padded([3])

    def bigrams(row):
        return [tuple(row[i:i + 2]) for i in range(len(row) - 1)]

    free = generate(model, x, 40)[0].tolist()
    assert len(set(bigrams(free))) < len(bigrams(free))  # the plain model repeats itself
    banned = generate(model, x, 40, no_repeat_ngram_size=2)[0].tolist()
    assert len(set(bigrams(banned))) == len(bigrams(banned))


def test_return_scores_of_greedy_are_the_summed_log_probs():
    from attnlab.decoding import sequence_log_probs

    model = tiny("decoder", "rotary")
    x, mask = left_padded([4, 2])
    out, scores = generate(model, x, 6, attention_mask=mask, return_scores=True)
    full_mask = torch.cat([mask, torch.ones(2, 6, dtype=torch.long)], 1)
    ref = sequence_log_probs(model, out, x.shape[1], mask=full_mask).sum(1)
    torch.testing.assert_close(scores, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "empty"),
    ({"input_ids": torch.zeros(0, 3, dtype=torch.long)}, "empty"),
    ({"attention_mask": torch.tensor([[0, 0, 0]])}, "no real token"),
    ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 0"),
    ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
    ({"do_sample": True, "top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
    ({"do_sample": True, "top_p": 1.5}, "top_p must be in \\(0, 1\\]"),
    ({"do_sample": True, "top_k": 0}, "top_k"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"do_sample": True, "temperature": float("inf")}, "temperature must be a finite number > 0 .*, got inf"),
    ({"do_sample": True, "temperature": float("nan")}, "temperature must be a finite number > 0 .*, got nan"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number > 0, got inf"),
    ({"num_beams": 2, "length_penalty": float("nan")}, "length_penalty must be a finite number, got nan"),
    ({"length_penalty": float("-inf")}, "length_penalty must be a finite number, got -inf"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences=3 must be <= num_beams=2"),
    ({"stop_strings": ["x"]}, "tokenizer"),
    ({"eos_token_id": V}, "eos_token_id"),
    ({"pad_token_id": -1}, "pad_token_id"),
    ({"input_ids": torch.randint(1, V, (1, 65))}, "longer than the model's context \\(position.max_len=64"),
    ({"max_new_tokens": 62}, "lower max_new_tokens to at most 61"),
])
def test_bad_input_is_a_clear_error(kwargs, match):
    model = tiny("decoder", "learned")
    args = {"input_ids": torch.tensor([[5, 6, 7]]), "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(model, **args)


def test_encoder_decoder_source_longer_than_the_context_is_a_clear_error():
    model = tiny("encoder_decoder", "learned")
    with pytest.raises(ValueError, match="the source \\(input_ids\\) has 65 tokens"):
        generate(model, torch.randint(1, V, (1, 65)), 3, decoder_start_token_id=1)
    with pytest.raises(ValueError, match="lower max_new_tokens to at most 63"):
        generate(model, torch.randint(1, V, (1, 5)), 64, decoder_start_token_id=1)


def test_models_without_an_lm_head_and_non_tensors_are_type_errors():
    with pytest.raises(TypeError, match="LM head"):
        generate(tiny("encoder"), torch.tensor([[1, 2]]), 3)
    with pytest.raises(TypeError, match="input_ids"):
        generate(tiny("decoder"), [[1, 2]], 3)


def test_greedy_translation_equals_the_argmax_chain_of_full_decodes():
    """What evaluation's former greedy loops computed: generate with the decoder start and EOS
    ids gives each row's argmax chain under full `decode` passes, EOS-padded once finished."""
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-encoder-decoder")).eval()
    src = torch.randint(3, 97, (3, 7))
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    out = generate(model, src, 10, attention_mask=mask, eos_token_id=2, pad_token_id=2, decoder_start_token_id=1)
    with torch.no_grad():
        memory = model.encode(src, mask)
        ref = torch.full((3, 1), 1)
        done = torch.zeros(3, dtype=torch.bool)
        for _ in range(10):
            nxt = model.decode(ref, memory, mask)[:, -1].argmax(-1).masked_fill(done, 2)
            ref = torch.cat([ref, nxt[:, None]], 1)
            done |= nxt == 2
            if bool(done.all()):
                break
    assert torch.equal(out, ref)


def test_greedy_continuation_is_the_argmax_chain():
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-decoder")).eval()
    out = generate(model, torch.tensor([[5, 6]]), 4)[0].tolist()
    ids = [5, 6]
    with torch.no_grad():
        for _ in range(4):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == ids
