import math

import pytest
import torch

from attnlab.inspect.heads import (attention_entropy, head_importance, head_mask, lm_loss, mask_from_heads,
                                   ones_mask, plot_pruning_curve, prune_heads, pruning_curve)
from tests.models.helpers import ids, tiny

PRUNE = {"encoder.layers.0.self_attn": [1, 3], "encoder.layers.1.self_attn": [0],
         "decoder.layers.0.self_attn": [2], "decoder.layers.1.cross_attn": [0, 1, 2]}


@pytest.mark.parametrize("scheme,score", [("learned", "scaled_dot"), ("relative", "scaled_dot"),
                                          ("alibi", "scaled_dot"), ("t5_bias", "dot"), ("rotary", "general"),
                                          ("sinusoidal", "additive")])
def test_removed_heads_equal_masked_heads(scheme, score):
    model = tiny("encoder_decoder", scheme, attention={"score": score})
    src, tgt = ids(2, 7), ids(2, 5)
    src_mask = torch.ones(2, 7, dtype=torch.long)
    src_mask[0, 5:] = 0
    with torch.no_grad(), head_mask(model, mask_from_heads(model, PRUNE)):
        masked = model(src, tgt, src_mask)
    pruned = prune_heads(model, PRUNE)
    out = pruned(src, tgt, src_mask)
    torch.testing.assert_close(out, masked, rtol=1e-5, atol=1e-5)
    assert pruned.encoder.layers[0].self_attn.num_heads == 2
    assert pruned.encoder.layers[0].self_attn.qkv_proj.out_features == 3 * 2 * 8  # q, k, v of 2 heads
    assert pruned.decoder.layers[1].cross_attn.out_proj.in_features == 8
    assert model.encoder.layers[0].self_attn.num_heads == 4  # the original is untouched
    full = model(src, tgt, src_mask)
    assert not torch.allclose(full, out, atol=1e-4)  # pruning did change something


def test_grouped_kv_heads_refused_and_bad_input():
    model = tiny("decoder", attention={"num_kv_heads": 2})
    with pytest.raises(ValueError, match="grouped key/value heads"):
        prune_heads(model, {"layers.0.self_attn": [0]})
    model = tiny("decoder")
    with pytest.raises(ValueError, match="keep at least one"):
        prune_heads(model, {"layers.0.self_attn": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match="not an attention module"):
        prune_heads(model, {"layers.9.self_attn": [0]})
    with pytest.raises(ValueError, match="shape"):
        with head_mask(model, {"layers.0.self_attn": torch.ones(3)}):
            pass


def test_importance_is_the_gradient_of_the_mask():
    model = tiny("decoder").double()
    batches = [ids(2, 8), ids(2, 8)]
    scores = head_importance(model, batches)
    name, h, eps = "layers.1.self_attn", 2, 1e-5

    def total_loss(value):
        mask = ones_mask(model)
        mask = {n: m.double() for n, m in mask.items()}
        mask[name][h] = value
        with torch.no_grad(), head_mask(model, mask):
            return sum(float(lm_loss(model, b)) for b in batches)

    numeric = (total_loss(1 + eps) - total_loss(1 - eps)) / (2 * eps)
    assert scores[name].shape == (4,)
    assert math.isclose(float(scores[name][h]), abs(numeric), rel_tol=1e-4, abs_tol=1e-9)
    normed = head_importance(model, batches, normalize=True)
    torch.testing.assert_close(normed[name].norm(), torch.tensor(1.0, dtype=normed[name].dtype))


def test_entropy_of_a_uniform_head_is_log_n():
    model = tiny("encoder")
    with torch.no_grad():
        q = model.layers[0].self_attn.qkv_proj
        q.weight[:32].zero_()  # the q rows of the fused q | k | v (d_model 32)
        q.bias[:32].zero_()
    ent = attention_entropy(model, [(ids(2, 6),)])
    torch.testing.assert_close(ent["layers.0.self_attn"], torch.full((4,), math.log(6)))
    assert (ent["layers.1.self_attn"] < math.log(6) + 1e-5).all()


def test_pruning_curve_ends(tmp_path):
    model = tiny("decoder")
    batches = [ids(2, 8)]
    scores = head_importance(model, batches)
    curve = pruning_curve(model, batches, scores)
    assert [k for k, _ in curve] == list(range(9))
    with torch.no_grad():
        assert math.isclose(curve[0][1], float(lm_loss(model, batches[0])), rel_tol=1e-6)
        zero = {n: torch.zeros_like(m) for n, m in ones_mask(model).items()}
        with head_mask(model, zero):
            assert math.isclose(curve[-1][1], float(lm_loss(model, batches[0])), rel_tol=1e-6)
    path = plot_pruning_curve({"importance": curve}, str(tmp_path / "curve.png"))
    assert open(path, "rb").read(4) == b"\x89PNG"


def _entropy_of_rows_alone(model, rows: list[tuple]) -> dict[str, torch.Tensor]:
    """Mean over every query of every row, each run alone (no padding): -sum_k w log w."""
    from attnlab.inspect.attention_maps import capture_attention

    sums, count = {}, {}
    with torch.no_grad():
        for row in rows:
            with capture_attention(model) as rec:
                model(*row)
            for name in rec.names():
                (w,) = rec.calls(name)  # (1, H, Tq, Tk)
                sums[name] = sums.get(name, 0) - torch.special.xlogy(w, w).sum(-1).sum((0, 2))  # 0 log 0 = 0
                count[name] = count.get(name, 0) + w.shape[2]
    return {n: sums[n] / count[n] for n in sums}


@pytest.mark.parametrize("arch, side", [("encoder", "right"), ("decoder", "right"), ("decoder", "left"),
                                        ("encoder_decoder", "right")])
def test_entropy_of_a_padded_batch_equals_its_rows_alone(arch, side):
    torch.manual_seed(0)
    model = tiny(arch)
    lengths, T = [6, 3, 4], 6
    x = ids(3, T)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "right":
            mask[b, :n] = 1
        else:
            mask[b, T - n:] = 1
    real = [x[b][mask[b].bool()][None] for b in range(3)]
    if arch == "encoder_decoder":  # padded sources; the targets (the cross-attention's queries) are whole
        tgt = ids(3, 4)
        padded = attention_entropy(model, [(x, tgt, mask)])
        alone = _entropy_of_rows_alone(model, [(real[b], tgt[b:b + 1]) for b in range(3)])
    else:
        padded = attention_entropy(model, [(x, mask)])
        alone = _entropy_of_rows_alone(model, [(r,) for r in real])
    assert sorted(padded) == sorted(alone)
    for name in alone:
        torch.testing.assert_close(padded[name], alone[name], atol=1e-5, rtol=1e-5, msg=name)
