"""examples/studies/attention_cost/run.py: the peak-memory reading against known allocations, the
pattern counts against closed forms and against `attnlab inspect cost`, the crossover; and,
slow, the study's claim at a reduced budget: dense attention's time grows faster than linearly
in T (x3 and more per doubling at long T) while sliding_window's grows about linearly, as the
FLOP counts say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.studies import STUDIES, load_study

SCRIPT = STUDIES / "attention_cost" / "run.py"


def study():
    return load_study("attention_cost")


# in a process of its own: configure_malloc changes how the whole process allocates
_PEAKS = f"""
import importlib.util, json, torch
spec = importlib.util.spec_from_file_location("s", {str(SCRIPT)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
assert m.configure_malloc()
MiB = 2 ** 18  # float32 elements per MiB

def one_after_another():
    for _ in range(3):
        t = torch.ones(16 * MiB)
        del t

def together():
    held = [torch.ones(16 * MiB) for _ in range(3)]

def temporary():
    a = torch.ones(16 * MiB)
    return (a * 2).sum()  # a, and a temporary as large for a * 2

peaks = {{}}
for name, fn in [("alloc_32", lambda: torch.ones(32 * MiB)), ("one_after_another", one_after_another),
                 ("together", together), ("temporary", temporary), ("nothing", lambda: None)]:
    fn()  # warm up, as the study does: the first call of an operator also pages in its code
    peaks[name] = m.peak_bytes(fn) / 2 ** 20
print(json.dumps(peaks))
"""


def test_peak_memory_reads_what_the_step_holds_at_its_worst():
    out = subprocess.run([sys.executable, "-c", _PEAKS], capture_output=True, text=True, check=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    within = dict(abs=0.5)  # MiB: a few pages of the interpreter's own come and go
    assert peaks["alloc_32"] == pytest.approx(32, **within)
    assert peaks["one_after_another"] == pytest.approx(16, **within)  # freed tensors leave: a peak, not a sum
    assert peaks["together"] == pytest.approx(48, **within)
    assert peaks["temporary"] == pytest.approx(32, **within)
    assert peaks["nothing"] == pytest.approx(0, **within)


def _closed_form_window_pairs(T: int, w: int) -> int:
    return sum(min(T - 1, i + w) - max(0, i - w) + 1 for i in range(T))


@pytest.mark.parametrize("T", [64, 300, 1024])
def test_pattern_pairs_against_closed_forms(T):
    m = study()
    window = m.KERNEL_OPTIONS["sliding_window"]["window"]
    assert m.pattern_pairs("sliding_window", T) == _closed_form_window_pairs(T, window)
    b = m.KERNEL_OPTIONS["local_block"]["block_size"]
    assert m.pattern_pairs("local_block", T) == sum(min(b, T - s) ** 2 for s in range(0, T, b))
    assert m.pattern_pairs("sdpa", T) == m.pattern_pairs("eager", T) == T * T
    assert m.pattern_pairs("linformer", T) == T * min(256, T)


def test_the_dense_pattern_count_is_what_inspect_cost_counts():
    m = study()
    cfg = m.layer_config(256, 4, 1024)
    for T in (64, 1000, 4096):
        cost = m.inspect_cost(cfg, T, "sdpa")
        assert m.pattern_flops("sdpa", T, cfg) == cost["attention_flops"]
        assert cost["ffn_flops"] == m.lstm_flops(T, 256)  # F = 4D: 4 T D F = 16 T D^2, an LSTM's count
    # cost_table's crossover: 4 T^2 D = 8 T D^2 + 4 T D F at T* = 2D + F
    assert m.crossover_seq_len(cfg) == pytest.approx(2 * 256 + 1024)


def test_crossover_is_the_last_rise_interpolated_in_log_log():
    m = study()
    lengths = [64, 128, 256, 512, 1024, 2048]
    quadratic, linear = [T * T for T in lengths], [300.0 * T for T in lengths]
    assert m.crossover(lengths, quadratic, linear) == pytest.approx(300.0)  # a power law: exact
    noisy = list(linear)
    noisy[0] = 2 * quadratic[0]  # a noisy first point above the other curve: passed over
    assert m.crossover(lengths, [max(q, n) if i == 0 else q for i, (q, n) in enumerate(zip(quadratic, noisy))],
                       linear) == pytest.approx(300.0)
    assert m.crossover(lengths, linear, quadratic) is None  # ends below
    assert m.crossover(lengths, [10 * q for q in quadratic], quadratic) is None  # above from the start


def test_a_curve_stops_at_its_time_cap():
    m = study()
    torch.set_num_threads(1)
    lines = []
    got = m.sweep("ffn", [64, 128, 256], d_model=32, num_heads=2, d_ff=64, repeats=1, time_cap=1e-9,
                  mem_cap_mib=1e9, memory=False, log=lines.append)
    assert [p["T"] for p in got["points"]] == [64] and "passed the time cap at T=64" in got["stopped"]
    assert len(lines) == 1 and len(got["points"][0]["times"]) == 1


@pytest.mark.slow
def test_dense_attention_is_superlinear_and_sliding_window_linear():
    m = study()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # one 64-wide head: the T^2 terms dominate from T ~ 2D + F = 384 on; T and 4T, so that one
        # noisy timing moves the per-doubling ratio (the square root) only half as much
        D, H, F, lengths = 64, 1, 256, [1024, 4096]
        cfg = m.layer_config(D, H, F)
        per_doubling = {}
        for name in ("sdpa", "sliding_window"):
            module = m.build_curve(name, D, H, F, max(lengths))
            # the fastest of 5: other processes on a shared machine only ever add time
            best = [min(m.measure(module, T, D, repeats=5)["times"]) for T in lengths]
            per_doubling[name] = (best[1] / best[0]) ** 0.5
        assert per_doubling["sdpa"] > 3, per_doubling
        assert 1.5 < per_doubling["sliding_window"] < 2.6, per_doubling
        # the counts say the same: inspect cost's dense prediction ~x4 per doubling, the window's pattern ~x2
        dense = [m.inspect_cost(cfg, T, "sdpa")["attention_flops"] for T in lengths]
        window = [m.pattern_flops("sliding_window", T, cfg) for T in lengths]
        assert (dense[1] / dense[0]) ** 0.5 > 3.5
        assert 1.9 < (window[1] / window[0]) ** 0.5 < 2.1
        # memory: the eager kernel holds the T x T weights (x4 per doubling), sdpa does not (x2)
        shape = dict(d_model=D, num_heads=H, d_ff=F, time_cap=60.0, mem_cap_mib=4096.0)
        eager = m.memory_of("eager", [1024, 2048], **shape)["peaks"]
        fused = m.memory_of("sdpa", [1024, 2048], **shape)["peaks"]
        assert 3.5 < eager[2048] / eager[1024] < 4.5, eager
        assert 1.5 < fused[2048] / fused[1024] < 2.5, fused
        weights = 2048 * 2048 * 4  # one head's T x T float32 weights
        assert eager[2048] > 2 * weights > fused[2048], (eager, fused)  # saved for backward, and their gradient
    finally:
        torch.set_num_threads(threads)
