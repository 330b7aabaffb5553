"""Attention rollout and flow (Abnar & Zuidema 2020): hand-computed two-layer examples, max-flow
equal to the minimum cut found by trying every cut, and the stacks a model's maps come from."""

import itertools

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.attention_flow import (attention_flow, attention_rollout, flow_graph, max_flow,
                                            self_attention_maps)
from attnlab.inspect.attention_maps import attention_maps

# layer 1: both positions attend to token 0; layer 2: both attend to position 1
A1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
A2 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])


def test_rollout_of_two_hand_made_layers():
    # Â1 = [[1, 0], [.5, .5]], Â2 = [[.5, .5], [0, 1]]; R = Â2 Â1 (the later layer on the left)
    r = attention_rollout([A1[None], A2[None]])
    torch.testing.assert_close(r[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    plain = attention_rollout([A1[None], A2[None]], residual=0.0)  # A2 A1 without the identity
    torch.testing.assert_close(plain[0], A2 @ A1)


def test_rollout_averages_heads_and_renormalises_rows():
    heads = torch.stack([A1, A2])[None]  # (1, 2, 2, 2): the mean is [[.5, .5], [.5, .5]]
    torch.testing.assert_close(attention_rollout([heads])[0], torch.full((2, 2), 0.5) * 0.5 + torch.eye(2) * 0.5)
    unnormalised = torch.tensor([[[2.0, 0.0], [1.0, 1.0]]])  # rows sum to 2
    torch.testing.assert_close(attention_rollout([unnormalised], residual=0.0)[0], unnormalised[0] / 2)


def test_flow_of_two_hand_made_layers():
    # edges in0->h0 1, in0->h1 .5, in1->h1 .5; h0->out0 .5, h1->out0 .5, h1->out1 1
    raw = attention_flow([A1[None], A2[None]], normalize=False)[0]
    torch.testing.assert_close(raw, torch.tensor([[1.0, 0.5], [0.5, 0.5]]))
    torch.testing.assert_close(attention_flow([A1[None], A2[None]])[0], torch.tensor([[2 / 3, 1 / 3], [0.5, 0.5]]))


def test_one_layer_flows_equal_its_raw_attention():
    a = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    expected = 0.5 * a.mean(1) + 0.5 * torch.eye(5)
    torch.testing.assert_close(attention_flow([a], normalize=False), expected)
    torch.testing.assert_close(attention_rollout([a]), expected)


def _min_cut(cap, s, t):
    """The smallest capacity leaving a node set that holds s and not t, over every such set."""
    others = [v for v in range(cap.shape[0]) if v not in (s, t)]
    best = float("inf")
    for bits in itertools.product([0, 1], repeat=len(others)):
        inside = [s] + [v for v, b in zip(others, bits) if b]
        outside = [v for v in range(cap.shape[0]) if v not in inside]
        best = min(best, float(cap[inside][:, outside].sum()))
    return best


def test_max_flow_equals_the_minimum_cut_on_a_layered_graph():
    g = torch.Generator().manual_seed(1)
    layers = [torch.rand(3, 3, generator=g) for _ in range(2)]  # 9 nodes, 128 cuts per pair
    cap = flow_graph(layers)
    for i, j in itertools.product(range(3), range(3)):
        assert max_flow(cap, j, 6 + i) == pytest.approx(_min_cut(cap, j, 6 + i), abs=1e-9)


@pytest.mark.parametrize("L", [2, 3, 4])
def test_flow_equals_the_max_flow_of_the_whole_layered_graph(L):
    """attention_flow solves each pair on the graph without the other inputs and outputs: the same
    value as the whole graph's max-flow (itself checked against every cut above)."""
    g = torch.Generator().manual_seed(L)
    maps = [torch.rand(1, 2, 4, 4, generator=g).softmax(-1) for _ in range(L)]
    flows = attention_flow(maps, normalize=False)[0]
    layers = [0.5 * m[0].double().mean(0) + 0.5 * torch.eye(4, dtype=torch.float64) for m in maps]
    cap = flow_graph(layers)
    for i, j in itertools.product(range(4), range(4)):
        assert float(flows[i, j]) == pytest.approx(max_flow(cap, j, L * 4 + i), abs=1e-6)


def test_max_flow_takes_back_flow_that_blocks_a_better_route():
    """s=0 -> x1=1, x2=2 -> y1=3, y2=4 -> t=5: the shortest path through x1 and y1, tried first,
    blocks x2's only route; the maximum (2) needs the flow x1 -> y1 sent back."""
    cap = torch.zeros(6, 6, dtype=torch.float64)
    for u, v in [(0, 1), (0, 2), (1, 3), (1, 4), (2, 3), (3, 5), (4, 5)]:
        cap[u, v] = 1.0
    assert max_flow(cap, 0, 5) == pytest.approx(2.0) == _min_cut(cap, 0, 5)


def test_max_flow_equals_the_minimum_cut_on_graphs_with_cycles():
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        cap = (torch.rand(8, 8, generator=g) * (torch.rand(8, 8, generator=g) < 0.45)).double()
        cap.fill_diagonal_(0)
        assert max_flow(cap, 0, 7) == pytest.approx(_min_cut(cap, 0, 7), abs=1e-9)


def _model(arch):
    cfg = ModelConfig(arch=arch, vocab_size=20, d_model=8, num_layers=3, num_heads=2, d_ff=16, dropout=0.0)
    torch.manual_seed(0)
    return build_model(cfg)


def test_self_attention_maps_come_from_the_chosen_stack_in_layer_order():
    model = _model("encoder_decoder").eval()
    src, tgt = torch.randint(1, 20, (2, 6)), torch.randint(1, 20, (2, 4))
    every = attention_maps(model, src, tgt)
    for stack, T in (("encoder", 6), ("decoder", 4)):
        maps = self_attention_maps(model, src, tgt, stack=stack)
        assert [m.shape for m in maps] == [(2, 2, T, T)] * 3
        for i, m in enumerate(maps):
            torch.testing.assert_close(m, every[f"{stack}.layers.{i}.self_attn"])
    with pytest.raises(ValueError, match="stack='cross'"):
        self_attention_maps(model, src, tgt, stack="cross")
    decoder = _model("decoder")
    with pytest.raises(ValueError, match="one stack"):
        self_attention_maps(decoder, src, stack="encoder")


@pytest.mark.parametrize("maps,message", [
    ([], "non-empty list"),
    ([torch.rand(1, 2, 3)], r"\(B, H, T, T\) or \(B, T, T\)"),
    ([torch.rand(1, 3, 3), torch.rand(1, 4, 4)], r"maps\[1\] has shape"),
])
def test_errors_name_the_argument(maps, message):
    with pytest.raises(ValueError, match=message):
        attention_rollout(maps)
    with pytest.raises(ValueError, match="residual"):
        attention_flow([torch.rand(1, 3, 3)], residual=1.5)
