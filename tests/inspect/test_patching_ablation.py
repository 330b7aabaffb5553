"""Ablation and path patching against computations done another way: zero-ablating a head's z is
zero-ablating its result; mean ablation over a one-row reference and resample ablation from a
one-row batch are patching from that row; path patching to the final stream is the sender's
direct effect computed by hand from the heads' results; a receiver before the sender gets nothing."""

import pytest
import torch

from attnlab.inspect.ablation import ablate
from attnlab.inspect.hooks import hooks, run_with_cache
from attnlab.inspect.path_patching import path_patching
from attnlab.inspect.patching import activation_patching, logit_diff
from tests.inspect.test_patching import H, L, METRIC, _model, _pair


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_zero_ablating_a_heads_z_is_zero_ablating_its_result(kv_heads):
    model = _model(attention={"num_kv_heads": kv_heads})
    ids, _ = _pair()
    z = ablate(model, ids, METRIC, "layers.*.self_attn.hook_z", by="head")
    result = ablate(model, ids, METRIC, "layers.*.self_attn.hook_result", by="head")
    assert z.values.shape == (L, H) and z.method == "zero"
    torch.testing.assert_close(z.values, result.values, rtol=0, atol=1e-10)
    assert (z.effect().abs() > 1e-6).all()  # every head does something: the identity is not 0 == 0
    with torch.no_grad():
        assert z.baseline == float(METRIC(model(ids)))


def test_mean_and_resample_from_one_row_are_patching_from_that_row():
    model = _model()
    ids, _ = _pair(B=2)
    other = _pair(B=1, seed=7)[0]
    noised = activation_patching(model, ids, other.expand(2, -1), METRIC, "layers.*.hook_resid_mid",
                                 direction="noise")
    mean = ablate(model, ids, METRIC, "layers.*.hook_resid_mid", by="position", method="mean", reference=other)
    resample = ablate(model, ids, METRIC, "layers.*.hook_resid_mid", by="position", method="resample",
                      reference=other)
    torch.testing.assert_close(mean.values, noised.values, rtol=0, atol=1e-12)
    torch.testing.assert_close(resample.values, noised.values, rtol=0, atol=1e-12)
    assert mean.baseline == noised.clean


def test_mean_ablation_uses_the_per_position_mean_of_the_reference():
    model = _model()
    ids, _ = _pair(B=2)
    reference = _pair(B=3, seed=5)[0]
    _, cache = run_with_cache(model, reference, names="hook_embed")
    mean = cache["hook_embed"].mean(0, keepdim=True)  # (1, T, D)
    with torch.no_grad(), hooks(model, {"hook_embed": lambda a, n: mean.expand_as(a)}):
        by_hand = float(METRIC(model(ids)))
    result = ablate(model, ids, METRIC, "hook_embed", by="all", method="mean", reference=reference)
    assert result.values.item() == by_hand
    own = ablate(model, ids[:1], METRIC, "hook_embed", by="position", method="mean")  # the mean of one row: itself
    assert (own.effect() == 0).all()


