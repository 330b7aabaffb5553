"""Activation patching: a run patched into itself is unchanged on every grid; copying what differs
gives the clean metric exactly and copying what does not gives the corrupted one exactly; under
grouped-query attention a kv head moves exactly its group's query heads; sparse kernels,
cross-attention and the recurrent models' per-step alignment are patched at the right piece.
Models run in float64 so that "exactly" leaves no room for rounding to hide a wrong piece."""

import math

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.hooks import hooks, run_with_cache
from attnlab.inspect.patching import (activation_patching, components, logit_diff, normalised_score, replacing,
                                      target_logprob, target_prob)
from tests.models.helpers import V

D, H, L = 32, 4, 2


def _model(arch="decoder", kernel="auto", options=None, layers=L, **kw):
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=D, num_layers=layers, num_heads=H, d_ff=kw.pop("d_ff", 64),
                      dropout=0.0,
                      position=kw.pop("position", {"scheme": "learned", "max_len": 64}),
                      attention={"kernel": kernel, "kernel_options": options or {}, **kw.pop("attention", {})}, **kw)
    torch.manual_seed(0)
    model = build_model(cfg).eval().double()
    with torch.no_grad():  # weights far from the small init, so that every piece moves the logits visibly
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def _rnn(attention):
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16, dropout=0.0,
                      rnn={"attention": attention, "hidden_size": 16, "bidirectional": attention != "dot"})
    torch.manual_seed(0)
    return build_model(cfg).eval().double()


