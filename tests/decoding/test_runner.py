"""The cached runner (the stack's `step`: the same modules, the decoding fast path) against the
reference: at every step its logits equal a full forward pass on the prefix (fp32, atol 1e-5),
for every position scheme, decoder-only (left-padded prompts) and encoder-decoder (padded
sources), through beam reorders, for the configurations that once took a separate generic path
(eager kernel, additive scores, Shaw relative positions, hooks, training mode); the inference
weight layouts follow in-place parameter changes and the thread count."""

import pytest
import torch

from attnlab import build_model
from attnlab.decoding import generate
from attnlab.decoding.runner import CachedRunner, FullRunner, make_runner
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.linear import layout
from tests.models.helpers import SCHEMES

from .helpers import V, left_padded, tiny

ATOL = 1e-5


def _full_logits(model, ids, mask, src=None, src_mask=None):
    """Next-token logits (N, V) after ids, from one full forward pass."""
    if src is not None:
        return model(src, ids, src_mask)[:, -1]
    return model(ids, mask)[:, -1]


def _check_steps(model, runner, ids, valid, steps, src=None, src_mask=None, reorder=None):
    """Greedy-extend ids (N, P) by `steps` tokens through the runner, comparing its logits with
    the full forward at every step; `reorder(t)` may return a row permutation applied first."""
    P = ids.shape[1]
    mask = valid if not bool(valid.all()) else None
    logits = runner.start(ids, mask)
    for t in range(steps):
        L = P + t
        expected = _full_logits(model, ids, valid if src is None else None, src, src_mask)
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
        if reorder is not None and (index := reorder(t)) is not None:
            runner.reorder(index)
            ids, valid, logits = ids[index], valid[index], logits[index]
            if src is not None:
                src = src[index]
                src_mask = src_mask[index] if src_mask is not None else None
        token = logits.argmax(-1)
        ids = torch.cat([ids, token[:, None]], 1)
        valid = torch.cat([valid, torch.ones_like(valid[:, :1])], 1)
        logits = runner.step(ids, valid if mask is not None else None)
        assert ids.shape[1] == L + 1


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decoder_step_logits_equal_the_full_forward(scheme):
    model = tiny("decoder", scheme)
    x, mask = left_padded([6, 3, 1, 5])
    runner = make_runner(model, use_cache=True, max_len=x.shape[1] + 8)
    assert isinstance(runner, CachedRunner)
    with torch.no_grad():
        _check_steps(model, runner, x, mask.bool(), 8)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_encoder_decoder_step_logits_equal_the_full_forward(scheme):
    model = tiny("encoder_decoder", scheme)
    src, src_mask = left_padded([7, 4, 2])
    src, src_mask = src.flip(1), src_mask.flip(1)  # right-padded sources
    runner = make_runner(model, use_cache=True, max_len=9, src=src, src_mask=src_mask)
    assert isinstance(runner, CachedRunner)
    start = torch.full((3, 1), 1)
    with torch.no_grad():
        _check_steps(model, runner, start, torch.ones_like(start, dtype=torch.bool), 8, src=src, src_mask=src_mask)


