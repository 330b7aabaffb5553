"""Long-input kernels inside every model family: equal to the dense kernel under the pattern's
mask (outputs and parameter gradients), with padding, position schemes and a KV cache."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from tests.models.helpers import assert_cached_steps_equal_full

V = 50
LONG = {
    "sliding_window": {"window": 3},
    "longformer": {"window": 2, "global_positions": [0, 9]},
    "bigbird": {"block_size": 4, "window_blocks": 1, "global_blocks": 1, "random_blocks": 1, "random_seed": 3},
}


def model_for(arch, kernel, scheme="rotary", options=None, **att):
    position = {"scheme": scheme, "max_len": 64, "relative_max_distance": 4, "relative_values": False}
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement="pre", position=position,
                      attention={"kernel": kernel, "kernel_options": {**LONG.get(kernel, {}), **(options or {})},
                                 **att})
    return build_model(cfg).eval()


def dense_reference(model):
    """Make every long-kernel layer take the dense path (need_weights=True: the eager kernel with
    the pattern's bool mask); returns the hook handles."""
    def force(module, args, kwargs):
        return args, {**kwargs, "need_weights": True}
    return [m.register_forward_pre_hook(force, with_kwargs=True) for m in model.modules()
            if isinstance(m, MultiHeadAttention) and m.kernel.supports.pattern]


def run(model, arch, x, mask):
    if arch == "encoder_decoder":
        return model(x, x[:, :7], mask, mask[:, :7])
    return model(x, mask)


def outputs_and_grads(model, arch, x, mask):
    model.zero_grad()
    out = run(model, arch, x, mask)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def batch(T=23):
    x = torch.randint(1, V, (2, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    return x, mask


CASES = [(arch, kernel, scheme) for arch, scheme in [("encoder", "rotary"), ("decoder", "alibi"),
                                                      ("encoder_decoder", "t5_bias")] for kernel in LONG]
CASES += [("decoder", "sliding_window", s) for s in ("learned", "relative", "none")]


CASES += [("decoder", "bigbird", "rotary", {"num_kv_heads": 2}), ("encoder", "longformer", "alibi", {"num_kv_heads": 1})]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:3])) + ("-gqa" if len(c) > 3 else ""))
def test_model_with_long_kernel_equals_dense_pattern(case):
    arch, kernel, scheme, *extra = case
    torch.manual_seed(0)
    model = model_for(arch, kernel, scheme, **(extra[0] if extra else {}))
    x, mask = batch()
    out, grads = outputs_and_grads(model, arch, x, mask)
    handles = dense_reference(model)
    ref, ref_grads = outputs_and_grads(model, arch, x, mask)
    for h in handles:
        h.remove()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    # and the pattern is sparse: the full model differs from dense attention
    full = model_for(arch, "auto", scheme, **(extra[0] if extra else {}))
    full.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert (run(full, arch, x, mask) - out).abs().max() > 1e-4


@pytest.mark.parametrize("kernel", list(LONG))
def test_cached_decoding_equals_full_forward(kernel):
    torch.manual_seed(0)
    model = model_for("decoder", kernel, "rotary")
    x, mask = batch(12)
    assert_cached_steps_equal_full(model, x, mask, steps=6, rtol=1e-4)


def test_longformer_global_token_id_equals_global_positions():
    torch.manual_seed(0)
    by_id = model_for("encoder", "longformer", options={"global_positions": [], "global_token_id": 7})
    by_pos = model_for("encoder", "longformer", options={"global_positions": [3, 15]})
    by_pos.load_state_dict(by_id.state_dict())
    x, mask = batch()
    x[x == 7] = 8
    x[:, [3, 15]] = 7
    with torch.no_grad():
        torch.testing.assert_close(by_id(x, mask), by_pos(x, mask), atol=1e-6, rtol=1e-5)
        decoder, cache = model_for("decoder", "longformer", options={"global_token_id": 7}), KVCache(8)
        decoder(x[:, :4], cache=cache)  # the prompt sees its own ids
        with pytest.raises(ValueError, match="global_token_id"):
            decoder(x[:, 4:5], cache=cache)  # a step cannot see the ids of the cached keys