def _pair(B=2, T=10, where=(4,), seed=1):
    """Clean ids and a corrupted copy that differs exactly at the positions `where`."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, V, (B, T), generator=g)
    corrupted = clean.clone()
    for p in where:
        shift = torch.randint(1, V - 1, (B,), generator=g)  # ids 1..V-1 shifted by 1..V-2 around that ring
        corrupted[:, p] = 1 + (clean[:, p] - 1 + shift) % (V - 1)
    assert bool((corrupted[:, list(where)] != clean[:, list(where)]).all())
    return clean, corrupted


METRIC = logit_diff(3, 5)

# the decoder-like cases: model, the positional inputs of a clean and a corrupted run
CASES = {
    "decoder-sdpa": lambda: _model(),
    "decoder-gqa": lambda: _model(attention={"num_kv_heads": 2}),
    "decoder-mqa": lambda: _model(attention={"num_kv_heads": 1}),
    "decoder-sliding_window": lambda: _model(kernel="sliding_window", options={"window": 3}),
    "decoder-bigbird": lambda: _model(kernel="bigbird", options={"block_size": 2, "random_blocks": 1}),
    "encoder": lambda: _model(arch="encoder", head="mlm"),
}
GRIDS = [("layers.*.hook_resid_pre", "position"), ("layers.*.hook_resid_mid", "position"),
         ("layers.*.hook_resid_post", "position"), ("layers.*.hook_attn_out", "position"),
         ("layers.*.hook_ffn_out", "position"), ("layers.*.self_attn.hook_z", "head"),
         ("layers.*.self_attn.hook_q", "head"), ("layers.*.self_attn.hook_k", "head"),
         ("layers.*.self_attn.hook_v", "head"), ("layers.*.self_attn.hook_pattern", "head"),
         ("layers.*.self_attn.hook_z", "position")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_patching_a_run_into_itself_changes_nothing(case):
    model = CASES[case]()
    clean, _ = _pair()
    with torch.no_grad():
        reference = float(METRIC(model(clean)))
    for points, by in GRIDS:
        result = activation_patching(model, clean, clean, METRIC, points, by=by)
        assert result.values.shape == (L, {"position": 10, "head": result.values.shape[1]}[by])
        torch.testing.assert_close(result.values, torch.full_like(result.values, reference), rtol=0, atol=1e-8)
        assert result.clean == result.corrupted == reference


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_first_stream_at_the_changed_position_carries_all_of_the_difference(case, direction):
    """Inputs that differ at position 4 only: layer 0's incoming stream differs there only, so
    patching it gives the source run's metric exactly, and any other position the base run's."""
    model = CASES[case]()
    clean, corrupted = _pair(where=(4,))
    result = activation_patching(model, clean, corrupted, METRIC, "layers.0.hook_resid_pre", direction=direction)
    source, base = (result.clean, result.corrupted) if direction == "denoise" else (result.corrupted, result.clean)
    assert abs(result.clean - result.corrupted) > 1e-6  # there is something to restore
    assert result.values[0, 4] == source
    assert all(result.values[0, p] == base for p in range(10) if p != 4)
    whole = activation_patching(model, clean, corrupted, METRIC, "layers.0.hook_resid_pre", by="all",
                                direction=direction)
    assert whole.values.item() == source and whole.columns == ["all"]
    score = result.normalised()[0]  # 1 = the clean metric: under noising, the other positions
    assert (score[4], score[0]) == ((1, 0) if direction == "denoise" else (0, 1))


def test_a_causal_decoder_is_not_moved_by_patching_after_the_read_position():
    """Position 4 differs; the metric reads position 6: patching any layer at 7.. changes nothing,
    at 4 the first layer restores everything; and under the noising direction the same holds."""
    model = _model()
    clean, corrupted = _pair(where=(4,))
    metric = logit_diff(3, 5, position=6)
    for direction in ("denoise", "noise"):
        result = activation_patching(model, clean, corrupted, metric, "layers.*.hook_resid_post", direction=direction)
        base = result.corrupted if direction == "denoise" else result.clean
        assert (result.values[:, 7:] == base).all() and (result.values[:, :4] == base).all()
        assert (result.values[:, 4:7] != base).any()


def test_gqa_a_kv_head_moves_exactly_the_query_heads_of_its_group():
    """kv head g of G is read by query heads g*H/G .. (g+1)*H/G - 1: patching its keys changes those
    heads' patterns and outputs and no other's, and the column labels say which they are."""
    for G in (2, 1):
        model = _model(attention={"num_kv_heads": G})
        clean, corrupted = _pair(where=(2, 5))
        name = "layers.0.self_attn.hook_k"
        _, src = run_with_cache(model, clean, names=name)
        _, base = run_with_cache(model, corrupted, names="layers.0.self_attn.*")
        axis, pieces = components(model, name, base.calls(name), "head")
        assert axis == ("kv_head" if G < H else "head") and len(pieces) == G
        for g, (label, select) in enumerate(pieces):
            first, last = label[label.index("q ") + 2:-1].split("-") if "-" in label else (label[-2], label[-2])
            named = set(range(int(first), int(last) + 1))
            with hooks(model, {name: replacing(select, lambda k, a: src.calls(name)[k])}):
                _, patched = run_with_cache(model, corrupted, names="layers.0.self_attn.*")
            for point in ("hook_pattern", "hook_z"):
                full = f"layers.0.self_attn.{point}"
                moved = {h for h in range(H) if not torch.equal(patched[full][:, h], base[full][:, h])}
                assert moved == named == {h for h in range(H) if h // (H // G) == g}
        result = activation_patching(model, clean, corrupted, METRIC, "layers.*.self_attn.hook_v", by="head")
        assert result.axis == ("kv_head" if G < H else "head") and result.values.shape == (L, G)


@pytest.mark.parametrize("kernel,options", [("sliding_window", {"window": 3}),
                                            ("bigbird", {"block_size": 2, "random_blocks": 1})])
def test_a_patched_pattern_under_a_sparse_kernel_is_what_the_head_reads_with(kernel, options):
    """Patching head h's pattern from the clean run: head h's output is the clean pattern times the
    corrupted values (checked by hand), every other head's output is the corrupted one."""
    model = _model(kernel=kernel, options=options)
    clean, corrupted = _pair(where=(3, 6))
    name, z = "layers.1.self_attn.hook_pattern", "layers.1.self_attn.hook_z"
    _, src = run_with_cache(model, clean, names=name)
    _, base = run_with_cache(model, corrupted, names=[name, "layers.1.self_attn.hook_v", z])
    _, pieces = components(model, name, base.calls(name), "head")
    for h, (_, select) in enumerate(pieces):
        with hooks(model, {name: replacing(select, lambda k, a: src.calls(name)[k])}):
            _, patched = run_with_cache(model, corrupted, names=z)
        expected = src[name][:, h] @ base["layers.1.self_attn.hook_v"][:, h]
        torch.testing.assert_close(patched[z][:, h], expected, rtol=1e-10, atol=1e-12)
        others = [o for o in range(H) if o != h]
        # the edited pattern's output is recomputed (pattern times values) for every head; the side
        # pattern of a fused/sparse kernel agrees with its output to ~1e-7 even in float64
        torch.testing.assert_close(patched[z][:, others], base[z][:, others], rtol=0, atol=1e-6)
        assert not torch.allclose(patched[z][:, h], base[z][:, h])
    result = activation_patching(model, clean, corrupted, METRIC, "layers.*.self_attn.hook_pattern", by="head")
    assert result.values.shape == (L, H) and result.columns == [f"h{h}" for h in range(H)]


