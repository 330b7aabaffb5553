"""attnlab.generate against Hugging Face `generate` on converted random-initialised models:
identical token ids for greedy and 4-beam search, GPT-2 (left-padded prompts), BART and
Marian (right-padded sources), 20 prompts each, with an EOS the models actually emit."""

import pytest
import torch
import transformers

from attnlab.decoding import generate
from attnlab.interop import from_hf

V, N_PROMPTS, MAX_NEW = 96, 20, 12


pytestmark = pytest.mark.usefixtures("one_thread")


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _seq2seq_kwargs():
    return dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                init_std=0.3, forced_eos_token_id=None)


def _bart():
    cfg = transformers.BartConfig(**_seq2seq_kwargs(), pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2)
    return transformers.BartForConditionalGeneration(cfg)


def _marian():
    cfg = transformers.MarianConfig(**_seq2seq_kwargs(), pad_token_id=V - 1, eos_token_id=0,
                                    decoder_start_token_id=V - 1)
    return transformers.MarianMTModel(cfg)


def _prompts(left: bool, pad: int):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (N_PROMPTS,), generator=g)
    T = int(lengths.max())
    ids = torch.randint(3, V - 1, (N_PROMPTS, T), generator=g)
    pos = torch.arange(T)[None]
    mask = (pos >= T - lengths[:, None]) if left else (pos < lengths[:, None])
    return ids.masked_fill(~mask, pad), mask.long()


@pytest.mark.parametrize("family", ["gpt2", "bart", "marian"])
def test_greedy_and_beam_search_match_transformers(family):
    torch.manual_seed(0)
    hf = {"gpt2": _gpt2, "bart": _bart, "marian": _marian}[family]().eval()
    ours = from_hf(hf)
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 1  # (HF fills 0 with EOS)
    ids, mask = _prompts(left=family == "gpt2", pad=pad)
    start = {} if family == "gpt2" else {"decoder_start_token_id": hf.config.decoder_start_token_id}
    with torch.no_grad():
        free = hf.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=pad)
    new = free[:, -MAX_NEW:]
    eos = int(new[:, 2:].flatten().mode().values)  # a token the model emits mid-sequence: rows end early
    for num_beams in (1, 4):
        kw = dict(max_new_tokens=MAX_NEW, num_beams=num_beams, eos_token_id=eos, pad_token_id=pad,
                  length_penalty=1.0, early_stopping=False)
        with torch.no_grad():
            expected = hf.generate(ids, attention_mask=mask, do_sample=False, **kw)
        got = generate(ours, ids, attention_mask=mask, **kw, **start)
        assert got.shape == expected.shape, (num_beams, got.shape, expected.shape)
        assert torch.equal(got, expected), num_beams
        ended = (got[:, -MAX_NEW:] == eos).any(1)
        assert ended.any() and not ended.all()  # EOS handling was exercised, per row