def test_resample_draws_reference_rows_with_the_generator():
    model = _model()
    ids, _ = _pair(B=2)
    reference = _pair(B=5, seed=4)[0]
    runs = [ablate(model, ids, METRIC, "layers.*.self_attn.hook_z", by="head", method="resample", reference=reference,
                   generator=torch.Generator().manual_seed(s)).values for s in (3, 3, 4)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_ablation_errors_name_the_argument():
    model = _model()
    ids, _ = _pair()
    with pytest.raises(ValueError, match="method must be one of zero, mean, resample"):
        ablate(model, ids, METRIC, "hook_embed", method="noise")
    with pytest.raises(ValueError, match="needs reference="):
        ablate(model, ids, METRIC, "hook_embed", method="resample")
    with pytest.raises(ValueError, match=r"reference input 0 is \(2, 9\)"):
        ablate(model, ids, METRIC, "hook_embed", method="mean", reference=ids[:, :9])


def _direct_effects(model, clean, corrupted, metric, at):
    """By hand: the stream `at` of the clean run plus (corrupted - clean) result of one head, per head."""
    _, c = run_with_cache(model, clean, names="*hook_result")
    _, k = run_with_cache(model, corrupted, names="*hook_result")
    out = torch.full((L, H), float("nan"), dtype=torch.float64)
    for layer in range(L):
        name = f"layers.{layer}.self_attn.hook_result"
        for h in range(H):
            delta = k[name][:, h] - c[name][:, h]
            with torch.no_grad(), hooks(model, {at: lambda a, n: a + delta}):
                out[layer, h] = float(metric(model(clean)))
    return out


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_path_patching_to_the_final_stream_is_the_direct_effect(kv_heads):
    """Every other head frozen and the feed-forward blocks frozen: the final stream changes by the
    sender's result alone, which the hand computation adds to the clean run's last stream."""
    model = _model(attention={"num_kv_heads": kv_heads}, norm_placement="pre")  # an additive residual stream
    clean, corrupted = _pair(where=(2, 6, 9))
    metric = logit_diff(3, 5)
    result = path_patching(model, clean, corrupted, metric, f"layers.{L - 1}.hook_resid_post", freeze_ffn=True)
    expected = _direct_effects(model, clean, corrupted, metric, f"layers.{L - 1}.hook_resid_post")
    assert result.values.shape == (L, H) and result.rows == [f"layers.{i}.self_attn" for i in range(L)]
    torch.testing.assert_close(result.values, expected, rtol=0, atol=1e-9)
    assert (result.values - result.clean).abs().max() > 1e-5
    # the same through hook_final (after the final norm): the same paths, so the same numbers
    final = path_patching(model, clean, corrupted, metric, "hook_final", freeze_ffn=True)
    torch.testing.assert_close(final.values, result.values, rtol=0, atol=1e-9)


def test_path_patching_on_an_attention_only_model():
    """No feed-forward blocks (d_ff=0): nothing to freeze, and every path to the output is direct."""
    model = _model(d_ff=0, norm_placement="pre")
    clean, corrupted = _pair(where=(2, 6, 9))
    result = path_patching(model, clean, corrupted, METRIC, "hook_final")
    frozen = path_patching(model, clean, corrupted, METRIC, "hook_final", freeze_ffn=True)
    expected = _direct_effects(model, clean, corrupted, METRIC, f"layers.{L - 1}.hook_resid_post")
    torch.testing.assert_close(result.values, expected, rtol=0, atol=1e-9)
    assert torch.equal(result.values, frozen.values)


def test_path_patching_keeps_paths_through_feed_forward_blocks_unless_frozen():
    """A last-layer sender reaches the output through the stream and the last feed-forward block:
    with the block recomputed, patching at resid_mid by hand gives the same numbers."""
    model = _model(norm_placement="pre")
    clean, corrupted = _pair(where=(2, 6, 9))
    result = path_patching(model, clean, corrupted, METRIC, f"layers.{L - 1}.hook_resid_post",
                           senders=[(f"layers.{L - 1}.self_attn", h) for h in range(H)])
    expected = _direct_effects(model, clean, corrupted, METRIC, f"layers.{L - 1}.hook_resid_mid")
    torch.testing.assert_close(result.values[L - 1], expected[L - 1], rtol=0, atol=1e-9)
    assert torch.isnan(result.values[: L - 1]).all()  # senders not asked for
    frozen = path_patching(model, clean, corrupted, METRIC, f"layers.{L - 1}.hook_resid_post",
                           senders=[(f"layers.{L - 1}.self_attn", 0)], freeze_ffn=True)
    assert (frozen.values[L - 1, 0] - result.values[L - 1, 0]).abs() > 1e-9


def test_path_patching_through_later_queries_only():
    """Receivers: layer 1's queries of one head. Layer-1 senders come after them (no path): the
    clean metric exactly; a layer-0 sender moves the metric through that head's query only."""
    model = _model()
    clean, corrupted = _pair(where=(2, 6, 9))
    result = path_patching(model, clean, corrupted, METRIC, {"layers.1.self_attn.hook_q": [2]})
    assert (result.values[1] == result.clean).all()
    assert (result.values[0] - result.clean).abs().max() > 1e-6
    wider = path_patching(model, clean, corrupted, METRIC, {"layers.1.self_attn.hook_q": None})
    assert not torch.equal(wider.values[0], result.values[0])
    assert result.direction == "path" and result.notes["receivers"] == {"layers.1.self_attn.hook_q": [2]}


def test_path_patching_errors():
    model = _model()
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match="sender head 7 of layers.0.self_attn"):
        path_patching(model, clean, corrupted, METRIC, "hook_final", senders=[("layers.0.self_attn", 7)])
    with pytest.raises(ValueError, match="not an attention with hook_z"):
        path_patching(model, clean, corrupted, METRIC, "hook_final", senders=[("layers.0.ffn", 0)])
    with pytest.raises(ValueError, match="names no hook point"):
        path_patching(model, clean, corrupted, METRIC, "layers.9.hook_resid_post")
    with pytest.raises(ValueError, match="equal shapes"):
        path_patching(model, clean, corrupted[:1], METRIC, "hook_final")
