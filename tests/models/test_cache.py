"""Cached decoding equals the full forward pass, step by step, for every position scheme."""

import pytest
import torch

from attnlab.nn.kv_cache import KVCache

from .helpers import SCHEMES, assert_cached_steps_equal_full, ids, left_padded, tiny


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("variant", [{}, {"attention": {"num_kv_heads": 2}}])
def test_decoder_cached_steps_equal_full_forward(scheme, variant, device):
    model = tiny("decoder", scheme, **variant).to(device)
    x, mask = left_padded([5, 3, 1])
    cache, x = assert_cached_steps_equal_full(model, x.to(device), mask.to(device), steps=6)
    assert cache.length == x.shape[1]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_encoder_decoder_cached_steps_equal_full_forward(scheme, device):
    model = tiny("encoder_decoder", scheme).to(device)
    src = ids(2, 7).to(device)
    src_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3], device=device)
    tgt = ids(2, 1).to(device)
    cache = KVCache(max_len=8)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        for _ in range(6):
            step = model.decode(tgt[:, -1:], memory, src_mask, cache=cache)
            full = model(src, tgt, src_mask)
            torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
            tgt = torch.cat([tgt, step[:, -1].argmax(-1, keepdim=True)], 1)
    assert cache.layers[0].cross_k.shape[2] == 7  # the source was projected once and kept


def test_reorder_follows_the_chosen_rows():
    model = tiny("decoder", "rotary")
    x = ids(3, 4)
    cache = KVCache(max_len=6)
    with torch.no_grad():
        model(x, cache=cache)
        order = torch.tensor([2, 2, 0])
        cache.reorder(order)
        nxt = ids(3, 1)
        step = model(nxt, cache=cache)
        full = model(torch.cat([x[order], nxt], 1))
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)


def test_prefix_lm_with_cache():
    model = tiny("decoder", "alibi")
    x = ids(2, 5)
    prefix = torch.tensor([3, 2])
    cache = KVCache(max_len=7)
    with torch.no_grad():
        model(x, prefix_lengths=prefix, cache=cache)
        nxt = ids(2, 1)
        step = model(nxt, prefix_lengths=prefix, cache=cache)
        full = model(torch.cat([x, nxt], 1), prefix_lengths=prefix)
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)


def test_cache_overflow_and_bad_mask_are_clear_errors():
    model = tiny("decoder")
    cache = KVCache(max_len=4)
    with torch.no_grad():
        model(ids(1, 3), cache=cache)
        with pytest.raises(ValueError, match="past \\+ T"):
            model(ids(1, 1), torch.ones(1, 1), cache=cache)
        with pytest.raises(ValueError, match="holds 4 positions; 5 requested"):
            model(ids(1, 2), cache=cache)
        assert cache.length == 3 and cache.positions.shape == (1, 3)  # a refused call changes nothing
    with pytest.raises(ValueError, match="max_len"):
        KVCache(0)
