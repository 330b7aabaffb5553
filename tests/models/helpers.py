"""Small configs shared by the model tests."""

import torch

from attnlab import ModelConfig, build_model

SCHEMES = ["none", "sinusoidal", "learned", "binary", "relative", "rotary", "alibi", "t5_bias"]
V = 50


def tiny(arch: str, scheme: str = "learned", **kw) -> torch.nn.Module:
    position = {"scheme": scheme, "max_len": 64, "relative_max_distance": 4}
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement=kw.pop("norm_placement", "pre"), position=position, **kw)
    return build_model(cfg).eval()


def ids(B: int, T: int, low: int = 1) -> torch.Tensor:
    return torch.randint(low, V, (B, T))


def left_padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the given lengths padded on the left with 0 (ids, mask with 1 = real token)."""
    T = max(lengths)
    x = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        x[b, T - n:] = ids(1, n)[0]
        mask[b, T - n:] = 1
    return x, mask


def assert_cached_steps_equal_full(model, x, mask, steps: int = 6, rtol: float = 1e-5):
    """Greedy-extend (x, mask) by `steps` tokens through a KV cache: the prompt's logits and
    each step's last-position logits equal a full forward pass (atol 1e-5). Returns the cache
    and the extended ids."""
    from attnlab.nn.kv_cache import KVCache

    cache = KVCache(max_len=x.shape[1] + steps)
    with torch.no_grad():
        step = model(x, mask, cache=cache)
        torch.testing.assert_close(step, model(x, mask), atol=1e-5, rtol=rtol)
        for _ in range(steps):
            nxt = step[:, -1].argmax(-1, keepdim=True)
            x, mask = torch.cat([x, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
            step = model(nxt, mask, cache=cache)
            torch.testing.assert_close(step[:, -1], model(x, mask)[:, -1], atol=1e-5, rtol=rtol)
    return cache, x


def assert_causal_and_cached(model, vocab: int, T: int = 8, keep: int = 5) -> None:
    """A decoder's logits at positions < keep do not change when later tokens do, and greedy
    cached decoding equals the full forward (`assert_cached_steps_equal_full`)."""
    ids = torch.randint(0, vocab, (2, T))
    changed = ids.clone()
    changed[:, keep:] = (changed[:, keep:] + 1) % vocab
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :keep], model(changed)[:, :keep])
    assert_cached_steps_equal_full(model, ids, torch.ones_like(ids, dtype=torch.bool))
