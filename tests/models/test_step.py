"""The decoding fast path, `TransformerStack.step` (one token per row, the positions advanced by
the cache, the mask and bias built once for all layers), equals the full forward pass for every
position scheme, with left padding, grouped key/value heads, and inside an encoder-decoder.

`generate` runs this path; tests/models/test_cache.py checks the cached `forward` path."""

import pytest
import torch

from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import padding_mask

from .helpers import SCHEMES, ids, left_padded, tiny


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("variant", [{}, {"attention": {"num_kv_heads": 2}, "norm": "rmsnorm",
                                          "activation": "swiglu"}])
def test_decoder_step_equals_full_forward(scheme, variant):
    torch.manual_seed(0)
    model = tiny("decoder", scheme, **variant)
    x, mask = left_padded([5, 3, 1])  # rows whose positions differ from their column
    steps = 6
    cache = KVCache(max_len=x.shape[1] + steps)
    with torch.no_grad():
        logits = model(x, mask, cache=cache)[:, -1]
        for _ in range(steps):
            nxt = logits.argmax(-1)  # (B,)
            x, mask = torch.cat([x, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            logits = model.head.step(model.step(nxt, cache, attention_mask=mask))
            torch.testing.assert_close(logits, model(x, mask)[:, -1], atol=1e-5, rtol=1e-5)
    assert cache.length == x.shape[1]


@pytest.mark.parametrize("scheme", ["learned", "rotary", "alibi", "t5_bias"])
def test_decoder_step_without_padding_equals_full_forward(scheme):
    # attention_mask=None: the step builds no mask, positions continue from the prompt's length
    torch.manual_seed(1)
    model = tiny("decoder", scheme)
    x = ids(2, 4)
    cache = KVCache(max_len=9)
    with torch.no_grad():
        logits = model(x, cache=cache)[:, -1]
        for _ in range(5):
            nxt = logits.argmax(-1)
            x = torch.cat([x, nxt[:, None]], 1)
            logits = model.head.step(model.step(nxt, cache))
            torch.testing.assert_close(logits, model(x)[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_encoder_decoder_step_equals_full_forward(scheme):
    torch.manual_seed(2)
    model = tiny("encoder_decoder", scheme)
    src = ids(2, 7)
    src_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    tgt = ids(2, 2)
    cache = KVCache(max_len=8)
    decoder = model.decoder
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        logits = model.decode(tgt, memory, src_mask, cache=cache)[:, -1]
        for _ in range(5):
            nxt = logits.argmax(-1)
            tgt = torch.cat([tgt, nxt[:, None]], 1)
            hidden = decoder.step(nxt, cache, memory=memory, memory_mask=padding_mask(src_mask))
            logits = decoder.head.step(hidden)
            torch.testing.assert_close(logits, model(src, tgt, src_mask)[:, -1], atol=1e-5, rtol=1e-5)