def test_linformer_encoder_ignores_right_padding():
    torch.manual_seed(0)
    model = model_for("encoder", "linformer", "rotary", options={"k": 8, "max_len": 32})
    x, _ = batch(20)
    padded = torch.cat([x, torch.zeros(2, 6, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(2, 20, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, mask)[:, :20], model(x), atol=1e-5, rtol=1e-4)


def test_bigbird_layers_draw_different_random_blocks():
    model = model_for("encoder", "bigbird")
    masks = [layer.self_attn.kernel.dense_mask(64, False) for layer in model.layers]
    assert not torch.equal(masks[0], masks[1])
    again = model_for("encoder", "bigbird")
    assert torch.equal(again.layers[1].self_attn.kernel.dense_mask(64, False), masks[1])


@pytest.mark.parametrize("bad,match", [
    ({"kernel": "sliding_window", "kernel_options": {"window": -1}}, "attention.kernel_options.window"),
    ({"kernel": "bigbird", "kernel_options": {"block_size": 0}}, "attention.kernel_options.block_size"),
    ({"kernel": "longformer", "kernel_options": {"global_positions": [-1]}},
     "attention.kernel_options.global_positions"),
    ({"kernel": "longformer", "kernel_options": {"global_token_id": 999}}, "attention.kernel_options.global_token_id"),
    ({"kernel": "linformer", "kernel_options": {"sharing": "kv"}}, "attention.kernel_options.sharing"),
    ({"kernel": "linformer", "kernel_options": {"window": 4}}, "attention.kernel_options.window: unknown"),
    ({"kernel": "bigbird", "score": "additive"}, "attention.kernel: 'bigbird'"),
    # the flat fields of older configs name the grouped field they went to
    ({"kernel": "sliding_window", "window": -1}, "attention.kernel_options.window"),
    ({"kernel": "linformer", "linformer_sharing": "kv"}, "attention.kernel_options.sharing"),
])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(arch="encoder", vocab_size=V, attention=bad)


def test_configs_with_flat_kernel_fields_still_load():
    """Configs saved before the kernel options were grouped: the chosen kernel's flat fields move
    into kernel_options, the others' (every saved config held them all) are dropped."""
    old = {"kernel": "bigbird", "window": 256, "global_positions": [], "global_token_id": None, "block_size": 4,
           "window_blocks": 1, "global_blocks": 1, "random_blocks": 1, "random_seed": 3, "linformer_k": 256,
           "linformer_max_len": 4096, "linformer_sharing": "layer"}
    cfg = ModelConfig.from_dict({"arch": "encoder", "vocab_size": V, "attention": old})
    assert cfg.attention == ModelConfig(arch="encoder", vocab_size=V,
                                        attention={"kernel": "bigbird", "kernel_options": LONG["bigbird"]}).attention
    linformer = ModelConfig.from_dict({"arch": "encoder",
                                       "attention": {**old, "kernel": "linformer", "linformer_k": 8}})
    assert (linformer.attention.kernel_options.k, linformer.attention.kernel_options.max_len) == (8, 4096)
    assert ModelConfig.from_dict({"attention": {**old, "kernel": "auto"}}).attention == ModelConfig().attention


def test_config_refuses_linformer_where_it_cannot_work():
    with pytest.raises(ValueError, match="arch='encoder'"):
        ModelConfig(arch="decoder", attention={"kernel": "linformer"})
    with pytest.raises(ValueError, match="position.scheme='alibi'"):
        ModelConfig(arch="encoder", attention={"kernel": "linformer"}, position={"scheme": "alibi"})
    with pytest.raises(ValueError, match="relative_values"):
        ModelConfig(arch="encoder", attention={"kernel": "sliding_window"}, position={"scheme": "relative"})
    with pytest.raises(ValueError, match="relative_values"):
        ModelConfig(arch="encoder", attention={"kernel": "sdpa"}, position={"scheme": "relative"})


def test_weights_saved_when_the_kernel_was_long_kernel_still_load():
    from attnlab.io.weights import load_state

    model = model_for("encoder", "linformer", "rotary", options={"k": 8, "max_len": 32})
    old = {name.replace(".kernel.", ".long_kernel."): t.clone() for name, t in model.state_dict().items()}
    assert any(".long_kernel.e_proj" in name for name in old)
    for load in (lambda m: m.load_state_dict(old), lambda m: load_state(m, old)):
        again = model_for("encoder", "linformer", "rotary", options={"k": 8, "max_len": 32})
        load(again)
        for name, t in model.state_dict().items():
            assert torch.equal(again.state_dict()[name], t), name
