"""The cost counters of the kernels and layers that compute less than dense attention or a dense
feed-forward: local blocks, memory-compressed attention (and the DMCA local layers), the score
functions that widen or transform q and k, and a mixture of experts. Each is checked against a
hand formula and against what torch.utils.flop_counter measures on the real model."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnlab import ModelConfig, build_model
from attnlab.inspect.cost import cost_table
from attnlab.nn.kernels import KernelSetup, build_kernel
from attnlab.nn.kernels.block_diagonal import block_diagonal_flops

D, H, DH, FF, T = 16, 2, 8, 24, 10


def _cfg(arch="decoder", **kw) -> ModelConfig:
    base = dict(arch=arch, vocab_size=31, d_model=D, num_layers=2, num_heads=H, d_ff=FF, dropout=0.0,
                position={"scheme": "learned", "max_len": 32})
    return ModelConfig(**{**base, **kw})


def _rows(cfg, t=T, **kw):
    return {r.name: r for r in cost_table(cfg, t, **kw)}


def _measured(cfg, t=T) -> int:
    """FLOPs that FlopCounterMode counts in one forward, SDPA on its math backend (the counter
    does not see the CPU's fused SDPA; the math backend runs the same two products as bmm)."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    x = torch.randint(1, cfg.vocab_size, (1, t))
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model(x, x) if cfg.arch == "encoder_decoder" else model(x)
    return counter.get_total_flops()


CASES = {
    "local_block": dict(attention={"kernel": "local_block", "kernel_options": {"block_size": 4}}),
    "local_block-encoder": dict(arch="encoder", attention={"kernel": "local_block", "kernel_options": {"block_size": 3}}),
    "memory_compressed": dict(attention={"kernel": "memory_compressed",
                                         "kernel_options": {"compression": 3, "alternate": False}}),
    "dmca": dict(attention={"kernel": "memory_compressed", "kernel_options": {"compression": 2, "block_size": 4}}),
    "memory_compressed-encoder": dict(arch="encoder", attention={"kernel": "memory_compressed", "kernel_options":
                                                                 {"compression": 4, "alternate": False}}),
    "memory_compressed-gqa": dict(attention={"kernel": "memory_compressed", "num_kv_heads": 1,
                                             "kernel_options": {"compression": 3, "alternate": False}}),
    "gaussian": dict(attention={"score": "gaussian"}),
    "general": dict(attention={"score": "general"}),
    "additive": dict(attention={"score": "additive", "additive_dim": 5}),
    "moe": dict(moe={"num_experts": 4, "top_k": 2}),
    "moe-gated-every-2": dict(activation="swiglu", moe={"num_experts": 3, "top_k": 1, "every": 2}),
    "moe-encoder-decoder": dict(arch="encoder_decoder", moe={"num_experts": 4, "top_k": 3}),
}


@pytest.mark.parametrize("name", CASES)
def test_counted_flops_equal_the_measured_ones(name):
    """FlopCounterMode counts every matrix product the model runs (SDPA per block, the
    convolutions, the experts that receive tokens): the table must add up to it exactly."""
    cfg = _cfg(**CASES[name])
    rows = cost_table(cfg, T)
    assert sum(r.flops for r in rows) == _measured(cfg)
    torch.manual_seed(0)
    assert sum(r.params for r in rows) == sum(p.numel() for p in build_model(cfg).parameters())


def test_local_block_is_t_times_b_per_head_by_hand():
    b = 4
    nb = math.ceil(T / b)  # 3 blocks, the last padded
    rows = _rows(_cfg(**CASES["local_block"]))
    assert rows["layers.0.self_attn.scores"].flops == 2 * H * nb * b * b * (DH + DH)  # 1,536
    dense = _rows(_cfg(attention={"kernel": "eager"}))["layers.0.self_attn.scores"]
    assert dense.flops == 2 * H * T * T * (DH + DH)  # 3,200
    assert rows["layers.0.self_attn.scores"].activations == T * H * DH  # no weights held: SDPA per block
    assert dense.activations == H * T * T + T * H * DH
    # b divides T: exactly T b per head, the ratio to dense b / T
    assert block_diagonal_flops(12, 12, 4, H, DH, DH) * 12 == 2 * H * 12 * 12 * 2 * DH * 4


def test_memory_compressed_is_t_times_t_over_c_plus_the_convolution_by_hand():
    c = 3
    nb = math.ceil(T / c)  # 4 compressed blocks
    rows = _rows(_cfg(**CASES["memory_compressed"]))
    conv = 2 * 2 * H * nb * c * DH * DH  # keys and values, one (c Dh, Dh) matrix per head
    attend = 2 * H * T * nb * (DH + DH)
    for i in range(2):
        r = rows[f"layers.{i}.self_attn.scores"]
        assert r.flops == conv + attend
        assert r.activations == H * T * nb + 2 * H * nb * DH + T * H * DH  # weights, compressed k and v, output
        assert r.params == 2 * (H * c * DH * DH + H * DH)


def test_dmca_alternates_local_and_compressed_layers():
    rows = _rows(_cfg(**CASES["dmca"]))
    local, compressed = rows["layers.0.self_attn.scores"], rows["layers.1.self_attn.scores"]
    assert local.flops == block_diagonal_flops(T, T, 4, H, DH, DH) and local.params == 0
    nb = math.ceil(T / 2)
    assert compressed.flops == 2 * 2 * H * nb * 2 * DH * DH + 2 * H * T * nb * 2 * DH


def test_scores_that_widen_or_transform_q_and_k():
    gaussian = _rows(_cfg(**CASES["gaussian"]))["layers.0.self_attn.scores"]
    assert gaussian.flops == 2 * H * T * T * (DH + 1) + 2 * H * T * T * DH  # q' = [q, 1], k' = [k, -|k|^2/2]
    general = _rows(_cfg(**CASES["general"]))["layers.0.self_attn.scores"]
    assert general.flops == 2 * H * T * DH * DH + 2 * H * T * T * 2 * DH  # q W_h, then dense
    additive = _rows(_cfg(**CASES["additive"]))["layers.0.self_attn.scores"]
    assert additive.flops == 2 * H * T * DH * 5 * 2 + 2 * H * T * T * DH  # W_q q, W_k k; no q k^T
    assert additive.activations == H * T * T + T * H * DH  # scored eagerly: the weights are held


def test_moe_runs_k_of_e_experts_plus_the_router_by_hand():
    E, k = 4, 2
    rows = _rows(_cfg(**CASES["moe"]))
    expert = 2 * D * FF + 2 * FF * D  # one token through one expert
    r = rows["layers.0.ffn"]
    assert r.flops == 2 * T * D * E + k * T * expert
    dense_all = E * T * expert  # every expert on every token
    assert r.flops - 2 * T * D * E == dense_all * k // E
    assert r.activations == T * E + k * T * (FF + D)
    assert r.params == E * (D * FF + FF + FF * D + D) + 2 * D * E  # experts, router, noise
    plain = _rows(_cfg())["layers.0.ffn"]
    assert plain.flops == T * expert
    every2 = _rows(_cfg(**CASES["moe-gated-every-2"]))
    assert every2["layers.0.ffn"].flops == T * (2 * D * 2 * FF + 2 * FF * D)  # plain, gated
    assert every2["layers.1.ffn"].flops == 2 * T * D * 3 + 1 * T * (2 * D * 2 * FF + 2 * FF * D)


def test_the_kernel_argument_counts_another_kernel_with_its_defaults():
    cfg = _cfg()
    rows = _rows(cfg, 600, kernel="local_block")  # default block_size 256: 3 blocks
    assert rows["layers.0.self_attn.scores"].flops == 2 * H * 3 * 256 * 256 * 2 * DH
    assert _rows(cfg, 600, kernel="eager")["layers.0.self_attn.scores"].activations == H * 600 * 600 + 600 * H * DH


def test_kernel_cost_of_a_built_kernel_matches_its_computation():
    """The kernel alone, outside a model: its cost equals the FLOPs of one call."""
    kernel = build_kernel("memory_compressed", {"compression": 3, "alternate": False}, KernelSetup(H, DH))
    q, k, v = (torch.randn(1, H, 11, DH) for _ in range(3))
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        kernel(q, k, v, scale=DH**-0.5, causal=True)
    cost = kernel.cost(11, 11, num_heads=H, num_kv_heads=H, qk_dim=DH, v_dim=DH, causal=True)
    assert cost.flops == counter.get_total_flops()


def test_grouped_memory_compressed_counts_one_convolution_per_kv_head():
    H4, G, c, t = 4, 2, 3, 11
    nb = math.ceil(t / c)
    kernel = build_kernel("memory_compressed", {"compression": c, "alternate": False},
                          KernelSetup(H4, DH, num_kv_heads=G))
    q = torch.randn(1, H4, t, DH)
    k, v = torch.randn(1, G, t, DH), torch.randn(1, G, t, DH)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        kernel(q, k, v, scale=DH**-0.5, causal=True)
    cost = kernel.cost(t, t, num_heads=H4, num_kv_heads=G, qk_dim=DH, v_dim=DH, causal=True)
    assert cost.flops == counter.get_total_flops() == 2 * 2 * G * nb * c * DH * DH + 2 * H4 * t * nb * 2 * DH
    assert cost.activations == H4 * t * nb + 2 * G * nb * DH