@pytest.mark.parametrize("rows", [1, 3, 12])  # the LM head takes a different product for 1, <= 8, > 8 rows
@pytest.mark.parametrize("kw", [
    {},
    {"norm_placement": "post", "activation": "swiglu", "norm": "rmsnorm"},
    {"norm_placement": "both", "attention": {"num_kv_heads": 2}, "lm_head_bias": True, "lm_head_scale": 0.5},
    {"embedding_scale": True, "embedding_norm": True, "attention": {"score": "cosine"}, "tie_embeddings": False},
])
def test_variants_and_row_counts_equal_the_full_forward(kw, rows):
    scheme = "rotary" if "num_kv_heads" in str(kw) else "learned"
    kw = dict(kw)
    placement = kw.pop("norm_placement", "pre")
    model = build_model(tiny("decoder", scheme, **kw).config.replace(norm_placement=placement)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # biases and norm gains start at 0 and 1: make them count
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    x, mask = left_padded([5, 2, 4, 3][:rows] if rows <= 4 else [2 + r % 5 for r in range(rows)], seed=rows)
    runner = make_runner(model, use_cache=True, max_len=x.shape[1] + 5)
    assert isinstance(runner, CachedRunner)
    with torch.no_grad():
        _check_steps(model, runner, x, mask.bool(), 5)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_beam_reorders_keep_the_cache_consistent(arch):
    """Rows permuted within items (as beam search does) between steps: still the full forward."""
    model = tiny(arch, "alibi")  # a key-position scheme: the positions must follow the rows too
    g = torch.Generator().manual_seed(0)

    def reorder(t):
        return torch.cat([torch.randint(0, 2, (2,), generator=g), 2 + torch.randint(0, 2, (2,), generator=g)])

    with torch.no_grad():
        if arch == "decoder":
            x, mask = left_padded([5, 5, 3, 3])  # items of 2 beams: rows 0-1, 2-3
            runner = make_runner(model, use_cache=True, max_len=x.shape[1] + 6)
            _check_steps(model, runner, x, mask.bool(), 6, reorder=reorder)
        else:
            src, src_mask = left_padded([6, 3])
            src, src_mask = src[[0, 0, 1, 1]], src_mask[[0, 0, 1, 1]]  # the beams of an item share a source
            runner = make_runner(model, use_cache=True, max_len=7, src=src, src_mask=src_mask)
            start = torch.full((4, 1), 1)
            _check_steps(model, runner, start, torch.ones_like(start, dtype=torch.bool), 6, src=src,
                         src_mask=src_mask, reorder=reorder)


def test_inference_layouts_follow_in_place_parameter_changes():
    model = tiny("decoder", "rotary")
    x = torch.randint(3, V, (1, 5), generator=torch.Generator().manual_seed(1))
    generate(model, x, 2)
    ffn_in, head = model.layers[0].ffn.w1, model.head.proj
    first, first_head = layout(ffn_in), layout(head)
    assert layout(ffn_in) is first and layout(head) is first_head  # reused while nothing changes
    with torch.no_grad():
        ffn_in.weight.mul_(-1.5)
        model.embed.token.weight[:, 0] += 1.0  # the tied LM head too
    assert layout(ffn_in) is not first and layout(head) is not first_head
    cached = generate(model, x, 6)
    reference = generate(model, x, 6, use_cache=False)
    assert torch.equal(cached, reference)


def test_inference_layouts_are_rebuilt_when_the_thread_count_changes():
    model = tiny("decoder", "learned")
    qkv = model.layers[0].self_attn.qkv_proj
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layout(qkv)
        torch.set_num_threads(2)
        two = layout(qkv)
        assert two is not one and two.blocks == 2 and one.blocks == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("scheme, kw", [
    ("learned", {"attention": {"kernel": "eager"}}),
    ("learned", {"attention": {"score": "additive"}}),
    ("relative", {"attention": {"kernel": "eager"}}),
    ("learned", {"attention": {"kernel": "sliding_window", "window": 3}}),
])
def test_every_configuration_takes_the_step_and_equals_the_full_forward(scheme, kw):
    """Configurations the former lean step left to a separate generic path run the same step."""
    model = tiny("decoder", scheme, **kw)
    x, mask = left_padded([6, 3, 1, 5])
    runner = make_runner(model, use_cache=True, max_len=x.shape[1] + 6)
    assert isinstance(runner, CachedRunner)
    with torch.no_grad():
        _check_steps(model, runner, x, mask.bool(), 6)


def test_hooks_and_training_mode_are_honoured_by_the_step():
    model = tiny("decoder")
    model.layers[1].ffn.register_forward_hook(lambda module, args, out: out * 2)
    model.layers[0].self_attn.register_forward_hook(lambda module, args, out: (out[0] * 0.5, out[1]))
    x, mask = left_padded([6, 3, 1, 5])
    with torch.no_grad():
        _check_steps(model, make_runner(model, use_cache=True, max_len=x.shape[1] + 5), x, mask.bool(), 5)
    model = tiny("encoder_decoder").train()  # dropout is 0: training mode changes nothing else
    src, src_mask = left_padded([5, 3])
    start = torch.full((2, 1), 1)
    with torch.no_grad():
        runner = make_runner(model, use_cache=True, max_len=6, src=src, src_mask=src_mask)
        _check_steps(model, runner, start, torch.ones_like(start, dtype=torch.bool), 5, src=src, src_mask=src_mask)


@pytest.mark.parametrize("mode", [{}, {"num_beams": 3, "num_return_sequences": 2}])
def test_cached_and_full_forward_runners_give_the_same_ids(mode):
    model = tiny("decoder", "t5_bias")
    x, mask = left_padded([6, 3, 1, 5])
    assert isinstance(make_runner(model, use_cache=False, max_len=8), FullRunner)
    cached = generate(model, x, 10, attention_mask=mask, eos_token_id=2, **mode)
    full = generate(model, x, 10, attention_mask=mask, eos_token_id=2, use_cache=False, **mode)
    assert cached.shape[1] > x.shape[1] and torch.equal(cached, full)


def test_kv_cache_positions_are_preallocated_and_reorder_self_gathers_rows():
    cache = KVCache(max_len=5)
    p1 = cache.track_positions(torch.tensor([[0, 1], [0, 0]]))
    p2 = cache.track_positions(torch.tensor([[2], [1]]))
    assert p2.tolist() == [[0, 1, 2], [0, 0, 1]] and p1.data_ptr() == p2.data_ptr()
    with pytest.raises(ValueError, match="holds 5 positions"):
        cache.track_positions(torch.zeros(2, 3, dtype=torch.long))
    layer = cache.layer(0)
    k = torch.arange(2 * 3 * 4, dtype=torch.float).view(2, 1, 3, 4)
    layer.append(k, -k)
    cache.reorder_self(torch.tensor([1, 1]))
    assert torch.equal(layer.k[:, :, :3], k[[1, 1]]) and torch.equal(layer.v[:, :, :3], -k[[1, 1]])
    assert cache.positions.tolist() == [[0, 0, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="keeps the number of rows"):
        layer.reorder_self(torch.tensor([0]))


def test_kv_cache_advance_continues_each_rows_positions_until_full():
    cache = KVCache(max_len=4)
    with pytest.raises(ValueError, match="filled by the prompt"):
        cache.advance()
    cache.track_positions(torch.tensor([[0, 1], [0, 0]]))  # row 1: one real token after a pad
    new, keys = cache.advance()
    assert new.tolist() == [[2], [1]] and keys.tolist() == [[0, 1, 2], [0, 0, 1]]
    cache.advance()
    with pytest.raises(ValueError, match="holds 4 positions; 5 requested"):
        cache.advance()
