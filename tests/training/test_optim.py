import math

import pytest
import torch

from attnlab import build_model, presets
from attnlab.training.optim import Schedule, build_optimizer, decay_groups, lr_factor, noam_factor


def test_noam_equals_its_formula():
    d, w = 512, 4000
    for s in [1, 10, 100, 3999, 4000, 4001, 10_000, 100_000]:
        assert noam_factor(s, d, w) == pytest.approx(d ** -0.5 * min(s ** -0.5, s * w ** -1.5), rel=1e-12)
    peak = max(range(1, 20_000, 7), key=lambda s: noam_factor(s, d, w))
    assert abs(peak - w) <= 7  # rises linearly, peaks at the warmup, then decays as s^-0.5
    assert lr_factor("noam", 99, total_steps=1, warmup_steps=w, d_model=d) == noam_factor(100, d, w)


def test_cosine_warmup_and_floor():
    kw = dict(total_steps=1000, warmup_steps=100, min_lr_ratio=0.1)
    assert lr_factor("cosine", 0, **kw) == pytest.approx(0.01)
    assert lr_factor("cosine", 99, **kw) == pytest.approx(1.0)
    mid = 100 + (1000 - 100) // 2
    assert lr_factor("cosine", mid - 1, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor("cosine", 999, **kw) == pytest.approx(0.1)
    assert lr_factor("constant", 500, **kw) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        lr_factor("linear", 0, total_steps=10)


def test_schedule_sets_the_learning_rate_and_round_trips():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    sched = Schedule(opt, "noam", 2.0, total_steps=100, warmup_steps=10, d_model=64)
    for _ in range(5):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * noam_factor(6, 64, 10))
    other = Schedule(torch.optim.AdamW(model.parameters(), lr=1.0), "noam", 2.0, total_steps=100, warmup_steps=10,
                     d_model=64)
    other.load_state_dict(sched.state_dict())
    assert other.lr() == sched.lr()


@pytest.mark.parametrize("preset", ["tiny-decoder", "tiny-encoder", "tiny-encoder-decoder", "bert-base"])
def test_weight_decay_groups(preset):
    with torch.device("meta"):
        model = build_model(presets.get(preset))
    decay, keep = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    for name in keep["names"]:
        assert "norm" in name or name.endswith("bias") or "embed" in name or "position" in name or "bias" in name, name
    for name in decay["names"]:
        assert not name.endswith("bias") and "norm" not in name and "embed" not in name, name
    param = dict(model.named_parameters())
    assert all(param[n].dim() == 2 for n in decay["names"])
    assert len(decay["params"]) + len(keep["params"]) == len(list(model.parameters()))  # tied weights once
    assert any("embed.token" in n for n in keep["names"])
    assert any("norm" in n for n in keep["names"])


def test_adamw_decays_only_the_decay_group():
    model = build_model(presets.get("tiny-decoder"))
    opt = build_optimizer(model, "adamw", lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()  # no gradients: AdamW skips params without grad, so give zero grads
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    decay, keep = decay_groups(model, 0.5)
    for n in decay["names"]:
        torch.testing.assert_close(after[n], before[n] * (1 - 0.1 * 0.5))
    for n in keep["names"]:
        torch.testing.assert_close(after[n], before[n])


def test_build_optimizer_is_fused_on_cpu_and_steps_like_foreach_adamw():
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-decoder"))
    twin = build_model(presets.get("tiny-decoder"))
    twin.load_state_dict(model.state_dict())
    opt = build_optimizer(model, "adamw", lr=0.01, weight_decay=0.1)
    assert opt.defaults["fused"] is True
    groups = [{k: v for k, v in g.items() if k != "names"} for g in decay_groups(twin, 0.1)]
    ref = torch.optim.AdamW(groups, lr=0.01, betas=(0.9, 0.99), eps=1e-8, foreach=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in model.parameters()]
        for m, o in ((model, opt), (twin, ref)):
            for p, grad in zip(m.parameters(), grads):
                p.grad = grad.clone()
            o.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
