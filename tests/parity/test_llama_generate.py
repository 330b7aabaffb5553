"""attnlab.generate == transformers' `generate` on converted random Llama, Mistral (a sliding
window shorter than the prompts) and Qwen2 models: identical token ids for cached greedy and
4-beam search over left-padded prompts, with an EOS the models emit (rows end early)."""

import pytest
import torch

from attnlab.decoding import generate
from attnlab.interop import from_hf
from tests.parity.test_llama import V, hf_model

N_PROMPTS, MAX_NEW, PAD = 12, 10, 1  # (transformers fills finished beams with EOS when pad is 0)

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 8, (N_PROMPTS,), generator=g)
    T = int(lengths.max())
    ids = torch.randint(3, V, (N_PROMPTS, T), generator=g)
    mask = torch.arange(T)[None] >= T - lengths[:, None]  # left padding
    return ids.masked_fill(~mask, PAD), mask.long()


@pytest.mark.parametrize("name", ["llama-gqa-untied", "mistral-window-3", "qwen2-mqa-tied"])
def test_greedy_and_beam_search_match_transformers(name):
    hf = hf_model(name)
    ours = from_hf(hf)
    ids, mask = _prompts()
    with torch.no_grad():
        free = hf.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=PAD)
    eos = int(free[:, -MAX_NEW + 2:].flatten().mode().values)  # a token the model emits mid-sequence
    for num_beams in (1, 4):
        kw = dict(max_new_tokens=MAX_NEW, num_beams=num_beams, eos_token_id=eos, pad_token_id=PAD,
                  length_penalty=1.0, early_stopping=False)
        with torch.no_grad():
            expected = hf.generate(ids, attention_mask=mask, do_sample=False, **kw)
        got = generate(ours, ids, attention_mask=mask, use_cache=True, **kw)
        assert got.shape == expected.shape, (num_beams, got.shape, expected.shape)
        assert torch.equal(got, expected), num_beams
        ended = (got[:, -MAX_NEW:] == eos).any(1)
        assert ended.any() and not ended.all()  # EOS handling was exercised, per row
