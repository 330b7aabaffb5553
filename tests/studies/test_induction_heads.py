"""examples/studies/induction_heads/run.py: its data, its scores against hand-built attention
patterns, its ablation and patching against the same edits made on the weights or by another route,
and (slow) that the trained model forms an induction head that does the copying."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from tests.studies import load_study

V, MIN, MAX = 20, 3, 6


@pytest.fixture(scope="module")
def study():
    return load_study("induction_heads")


def rows_of(study, B=16, seed=0):
    return study.sample_rows(torch.Generator().manual_seed(seed), B, V, MIN, MAX)


def test_rows_repeat_a_segment_of_distinct_tokens_and_the_corrupted_ones_differ_only_in_the_copy(study):
    clean, corrupted = rows_of(study)
    assert clean.ids.shape == (16, 1 + 2 * MAX) and torch.equal(clean.n, corrupted.n)
    assert len(set(clean.n.tolist())) > 1 and MIN <= clean.n.min() and clean.n.max() <= MAX
    assert (clean.ids[:, 0] == study.BOS).all() and (clean.ids[:, 1:] > 0).all() and (clean.ids < V).all()
    for b, n in enumerate(clean.n.tolist()):
        first, second = clean.ids[b, 1:n + 1], clean.ids[b, n + 1:2 * n + 1]
        assert torch.equal(first, second) and len(set(first.tolist())) == n
        assert torch.equal(corrupted.ids[b, :n + 1], clean.ids[b, :n + 1])
        assert torch.equal(corrupted.ids[b, 2 * n + 1:], clean.ids[b, 2 * n + 1:])
    changed = [not torch.equal(corrupted.ids[b, n + 1:2 * n + 1], clean.ids[b, n + 1:2 * n + 1])
               for b, n in enumerate(clean.n.tolist())]
    assert all(changed)
    again, _ = rows_of(study)
    assert torch.equal(again.ids, clean.ids)


def test_target_masks_pick_r2_to_rn_of_each_copy(study):
    first, repeat = study.target_masks(torch.tensor([3]), 9)  # [BOS r1 r2 r3 r1 r2 r3 f f]: t predicts t + 1
    assert first[0].nonzero().flatten().tolist() == [1, 2]  # predicting r2, r3 of the first copy
    assert repeat[0].nonzero().flatten().tolist() == [4, 5]  # predicting r2, r3 of the second copy


def _causal_uniform(B, H, T):
    w = torch.tril(torch.ones(T, T))
    return (w / w.sum(-1, keepdim=True)).expand(B, H, T, T).clone()


def test_head_scores_against_hand_built_patterns(study):
    clean, _ = rows_of(study)
    B, T = clean.ids.shape
    induction = torch.zeros(B, 1, T, T)
    induction[:, :, :, 0] = 1.0  # every query on BOS but the induction queries
    previous = torch.zeros(B, 1, T, T)
    previous[:, :, 0, 0] = 1.0
    previous[:, :, torch.arange(1, T), torch.arange(T - 1)] = 1.0
    for b, n in enumerate(clean.n.tolist()):
        for k in range(1, n):
            induction[b, 0, n + k] = 0.0
            induction[b, 0, n + k, k + 1] = 1.0
    uniform = _causal_uniform(B, 1, T)
    scores = study.head_scores([torch.cat([induction, previous, uniform], 1)], clean)
    assert scores["induction"][0] == pytest.approx([1.0, 0.0, scores["uniform"]])
    positions = sum(2 * n for n in clean.n.tolist())  # t = 1 .. 2n per row; only t = 1 looks back on BOS
    assert scores["previous"][0][:2] == pytest.approx([B / positions, 1.0])
    expected = sum(1 / (n + k + 1) for n in clean.n.tolist() for k in range(1, n)) / sum(n - 1 for n in clean.n.tolist())
    assert scores["uniform"] == pytest.approx(expected)


def test_copy_losses_and_the_icl_score(study):
    clean, _ = rows_of(study)
    B, T = clean.ids.shape
    logits = torch.zeros(B, T, V)  # uniform: ln V everywhere
    flat = study.copy_losses(logits, clean)
    assert flat["first"] == pytest.approx(math.log(V)) and flat["icl"] == pytest.approx(0.0, abs=1e-6)
    _, repeat = study.target_masks(clean.n, T)
    nxt = clean.ids[:, 1:]
    logits[:, :-1][repeat] = 50.0 * torch.nn.functional.one_hot(nxt[repeat], V).float()  # sure of the copy
    sure = study.copy_losses(logits, clean)
    assert sure["repeat"] == pytest.approx(0.0, abs=1e-6) and sure["icl"] == pytest.approx(-math.log(V))


def test_formation_finds_the_jump(study):
    history = [{"step": s, "first": 4.0 + (0.3 if s == 300 else 0.0), "repeat": r, "induction": [[0, 0], [0.05, i]]}
               for s, r, i in [(0, 4.0, 0.05), (100, 3.9, 0.1), (200, 3.8, 0.2), (300, 1.0, 0.7), (400, 0.5, 0.9)]]
    found = study.formation(history)
    assert found["head"] == 1 and found["score_half_step"] == 300 and found["steepest_drop_step"] == 300
    assert found["first_copy_peak_step"] == 300


@pytest.fixture(scope="module")
def tiny(study):
    import attnlab

    args = argparse.Namespace(vocab=V, d_model=16, heads=2, max_len=MAX)
    torch.manual_seed(0)
    return attnlab.build_model(study.model_config(args)).eval()


def test_zero_ablation_equals_zeroing_the_heads_columns_of_out_proj(study, tiny):
    clean, _ = rows_of(study)
    ablated = study._with_heads(tiny, clean.ids, [(1, 0), (0, 1)], lambda z, head, name: 0.0)
    attention = [tiny.layers[1].self_attn, tiny.layers[0].self_attn]
    saved = [a.out_proj.weight.detach().clone() for a in attention]
    try:
        with torch.no_grad():
            attention[0].out_proj.weight[:, :8] = 0  # head 0 of layer 1 (head_dim 8)
            attention[1].out_proj.weight[:, 8:] = 0  # head 1 of layer 0
            reference = tiny(clean.ids)
    finally:
        with torch.no_grad():
            for a, w in zip(attention, saved):
                a.out_proj.weight.copy_(w)
    torch.testing.assert_close(ablated, reference)
    assert not torch.allclose(ablated, tiny(clean.ids).detach())


def test_patching_equals_swapping_the_heads_slice_of_out_projs_input(study, tiny):
    """Reference by another route: a forward pre-hook on layer 1's out_proj that puts head 1's slice
    of its input from the clean run into the corrupted run."""
    clean, corrupted = rows_of(study)
    sets = {"L1H1": [(1, 1)]}
    got = study.patching(tiny, clean, corrupted, sets)
    out_proj = tiny.layers[1].self_attn.out_proj
    seen = {}
    handle = out_proj.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0].detach()))
    with torch.no_grad():
        clean_logits = tiny(clean.ids)
    handle.remove()

    def swap(m, args):
        x = args[0].clone()
        x[..., 8:] = seen["x"][..., 8:]
        return (x,)

    handle = out_proj.register_forward_pre_hook(swap)
    with torch.no_grad():
        patched = tiny(corrupted.ids)
    handle.remove()
    with torch.no_grad():
        corrupt_lp = study.next_token_logprob(tiny(corrupted.ids), clean)
    clean_lp = study.next_token_logprob(clean_logits, clean)
    lp = study.next_token_logprob(patched, clean)
    assert got["clean"] == pytest.approx(clean_lp) and got["corrupted"] == pytest.approx(corrupt_lp)
    assert got["heads"][0]["logprob"] == pytest.approx(lp, abs=1e-6)
    assert got["heads"][0]["recovered"] == pytest.approx((lp - corrupt_lp) / (clean_lp - corrupt_lp), abs=1e-5)


def test_bad_arguments_are_refused(study):
    with pytest.raises(SystemExit):
        study.parse_args(["--min-len", "30", "--max-len", "20"])
    with pytest.raises(SystemExit):
        study.parse_args(["--steps", "0"])


@pytest.mark.slow
def test_quick_run_forms_an_induction_head_that_does_the_copying(tmp_path, study):
    """The study's claim at its --quick budget (900 steps, ~35 CPU-s): a layer-1 head attends from
    r_k's second occurrence to r_{k+1} far above uniform attention, the repeated copy is predicted
    (loss under the first copy's by over 2 nats), the head forms when that loss drops, ablating the
    induction heads undoes it and patching them back recovers it; the last checkpoint is the model."""
    import json
    import os
    import subprocess
    import sys

    import attnlab

    out, ck = tmp_path / "out", tmp_path / "checkpoints"
    subprocess.run([sys.executable, str(study.HERE / "run.py"), "--quick", "--out", str(out), "--checkpoints", str(ck)],
                   check=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    results = json.loads((out / "results_quick.json").read_text())
    last, found = results["history"][-1], results["formation"]
    best = max(last["induction"][1])
    assert best > 0.5 and best > 10 * last["uniform"]
    assert last["icl"] < -2.0
    assert abs(found["score_half_step"] - found["steepest_drop_step"]) <= 100
    ablation = {row["heads"]: row for row in results["ablation"]}
    patched = {row["heads"]: row for row in results["patching"]["heads"]}
    assert ablation["all induction heads"]["zero"] > last["repeat"] + 2.0
    assert patched["all induction heads"]["recovered"] > 0.8
    for name in results["plots"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    model = attnlab.load(ck / f"step{results['setup']['steps']:05d}").eval()
    held_out, _ = study.sample_rows(torch.Generator().manual_seed(10 ** 6), results["setup"]["eval_batch"],
                                    results["setup"]["vocab"], results["setup"]["min_len"], results["setup"]["max_len"])
    again = study.evaluate(model, held_out)
    torch.testing.assert_close(torch.tensor(again["induction"]), torch.tensor(last["induction"]), atol=1e-5, rtol=0)
