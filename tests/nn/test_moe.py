"""Mixture-of-experts feed-forward: routing equals a per-token loop, every expert learns, the
balance term equals its formula, capacity drops are counted, decoders stay causal and cached."""

import math

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config import ConfigError
from attnlab.nn.layers import FeedForward
from attnlab.nn.moe import MoEFeedForward, balance_loss
from attnlab.training.tasks.protocol import StepLoss, with_balance_loss
from tests.models.helpers import assert_causal_and_cached

D, F_, E = 16, 32, 4


def _moe(top_k=2, capacity_factor=None, noisy=False, seed=0):
    torch.manual_seed(seed)
    moe = MoEFeedForward(lambda: FeedForward(D, F_, "gelu"), D, E, top_k, capacity_factor, noisy)
    torch.nn.init.normal_(moe.router.weight, std=0.5)  # decisive routing, so the tests see several experts
    return moe


def _per_token(moe, x, limit=None):
    """The definition, one token at a time in order: top-k of x W_g, softmax over those k, the
    experts' outputs weighted; an expert past `limit` assignments adds nothing."""
    taken = [0] * E
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        logits = x[n] @ moe.router.weight.t()
        top, experts = logits.topk(moe.top_k)
        gates = top.softmax(-1)
        for g, e in zip(gates, experts.tolist()):
            taken[e] += 1
            if limit is None or taken[e] <= limit:
                out[n] += g * moe.experts[e](x[n:n + 1])[0]
    return out, taken


@pytest.mark.parametrize("top_k", [1, 2])
def test_routing_equals_the_per_token_loop(top_k):
    moe = _moe(top_k).eval()
    x = torch.randn(2, 9, D)
    with torch.no_grad():
        ref, taken = _per_token(moe, x.view(-1, D))
        torch.testing.assert_close(moe(x), ref.view(2, 9, D), atol=1e-5, rtol=1e-5)
    assert sum(t > 0 for t in taken) >= 3  # the comparison exercised several experts


def test_every_expert_and_the_router_receive_gradient():
    moe = _moe(noisy=True).train()
    out = moe(torch.randn(64, D))
    (out.square().mean() + balance_loss(moe)).backward()
    for e, expert in enumerate(moe.experts):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in expert.parameters()), e
    assert moe.router.weight.grad.abs().sum() > 0 and moe.noise.weight.grad.abs().sum() > 0


def test_balance_term_equals_its_formula():
    moe = _moe().eval()
    x = torch.randn(40, D)
    moe(x)
    logits = x @ moe.router.weight.t()
    probs = logits.softmax(-1)
    chosen = logits.topk(2).indices
    f = [sum(int((chosen[n] == e).any()) for n in range(40)) / (40 * 2) for e in range(E)]
    P = [probs[:, e].mean().item() for e in range(E)]
    assert moe.balance.item() == pytest.approx(E * sum(fe * pe for fe, pe in zip(f, P)), rel=1e-5)
    uniform = _moe()
    torch.nn.init.zeros_(uniform.router.weight)
    uniform.eval()(x)  # equal logits: P_e = 1/E, ties go to the first k experts, f = (1/2, 1/2, 0, 0)
    assert uniform.balance.item() == pytest.approx(E * (0.5 / E + 0.5 / E))


def test_capacity_drops_the_assignments_past_it_and_counts_them():
    moe = _moe(capacity_factor=0.5).train()  # no noise: routing as in eval
    x = torch.randn(30, D)
    limit = math.ceil(0.5 * 30 * 2 / E)
    out = moe(x)
    with torch.no_grad():
        ref, taken = _per_token(moe, x, limit)
    expected = sum(max(0, t - limit) for t in taken)
    assert expected > 0
    assert moe.last_stats == {"assignments": 60, "dropped": expected}
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    moe.eval()
    moe(x)
    assert moe.last_stats["dropped"] == 0  # inference never drops


def _decoder(**moe):
    cfg = ModelConfig(arch="decoder", vocab_size=40, d_model=D, num_layers=2, num_heads=2, d_ff=F_, dropout=0.0,
                      moe={"num_experts": E, **moe})
    return build_model(cfg)


def test_every_second_layer_is_moe():
    model = _decoder(every=2)
    assert [type(layer.ffn).__name__ for layer in model.layers] == ["FeedForward", "MoEFeedForward"]


def test_decoder_with_experts_is_causal_and_decodes_like_its_forward():
    model = _decoder().eval()
    assert_causal_and_cached(model, 40)


def test_the_training_loss_adds_the_weighted_balance_term():
    model = _decoder(balance_weight=0.1).train()
    ids = torch.randint(0, 40, (2, 8))
    seen = {}

    def task_loss(model, batch, **kw):
        seen["loss"] = model(batch).float().logsumexp(-1).mean()
        return StepLoss(seen["loss"], {"lm": 0.0})

    total = with_balance_loss(task_loss, model)(model, ids)
    balance = balance_loss(model)  # the same forward's term
    assert set(total.parts) == {"lm", "moe_balance", "moe_dropped"}
    assert total.parts["moe_balance"] == pytest.approx(balance.item())
    torch.testing.assert_close(total.loss, seen["loss"] + 0.1 * balance)
    dense = build_model(ModelConfig(vocab_size=40, d_model=D, num_layers=1, num_heads=2))
    assert with_balance_loss(task_loss, dense) is task_loss


@pytest.mark.parametrize("moe, field", [({"num_experts": 1}, "moe.num_experts"),
                                        ({"num_experts": 2, "top_k": 3}, "moe.top_k"),
                                        ({"num_experts": 4, "capacity_factor": 0}, "moe.capacity_factor")])
def test_bad_settings_name_the_field(moe, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig(moe=moe)
