import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import ModelConfig, build_model, presets
from attnlab.inspect.cost import cost_table, crossover_seq_len


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("extra", [{}, {"activation": "swiglu"}, {"attention": {"kernel": "eager", "num_kv_heads": 2}}])
def test_flops_match_torch_flop_counter_and_params_match_model(arch, extra):
    attention = {"kernel": "eager", **extra.pop("attention", {})} if "attention" in extra else {"kernel": "eager"}
    cfg = ModelConfig(arch=arch, vocab_size=61, d_model=32, num_layers=2, num_heads=4, d_ff=48, dropout=0.0,
                      position={"scheme": "learned", "max_len": 32}, attention=attention, **extra)
    model = build_model(cfg).eval()
    T = 11
    x = torch.randint(1, 61, (1, T))
    with FlopCounterMode(display=False) as counter:
        model(x, x) if arch == "encoder_decoder" else model(x)
    rows = cost_table(cfg, T)
    assert sum(r.flops for r in rows) == counter.get_total_flops()
    assert sum(r.params for r in rows) == sum(p.numel() for p in model.parameters())


def test_hand_counted_layer():
    # d=8, H=2 (Dh=4), F=16, T=3, ReLU: q,k,v,out 4 * 2*3*8*8 = 1536; scores+mix 2 * 2*2*3*3*4 = 288;
    # FFN 2*3*8*16 * 2 = 1536; LM head 2*3*8*10 = 480
    cfg = ModelConfig(arch="decoder", vocab_size=10, d_model=8, num_layers=1, num_heads=2, d_ff=16,
                      position={"scheme": "none"})
    rows = {r.name: r for r in cost_table(cfg, 3)}
    assert rows["layers.0.self_attn.projections"].flops == 1536
    assert rows["layers.0.self_attn.scores"].flops == 288
    assert rows["layers.0.ffn"].flops == 1536
    assert rows["lm_head"].flops == 480
    assert rows["layers.0.self_attn.projections"].params == 4 * (8 * 8 + 8)
    assert rows["layers.0.ffn"].params == 8 * 16 + 16 + 16 * 8 + 8


def test_crossover_is_2d_plus_dff():
    base = presets.get("vaswani-base")
    assert crossover_seq_len(base) == 2 * 512 + 2048
    t = int(crossover_seq_len(base))
    rows = cost_table(base.replace(num_layers=1, num_decoder_layers=1, arch="decoder"), t)
    scores = sum(r.flops for r in rows if r.name.endswith("self_attn.scores"))
    dense = sum(r.flops for r in rows if r.name.endswith(("self_attn.projections", ".ffn")))
    assert scores == dense  # exactly at T*
    rows2 = cost_table(base.replace(arch="decoder"), 2 * t)
    assert sum(r.flops for r in rows2 if r.name.endswith(".scores")) > \
        sum(r.flops for r in rows2 if r.name.endswith((".projections", ".ffn")))


def test_eager_weights_dominate_memory_and_bad_input():
    cfg = presets.get("tiny-decoder")
    fused = {r.name: r for r in cost_table(cfg, 64)}
    eager = {r.name: r for r in cost_table(cfg, 64, kernel="eager")}
    assert eager["layers.0.self_attn.scores"].activations - fused["layers.0.self_attn.scores"].activations == 4 * 64 * 64
    with pytest.raises(ValueError, match="seq_len"):
        cost_table(cfg, 0)


def test_mlm_head_counted():
    cfg = presets.get("tiny-encoder", head="mlm", attention={"kernel": "eager"})
    model = build_model(cfg).eval()
    x = torch.randint(1, cfg.vocab_size, (1, 9))
    with FlopCounterMode(display=False) as counter:
        model(x)
    rows = cost_table(cfg, 9)
    assert sum(r.flops for r in rows) == counter.get_total_flops()
    assert sum(r.params for r in rows) == sum(p.numel() for p in model.parameters())
