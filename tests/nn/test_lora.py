"""LoRA adapters (attnlab.nn.lora): the wrapped model starts equal to the base, its update is
s x A^T B^T on the rows of the targeted projection (by hand), only the adapters get gradients,
merged == unmerged, cached decoding sees the adapters, and the adapters alone saved and loaded
onto the same base give the same outputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import ModelConfig, build_model, generate, presets
from attnlab.nn.lora import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraError, LoraLinear, add_lora, adapter_state,
                             load_adapters, lora_layers, lora_targets, merge_lora, merged_copy, save_adapters,
                             unload_lora, unmerge_lora)

ALL = ["q", "k", "v", "out_proj", "w1", "w2"]


def _tiny(arch: str = "decoder", **kw) -> nn.Module:
    torch.manual_seed(0)
    return build_model(presets.get(f"tiny-{arch}", **kw)).eval()


def _inputs(model: nn.Module, T: int = 9) -> tuple:
    """Token ids for `model`, on the device of its weights."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (2, T), generator=g).to(next(model.parameters()).device)
    return (ids, ids[:, :5]) if model.config.arch == "encoder_decoder" else (ids,)


def _randomize_adapters(model: nn.Module, seed: int = 0) -> None:
    """Non-zero B (and a new A), so that the adapters change the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_layers(model).values():
            for p in [*m.lora_A.values(), *m.lora_B.values()]:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _base_copy(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return build_model(model.config).eval()


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_the_wrapped_model_starts_equal_to_the_base_and_differs_once_b_moves(arch, device):
    model = _tiny(arch).to(device)
    x = _inputs(model)
    want = model(*x)
    names = add_lora(model, rank=4, alpha=8, target_modules=ALL)
    assert names and all(isinstance(model.get_submodule(n), LoraLinear) for n in names)
    assert torch.equal(model(*x), want)  # B = 0: exactly the base
    for m in lora_layers(model).values():
        for part, A in m.lora_A.items():
            assert torch.all(m.lora_B[part] == 0)
            assert A.abs().max() <= 1 / math.sqrt(m.in_features) and A.std() > 0  # kaiming-uniform, a = sqrt(5)
    _randomize_adapters(model)
    assert (model(*x) - want).abs().max() > 1e-2


def test_a_part_of_the_fused_qkv_adds_s_x_at_bt_to_its_rows_only():
    attn = _tiny().layers[0].self_attn
    base = nn.Linear(32, 96)
    base.load_state_dict(attn.qkv_proj.state_dict())
    model = _tiny()
    add_lora(model, rank=3, alpha=6, target_modules=["0.self_attn.q", "0.self_attn.v"])
    _randomize_adapters(model)
    lora = model.layers[0].self_attn.qkv_proj
    assert lora.rows == {"q": (0, 32), "v": (64, 96)}  # q | k | v, 32 rows each
    x = torch.randn(2, 5, 32)
    want = base(x)
    for part, (a, b) in lora.rows.items():  # y[rows] += (alpha / r) x A^T B^T
        want[..., a:b] += 2.0 * x @ lora.lora_A[part].T @ lora.lora_B[part].T
    torch.testing.assert_close(lora(x), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(lora(x)[..., 32:64], base(x)[..., 32:64])  # k untouched


def test_cross_attention_and_gated_feed_forward_parts():
    model = _tiny("encoder-decoder", activation="swiglu")
    plan = lora_targets(model, ["decoder.layers.0.cross_attn.q", "decoder.layers.0.cross_attn.v", "0.ffn.w3"])
    assert plan["decoder.layers.0.cross_attn.q_proj"] == {"all": (0, 32)}
    assert plan["decoder.layers.0.cross_attn.kv_proj"] == {"v": (32, 64)}  # rows k | v
    assert plan["encoder.layers.0.ffn.w13"] == {"w3": (64, 128)} == plan["decoder.layers.0.ffn.w13"]  # W1 | W3


def test_only_the_adapters_and_train_modules_get_gradients(device):
    model = _tiny("encoder", head="classification", num_labels=3).to(device)
    add_lora(model, rank=2, alpha=2, target_modules=["q", "v", "w2"], train_modules=["head"])
    _randomize_adapters(model)
    model(*_inputs(model)).sum().backward()
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains == {n for n, p in model.named_parameters() if p.grad is not None}
    assert trains == {n for n in dict(model.named_parameters()) if ".lora_" in n or n.startswith("head.")}
    assert {n.rsplit(".", 1)[-1] for n in trains if ".lora_" in n} == {"q", "v", "all"}


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_merged_equals_unmerged_and_unmerge_restores_the_weights(arch, device):
    model = _tiny(arch).to(device)
    x = _inputs(model)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    add_lora(model, rank=4, alpha=16, target_modules=ALL)
    _randomize_adapters(model)
    with torch.no_grad():
        want = model(*x)
        merge_lora(model)
        assert any(not torch.equal(before[n], t) for n, t in model.state_dict().items() if n in before)
        torch.testing.assert_close(model(*x), want, rtol=1e-5, atol=1e-5)
        unmerge_lora(model)
        torch.testing.assert_close(model(*x), want, rtol=1e-5, atol=1e-5)
        for n, t in model.state_dict().items():
            if n in before:
                torch.testing.assert_close(t, before[n], rtol=0, atol=1e-6)
        plain = merged_copy(model)  # the model itself keeps its adapters
        assert lora_layers(model) and not lora_layers(plain)
        assert set(plain.state_dict()) == set(before)
        torch.testing.assert_close(plain(*x), want, rtol=1e-5, atol=1e-5)
        unload_lora(model, merge=False)  # the base again
        assert not lora_layers(model) and model.state_dict().keys() == before.keys()
        for n, t in model.state_dict().items():
            torch.testing.assert_close(t, before[n], rtol=0, atol=1e-6)


def test_cached_decoding_goes_through_the_adapters(device):
    model = _tiny().to(device)
    add_lora(model, rank=4, alpha=8, target_modules=ALL)
    _randomize_adapters(model)
    prompt = _inputs(model, T=4)[0]
    got = generate(model, prompt, 8)  # the cached fast path (MultiHeadAttention.step, project)
    assert torch.equal(got, generate(merged_copy(model), prompt, 8))
    assert torch.equal(got, generate(model, prompt, 8, use_cache=False))


def test_adapter_dropout_drops_the_adapter_input_only():
    model = _tiny()
    x = _inputs(model)
    want = model(*x)
    add_lora(model, rank=4, alpha=8, dropout=0.5, target_modules=ALL)
    model.train()
    assert torch.equal(model(*x), want)  # B = 0: the base path has no dropout of its own here
    _randomize_adapters(model)
    assert not torch.equal(model(*x), model(*x))  # the masks differ call to call
    model.eval()
    assert torch.equal(model(*x), model(*x))


def test_saved_adapters_load_onto_the_same_base_and_reproduce_the_outputs(tmp_path):
    model = _tiny("encoder", head="classification", num_labels=3)
    x = _inputs(model)
    add_lora(model, rank=4, alpha=8, target_modules=["q", "v", "w1"], train_modules=["head"])
    _randomize_adapters(model)
    with torch.no_grad():
        model.head.proj.weight.add_(1.0)  # a module trained in full travels with the adapters
        want = model(*x)
    folder = save_adapters(model, tmp_path / "adapter", settings={"target_modules": ["q", "v", "w1"]})
    assert sorted(p.name for p in folder.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    n_saved = sum(t.numel() for t in adapter_state(model).values())
    assert n_saved < sum(p.numel() for p in model.parameters()) / 4

    base = _base_copy(model)
    load_adapters(base, folder)
    assert torch.equal(base(*x), want)
    assert {n for n, p in base.named_parameters() if p.requires_grad} == set(adapter_state(model))

    other = _base_copy(model)
    with torch.no_grad():
        other.layers[0].ffn.w2.weight.add_(0.01)
    with pytest.raises(ValueError, match="other base weights"):
        load_adapters(other, folder)
    assert not lora_layers(other)  # refused before any change
    load_adapters(other, folder, check_base=False)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        load_adapters(other, folder, check_base=False)
    with pytest.raises(ValueError, match="another model"):
        load_adapters(_tiny("encoder", head="classification", num_labels=4), folder)


def test_a_pattern_that_matches_nothing_names_it_and_lists_the_layers():
    model = _tiny()
    with pytest.raises(LoraError, match=r"target_modules: 'query' matches no layer .* end in k, out_proj, q, "
                                        r"qkv_proj, v, w1, w2 \(e\.g\. layers\.0\.self_attn\.q"):
        add_lora(model, target_modules=["q", "query"])
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())  # nothing changed
    with pytest.raises(LoraError, match="'head.proj' matches head.proj, which LoRA cannot adapt: its weight is tied"):
        lora_targets(model, ["head.proj"])
    with pytest.raises(LoraError, match="layers.0.self_attn.qkv_proj and layers.0.self_attn.q adapt the same rows"):
        lora_targets(model, ["qkv_proj", "q"])
    with pytest.raises(LoraError, match="train_modules: 'pooler' matches no module"):
        add_lora(model, target_modules=["q"], train_modules=["pooler"])
    with pytest.raises(LoraError, match="rank: expected an integer >= 1, got 0"):
        add_lora(model, rank=0)
    # a regular expression matches the whole name; a plain name matches at a dot
    assert list(lora_targets(model, [r"layers\.1\..*\.(q|w2)"])) == ["layers.1.self_attn.qkv_proj", "layers.1.ffn.w2"]
    assert list(lora_targets(model, ["1.ffn.w2"])) == ["layers.1.ffn.w2"]
    with pytest.raises(LoraError, match="'2' matches no layer"):
        lora_targets(model, ["2"])  # not the '2' inside 'w2'


def test_what_lora_cannot_adapt_is_refused_with_the_reason():
    untied = _tiny(tie_embeddings=False)
    with pytest.raises(LoraError, match="output matrix, whose weight the fused loss reads directly"):
        lora_targets(untied, ["head.proj"])
    memory = build_model(ModelConfig(arch="decoder", vocab_size=50, d_model=32, num_layers=1, num_heads=4, d_ff=64,
                                     memory_len=8, position={"scheme": "rotary"}))
    with pytest.raises(LoraError, match=r"'q' matches .*self_attn.q, which LoRA cannot adapt: the segment memory"):
        lora_targets(memory, ["q"])
    assert list(lora_targets(memory, ["out_proj"])) == ["layers.0.self_attn.out_proj"]


def test_lora_linear_over_a_whole_linear_is_x_wt_plus_b_plus_the_update():
    g = torch.Generator().manual_seed(0)
    base = nn.Linear(6, 5)
    m = LoraLinear(base, {"all": (0, 5)}, rank=2, alpha=3, generator=g)
    assert m.weight is base.weight and m.bias is base.bias
    with torch.no_grad():
        m.lora_B["all"].normal_(generator=g)
    x = torch.randn(4, 6, generator=g)
    want = F.linear(x, base.weight + 1.5 * m.lora_B["all"] @ m.lora_A["all"], base.bias)
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-6)
