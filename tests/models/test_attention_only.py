"""d_ff=0 builds attention-only layers: a layer is its attention sublayer(s) and nothing else."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config.validate import ConfigError

from .helpers import V, assert_cached_steps_equal_full, ids, left_padded


def tiny(scheme: str = "learned", *, d_ff: int, norm_placement: str = "pre") -> torch.nn.Module:
    cfg = ModelConfig(arch="decoder", vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=d_ff, dropout=0.0,
                      norm_placement=norm_placement, position={"scheme": scheme, "max_len": 64})
    return build_model(cfg).eval()


@pytest.mark.parametrize("placement", ["post", "pre", "both"])
def test_attention_only_equals_a_full_model_whose_feed_forward_block_does_nothing(placement):
    """Reference: the same weights in a model with a feed-forward, its output layer zeroed and the
    norms of its residual block made identities, so that block passes x on; the logits agree."""
    torch.manual_seed(0)
    bare = tiny(d_ff=0, norm_placement=placement)
    full = tiny(d_ff=16, norm_placement=placement)
    assert not [name for name in bare.state_dict() if ".ffn" in name]  # no feed-forward weights, no norm
    missing, unexpected = full.load_state_dict(bare.state_dict(), strict=False)
    assert not unexpected and missing and all(".ffn." in k or ".ffn_block." in k for k in missing)
    with torch.no_grad():
        for layer in full.layers:
            layer.ffn.w2.weight.zero_()
            layer.ffn.w2.bias.zero_()
            layer.ffn_block.norm = torch.nn.Identity()
            if layer.ffn_block.post_norm is not None:
                layer.ffn_block.post_norm = torch.nn.Identity()
        x = ids(3, 9)
        torch.testing.assert_close(bare(x), full(x))


def test_attention_only_decodes_with_a_cache_as_without():
    torch.manual_seed(0)
    model = tiny("rotary", d_ff=0)
    x, mask = left_padded([5, 3, 1])
    assert_cached_steps_equal_full(model, x, mask, steps=4)


def test_attention_only_trains_its_attention():
    torch.manual_seed(0)
    model = tiny(d_ff=0).train()
    loss = torch.nn.functional.cross_entropy(model(ids(2, 6)).flatten(0, 1), ids(2, 6).flatten())
    loss.backward()
    assert model.layers[1].self_attn.qkv_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs, field", [
    ({"d_ff": -1}, "d_ff"),
    ({"d_ff": 0, "moe": {"num_experts": 4}}, "moe.num_experts"),
])
def test_bad_attention_only_configs_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig(arch="decoder", vocab_size=V, d_model=32, num_heads=4, **kwargs)


def test_attention_only_round_trips_and_rebuilds():
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=V, d_model=32, num_layers=1, num_heads=4, d_ff=0)
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again.d_ff == 0
    model = build_model(again)
    assert not [n for n, _ in model.named_parameters() if ".ffn" in n]
