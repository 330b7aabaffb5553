"""Layer-wise lr decay, top-layer re-initialisation and freezing, read back from the model/optimizer."""

import pytest
import torch

from attnlab.finetune import Finetuner, Recipe, freeze, llrd_param_groups, reinit_top_layers, with_head
from attnlab.finetune.data import Example
from tests.finetune.helpers import char_tokenizer, tiny

L = 3


@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_llrd_puts_the_documented_lr_on_every_parameter(arch):
    model = with_head(tiny(arch, num_layers=L, **({"pooler": True} if arch == "encoder" else {})),
                      "classification", 3)
    base, decay = 1e-3, 0.8
    tok = char_tokenizer()
    run = Finetuner(model, tok, [Example("a b", label="x")], [0], Recipe(lr=base, layer_decay=decay, max_steps=4,
                                                                             warmup_ratio=0.0, schedule="constant"))
    lr_of = {}
    for group in run.optimizer.param_groups:
        for p in group["params"]:
            lr_of[id(p)] = group["lr"]
    seen = 0
    for name, p in model.named_parameters():
        if name.startswith("embed."):
            expected = base * decay ** (L + 1)
        elif name.startswith("layers."):
            expected = base * decay ** (L - int(name.split(".")[1]))
        else:  # head, pooler, final norm
            expected = base
        assert lr_of[id(p)] == pytest.approx(expected), name
        seen += 1
    assert seen == len(lr_of)  # every trainable parameter in exactly one group
    groups = llrd_param_groups(model, base, decay, weight_decay=0.1)
    assert {g["weight_decay"] for g in groups} == {0.0, 0.1}
    assert all(n.endswith("bias") or "norm" in n or n.startswith("embed.") or g["weight_decay"] == 0.1
               for g in groups for n in g["names"])


def test_llrd_rejects_bad_decay():
    with pytest.raises(ValueError, match="layer_decay"):
        llrd_param_groups(tiny(), 1e-3, 1.5)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_reinit_changes_exactly_the_top_k_layers(k):
    model = tiny("encoder", num_layers=L, pooler=True)
    with torch.no_grad():  # move norms away from their initial values so their reset is visible
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = reinit_top_layers(model, k, seed=1)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    top = {n for n in before if n.startswith("layers.") and int(n.split(".")[1]) >= L - k}
    assert changed == {n for n in top if "norm" in n or not n.endswith("bias")}  # linear biases were zero already
    assert set(names) == top
    # seeded: the same seed draws the same weights
    other = tiny("encoder", num_layers=L, pooler=True)
    reinit_top_layers(other, k, seed=1)
    for n in top:
        if "norm" not in n:
            assert torch.equal(dict(other.named_parameters())[n], dict(model.named_parameters())[n])


def test_frozen_parameters_do_not_change_after_steps():
    model = with_head(tiny("encoder", num_layers=L), "classification", 2)
    tok = char_tokenizer()
    examples = [Example("the cat", label="a"), Example("a dog ran", label="b")] * 4
    recipe = Recipe(lr=1e-2, max_steps=3, batch_size=4, freeze_embeddings=True, freeze_layers=2, warmup_ratio=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run = Finetuner(model, tok, examples, [0, 1] * 4, recipe, seed=0)
    run.train(3)
    for n, p in model.named_parameters():
        frozen = n.startswith("embed.") or (n.startswith("layers.") and int(n.split(".")[1]) < 2)
        assert p.requires_grad is not frozen, n
        if frozen:
            assert torch.equal(p, before[n]), n
    trained = [n for n, p in model.named_parameters() if n.startswith(("layers.2.", "head.")) and n.endswith("weight")]
    assert trained and all(not torch.equal(dict(model.named_parameters())[n], before[n]) for n in trained)
    with pytest.raises(ValueError, match="freeze_layers"):
        freeze(model, layers=L + 1)
