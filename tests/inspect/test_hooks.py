"""Hook points on every family and kernel: an identity hook changes nothing (bitwise), a hook that
returns an equal copy changes nothing beyond rounding (the edited path recomputes from the copy),
every point is recorded with its documented shape, and hooks always come off."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.hooks import hooks, run_with_cache
from attnlab.models.vision import VisionConfig, VisionEncoder
from attnlab.nn.hook_points import HookPoint, hook_points
from attnlab.nn.kv_cache import SegmentMemory
from tests.models.helpers import V, ids

D, H, L = 32, 4, 2


def _decoder(kernel="auto", options=None, **kw):
    cfg = ModelConfig(arch=kw.pop("arch", "decoder"), vocab_size=V, d_model=D, num_layers=L, num_heads=H, d_ff=64,
                      dropout=0.0, norm_placement=kw.pop("norm_placement", "pre"),
                      position=kw.pop("position", {"scheme": "rotary", "max_len": 64}),
                      attention={"kernel": kernel, "kernel_options": options or {}, **kw.pop("attention", {})}, **kw)
    return build_model(cfg).eval()


def _rnn(attention):
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16, dropout=0.0,
                      rnn={"attention": attention, "hidden_size": 16, "bidirectional": attention != "dot"})
    return build_model(cfg).eval()


def _vision():
    enc = ModelConfig(arch="encoder", vocab_size=2, d_model=D, num_layers=L, num_heads=H, d_ff=64, dropout=0.0,
                      num_labels=3, head="classification", position={"scheme": "learned", "max_len": 32})
    return VisionEncoder(VisionConfig(image_size=8, patch_size=4, channels=1, encoder=enc)).eval()


def _tokens(T=12):
    return (ids(2, T),)


# model, its inputs, extra call options
CASES = {
    "decoder-sdpa": lambda: (_decoder(), _tokens(), {}),
    "decoder-eager": lambda: (_decoder("eager"), _tokens(), {}),
    "decoder-gqa": lambda: (_decoder(attention={"num_kv_heads": 2}), _tokens(), {}),
    "decoder-mqa": lambda: (_decoder(attention={"num_kv_heads": 1}), _tokens(), {}),
    "decoder-sliding_window": lambda: (_decoder("sliding_window", {"window": 3}), _tokens(), {}),
    "decoder-bigbird": lambda: (_decoder("bigbird", {"block_size": 2, "random_blocks": 1}), _tokens(), {}),
    "decoder-longformer": lambda: (_decoder("longformer", {"window": 2, "global_positions": [0]}), _tokens(), {}),
    "decoder-local_block": lambda: (_decoder("local_block", {"block_size": 4}), _tokens(), {}),
    "decoder-memory_compressed": lambda: (_decoder("memory_compressed", {"block_size": 4}), _tokens(), {}),
    "decoder-relative": lambda: (_decoder(position={"scheme": "relative", "max_len": 64,
                                                    "relative_max_distance": 4}), _tokens(), {}),
    "decoder-alibi-post": lambda: (_decoder(position={"scheme": "alibi"}, norm_placement="post"), _tokens(), {}),
    "decoder-moe": lambda: (_decoder(moe={"num_experts": 4, "top_k": 2}), _tokens(), {}),
    "decoder-segment-memory": lambda: (_decoder(memory_len=4), _tokens(), {"mems": "segment"}),
    "encoder-sdpa": lambda: (_decoder(arch="encoder", position={"scheme": "learned", "max_len": 64}), _tokens(), {}),
    "encoder-linformer": lambda: (_decoder("linformer", {"k": 4, "max_len": 16}, arch="encoder",
                                           position={"scheme": "learned", "max_len": 64}), _tokens(), {}),
    "encoder_decoder": lambda: (_decoder(arch="encoder_decoder", position={"scheme": "sinusoidal", "max_len": 64}),
                                (ids(2, 9), ids(2, 6)), {}),
    "rnn-bahdanau": lambda: (_rnn("additive"), (ids(2, 7), ids(2, 5)), {}),
    "rnn-luong": lambda: (_rnn("general"), (ids(2, 7), ids(2, 5)), {}),
    "vision": lambda: (_vision(), (torch.randn(2, 1, 8, 8),), {}),
}
# kernels whose pattern is over keys they compute themselves: it can be read, not replaced
READ_ONLY_PATTERN = {"encoder-linformer", "decoder-memory_compressed"}


def _run(model, inputs, options):
    options = dict(options)
    if options.pop("mems", None):  # two segments of Transformer-XL's recurrence, the second over the first's memory
        memory = SegmentMemory(4)
        model(inputs[0], mems=memory)
        return model(inputs[0].flip(1), mems=memory)
    return model(*inputs, **options)


@pytest.mark.parametrize("case", sorted(CASES))
def test_identity_hooks_leave_outputs_bitwise_equal(case):
    torch.manual_seed(0)
    model, inputs, options = CASES[case]()
    with torch.no_grad():
        ref = _run(model, inputs, options)
        seen = []
        with hooks(model, {"*": lambda a, name: seen.append(name)}):  # None: keep the activation
            same = _run(model, inputs, options)
        with hooks(model, {"*": lambda a, name: a}):  # the activation itself
            also = _run(model, inputs, options)
    assert torch.equal(same, ref) and torch.equal(also, ref)
    assert set(seen) == set(model.hook_points())  # every point was met
    assert not any(p.hooked for p in hook_points(model).values())  # and every hook came off


@pytest.mark.parametrize("case", sorted(CASES))
def test_equal_copies_through_every_point_give_the_same_outputs(case):
    """A hook that returns a copy takes the edited path (the pattern's output recomputed from it,
    the heads' results summed): the same function, so the same outputs up to rounding."""
    torch.manual_seed(0)
    model, inputs, options = CASES[case]()
    names = ["*"] if case not in READ_ONLY_PATTERN else [n for n in model.hook_points() if "hook_pattern" not in n]
    with torch.no_grad():
        ref = _run(model, inputs, options)
        with hooks(model, [(n, lambda a, name: a.clone()) for n in names]):
            out = _run(model, inputs, options)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("case", sorted(READ_ONLY_PATTERN))
def test_a_pattern_over_computed_keys_is_read_not_replaced(case):
    model, inputs, options = CASES[case]()
    name = next(n for n in model.hook_points() if n.endswith("hook_pattern"))
    with torch.no_grad(), hooks(model, {name: lambda a, n: a.clone()}):
        with pytest.raises(ValueError, match="can be read, not replaced"):
            _run(model, inputs, options)


@pytest.mark.parametrize("kernel,options", [("auto", {}), ("sliding_window", {"window": 3}),
                                            ("bigbird", {"block_size": 2, "random_blocks": 1}),
                                            ("local_block", {"block_size": 4})])
def test_patterns_under_fast_kernels_equal_the_eager_patterns_over_their_keys(kernel, options):
    """The pattern a fused or sparse kernel never materialises is computed exactly on request: the
    eager kernel's weights under the kernel's own sparsity (`dense_mask`), rows summing to 1."""
    torch.manual_seed(0)
    fast = _decoder(kernel, options)
    x = ids(2, 12)
    _, cache = run_with_cache(fast, x, names="*.hook_pattern")
    for i, layer in enumerate(fast.layers):
        pattern = cache[f"layers.{i}.self_attn.hook_pattern"]
        allowed = layer.self_attn.kernel.dense_mask(12, True, device=x.device, batch=2)
        allowed = torch.ones(12, 12, dtype=torch.bool).tril() if allowed is None else allowed
        assert pattern.shape == (2, H, 12, 12)
        assert pattern.masked_select(~allowed.expand_as(pattern)).abs().max() == 0
        torch.testing.assert_close(pattern.sum(-1), torch.ones(2, H, 12))
    with torch.no_grad():
        from attnlab.inspect.attention_maps import attention_maps
        eager = attention_maps(fast, x)  # need_weights=True: the dense reference, the existing way
    for i in range(L):
        torch.testing.assert_close(cache[f"layers.{i}.self_attn.hook_pattern"], eager[f"layers.{i}.self_attn"])


def test_shapes_of_the_documented_points():
    torch.manual_seed(0)
    model = _decoder(attention={"num_kv_heads": 2}, moe={"num_experts": 4, "top_k": 2})
    _, cache = run_with_cache(model, ids(3, 7), names=["*"])
    Dh = D // H
    expected = {"hook_embed": (3, 7, D), "layers.1.hook_resid_pre": (3, 7, D), "layers.1.self_attn.hook_q": (3, H, 7, Dh),
                "layers.1.self_attn.hook_k": (3, 2, 7, Dh), "layers.1.self_attn.hook_v": (3, 2, 7, Dh),
                "layers.1.self_attn.hook_pattern": (3, H, 7, 7), "layers.1.self_attn.hook_z": (3, H, 7, Dh),
                "layers.1.self_attn.hook_result": (3, H, 7, D), "layers.1.hook_attn_out": (3, 7, D),
                "layers.1.hook_resid_mid": (3, 7, D), "layers.1.ffn.hook_router_logits": (21, 4),
                "layers.1.ffn.hook_experts": (21, 2), "layers.1.hook_ffn_out": (3, 7, D),
                "layers.1.hook_resid_post": (3, 7, D), "hook_final": (3, 7, D)}
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    # the residual stream runs through: one layer's output is the next one's input
    assert torch.equal(cache["layers.0.hook_resid_post"], cache["layers.1.hook_resid_pre"])
    # each head's result, summed with out_proj's bias, is the attention's output
    bias = model.layers[1].self_attn.out_proj.bias
    torch.testing.assert_close(cache["layers.1.self_attn.hook_result"].sum(1) + bias, cache["layers.1.hook_attn_out"])


def test_default_cache_leaves_out_the_per_head_results_and_names_can_be_patterns():
    model = _decoder()
    _, cache = run_with_cache(model, ids(1, 5))
    assert not [n for n in cache if n.endswith("hook_result")] and "layers.0.hook_resid_mid" in cache
    _, cache = run_with_cache(model, ids(1, 5), names="layers.*.hook_resid_mid")
    assert list(cache) == ["layers.0.hook_resid_mid", "layers.1.hook_resid_mid"]
    assert cache.stack("hook_resid_mid").shape == (2, 1, 5, D)
    with pytest.raises(ValueError, match="names no hook point"):
        run_with_cache(model, ids(1, 5), names="layers.0.hook_nothing")


def test_hooks_come_off_after_an_error():
    model = _decoder()

    def fail(a, name):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), hooks(model, {"layers.1.hook_resid_mid": fail}):
        model(ids(1, 4))
    assert not any(p.hooked for p in hook_points(model).values())
    with pytest.raises(TypeError, match="fn"):
        with hooks(model, {"layers.0.hook_resid_mid": "not callable"}):
            pass