def test_encoder_decoder_source_positions_and_cross_attention():
    """A corrupted source: the encoder's first stream at the changed position restores the clean
    metric exactly; a one-layer decoder reads the source only through its cross-attention, so
    its cross-attention output (any head grid of it patched whole) does too."""
    model = _model(arch="encoder_decoder", layers=1, position={"scheme": "sinusoidal", "max_len": 64})
    src, bad_src = _pair(T=9, where=(5,))
    tgt = _pair(T=6, seed=2)[0]
    clean, corrupted = (src, tgt), (bad_src, tgt)
    enc = activation_patching(model, clean, corrupted, METRIC, "encoder.layers.0.hook_resid_pre")
    assert enc.values.shape == (1, 9) and enc.values[0, 5] == enc.clean
    assert (enc.values[0, [0, 1, 2, 3, 4, 6, 7, 8]] == enc.corrupted).all()
    for point in ("decoder.layers.0.hook_cross_out", "decoder.layers.0.cross_attn.hook_z"):
        whole = activation_patching(model, clean, corrupted, METRIC, point, by="all")
        torch.testing.assert_close(whole.values.item(), whole.clean, rtol=0, atol=1e-10)
    # the decoder's self-attention sees the same target in both runs: patching it does nothing
    same = activation_patching(model, clean, corrupted, METRIC, "decoder.layers.0.self_attn.hook_z", by="head")
    torch.testing.assert_close(same.values, torch.full_like(same.values, same.corrupted), rtol=0, atol=1e-10)
    cross = activation_patching(model, clean, corrupted, METRIC, "decoder.layers.0.cross_attn.hook_pattern", by="head")
    assert cross.values.shape == (1, H) and (cross.values != cross.corrupted).any()
    selfp = activation_patching(model, clean, clean, METRIC, "decoder.layers.*.cross_attn.hook_pattern", by="head")
    torch.testing.assert_close(selfp.values, torch.full_like(selfp.values, selfp.clean), rtol=0, atol=1e-8)
    with pytest.raises(ValueError, match="different numbers of positions"):
        activation_patching(model, clean, corrupted, METRIC, "*layers.0.hook_resid_pre")


@pytest.mark.parametrize("attention", ["additive", "general"])
def test_rnn_memory_and_alignment_per_target_position(attention):
    """Bahdanau's alignment is met once per target step, Luong's once: either way, patching the
    alignment at target position t changes the logits at t.. and none before it; the memory (all
    the decoder knows of the source) patched whole restores the clean logits."""
    model = _rnn(attention)
    src, bad_src = _pair(T=7, where=(3,))
    tgt = _pair(T=5, seed=3)[0]
    clean, corrupted = (src, tgt), (bad_src, tgt)
    seen = []

    def metric(logits):
        seen.append(logits)
        return logits[:, -1, 3].mean()

    memory = activation_patching(model, clean, clean, metric, "hook_memory")
    assert memory.values.shape == (1, 7) and (memory.values == memory.clean).all()
    whole = activation_patching(model, clean, corrupted, metric, "hook_memory", by="all")
    assert whole.values.item() == whole.clean
    seen.clear()
    result = activation_patching(model, clean, corrupted, metric, "attention.hook_pattern")
    clean_logits, corrupted_logits, patched = seen[0], seen[1], seen[2:]
    assert result.values.shape == (1, 5) and len(patched) == 5
    for t, logits in enumerate(patched):
        assert torch.equal(logits[:, :t], corrupted_logits[:, :t])
        assert (logits[:, t] - corrupted_logits[:, t]).abs().max() > 1e-9  # float64: far above rounding
    with pytest.raises(ValueError, match="no head axis"):
        activation_patching(model, clean, corrupted, metric, "hook_memory", by="head")


def test_metrics_against_hand_computations():
    logits = torch.randn(3, 4, 7, dtype=torch.float64)
    torch.testing.assert_close(logit_diff(2, 5)(logits), (logits[:, -1, 2] - logits[:, -1, 5]).mean())
    torch.testing.assert_close(logit_diff([1, 2, 3], 0, position=1)(logits),
                               (logits[[0, 1, 2], 1, [1, 2, 3]] - logits[:, 1, 0]).mean())
    logp = target_logprob(4, position=0)(logits)
    torch.testing.assert_close(logp, torch.stack([logits[b, 0].exp()[4].log() - logits[b, 0].exp().sum().log()
                                                  for b in range(3)]).mean())
    torch.testing.assert_close(target_prob(4, position=0)(logits), torch.log_softmax(logits[:, 0], -1)[:, 4].exp().mean())
    assert normalised_score(2.0, 3.0, 1.0).item() == 0.5 and math.isnan(normalised_score(1.0, 2.0, 2.0).item())
    with pytest.raises(ValueError, match="correct must be one token id or one per batch row"):
        logit_diff([1, 2], 0)(logits)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        target_prob(7)(logits)
    with pytest.raises(ValueError, match=r"logits \(B, T, V\)"):
        target_prob(1)(logits[:, 0])


def test_bad_requests_are_named():
    model = _model()
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match=r"equal shapes .* clean input 0 is \(2, 10\), corrupted input 0 is \(2, 9\)"):
        activation_patching(model, clean, corrupted[:, :9], METRIC, "layers.*.hook_resid_pre")
    with pytest.raises(ValueError, match="direction must be one of denoise, noise"):
        activation_patching(model, clean, corrupted, METRIC, "layers.*.hook_resid_pre", direction="up")
    with pytest.raises(ValueError, match="by must be one of position, head, all"):
        activation_patching(model, clean, corrupted, METRIC, "layers.*.hook_resid_pre", by="layer")
    with pytest.raises(ValueError, match="names no hook point"):
        activation_patching(model, clean, corrupted, METRIC, "layers.*.hook_nothing")
    with pytest.raises(ValueError, match="one number"):
        activation_patching(model, clean, corrupted, lambda out: out.sum(-1), "layers.0.hook_resid_pre")