def test_zeroing_a_heads_z_is_zeroing_its_result():
    """Two routes to removing head 2 of layer 0: its output before out_proj, or its share after."""
    torch.manual_seed(0)
    model = _decoder()
    x = ids(2, 6)

    def drop_head_2(a, name):
        a = a.clone()
        a[:, 2] = 0
        return a

    with torch.no_grad():
        with hooks(model, {"layers.0.self_attn.hook_z": drop_head_2}):
            by_z = model(x)
        with hooks(model, {"layers.0.self_attn.hook_result": drop_head_2}):
            by_result = model(x)
        ref = model(x)
    torch.testing.assert_close(by_z, by_result, atol=1e-5, rtol=1e-5)
    assert (by_z - ref).abs().max() > 1e-3  # and it did change something


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_a_one_hot_pattern_copies_that_keys_value_to_its_query_heads(num_kv_heads):
    """Replace the pattern by attention to key 0 alone: every query head's z is then the value of
    key 0 in that head's key/value group (query head h reads key/value head h // (H / G))."""
    torch.manual_seed(0)
    model = _decoder(attention={"num_kv_heads": num_kv_heads})

    def onto_key_0(p, name):
        one_hot = torch.zeros_like(p)
        one_hot[..., 0] = 1
        return one_hot

    with torch.no_grad(), hooks(model, {"layers.0.self_attn.hook_pattern": onto_key_0}):
        _, edited = run_with_cache(model, ids(2, 6), names=["layers.0.self_attn.hook_z", "layers.0.self_attn.hook_v"])
    v, z = edited["layers.0.self_attn.hook_v"], edited["layers.0.self_attn.hook_z"]
    group = H // num_kv_heads
    for h in range(H):
        torch.testing.assert_close(z[:, h], v[:, h // group, :1].expand(-1, 6, -1))


def test_editing_keys_of_one_group_moves_only_that_groups_query_heads():
    """Grouped-query attention (H = 4 query heads over G = 2 key/value heads): a change to key/value
    head 1 reaches query heads 2 and 3 only."""
    torch.manual_seed(0)
    model = _decoder(attention={"num_kv_heads": 2})
    x = ids(2, 6)

    def shift_group_1(k, name):
        k = k.clone()
        k[:, 1] += 1.0
        return k

    with torch.no_grad():
        _, ref = run_with_cache(model, x, names="layers.0.self_attn.hook_z")
        with hooks(model, {"layers.0.self_attn.hook_k": shift_group_1}):
            _, moved = run_with_cache(model, x, names="layers.0.self_attn.hook_z")
    diff = (moved["layers.0.self_attn.hook_z"] - ref["layers.0.self_attn.hook_z"]).abs().amax((0, 2, 3))
    assert diff[:2].max() == 0 and diff[2:].min() > 1e-4


def test_hooks_reach_the_decoding_steps_with_one_position_per_row():
    from attnlab.decoding import generate

    torch.manual_seed(0)
    model = _decoder()
    prompt = ids(2, 4)
    ref = generate(model, prompt, max_new_tokens=5)
    shapes = []
    with hooks(model, {"layers.1.hook_resid_post": lambda a, n: shapes.append(tuple(a.shape)),
                       "layers.1.self_attn.hook_pattern": lambda a, n: shapes.append(tuple(a.shape))}):
        same = generate(model, prompt, max_new_tokens=5)
    assert torch.equal(same, ref)
    assert shapes[:2] == [(2, H, 4, 4), (2, 4, D)]  # the prompt's forward
    assert shapes[2:4] == [(2, H, 1, 5), (2, 1, D)]  # then one new position per row
    with hooks(model, {"layers.*.hook_resid_post": lambda a, n: a * 0}):
        other = generate(model, prompt, max_new_tokens=5)
    assert not torch.equal(other, ref)


def test_the_alignment_of_a_recurrent_model_is_a_hook_point_met_once_per_target_step():
    torch.manual_seed(0)
    model = _rnn("additive")
    src, tgt = ids(2, 7), ids(2, 5)
    _, cache = run_with_cache(model, src, tgt, names=["attention.hook_pattern", "hook_memory"])
    assert len(cache.calls("attention.hook_pattern")) == 5
    assert cache["attention.hook_pattern"].shape == (2, 1, 5, 7) and cache["hook_memory"].shape[:2] == (2, 7)

    def attend_to_first(p, name):
        one_hot = torch.zeros_like(p)
        one_hot[..., 0] = 1
        return one_hot

    with torch.no_grad(), hooks(model, {"attention.hook_pattern": attend_to_first}):
        edited = model(src, tgt)
    assert not torch.allclose(edited, model(src, tgt))


def test_every_model_lists_its_points_as_a_method():
    for make in (lambda: _decoder(), lambda: _rnn("general"), _vision,
                 lambda: _decoder(arch="encoder_decoder", position={"scheme": "sinusoidal", "max_len": 64})):
        model = make()
        points = model.hook_points()
        assert points and all(isinstance(p, HookPoint) for p in points.values())
        assert all(model.get_submodule(n) is p for n, p in points.items())
