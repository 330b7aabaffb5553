"""benchmarks/bench_rnn_threads.py: it times the RNN-vs-Transformer study's own models (their
configurations read from the study, not copied) and reports a median and a speed-up per model."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_times_the_studys_models_at_each_thread_count(tmp_path):
    out = tmp_path / "rnn.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_rnn_threads.py"), "--rounds", "2", "--steps", "1",
                    "--batch", "2", "--src-len", "5", "--tgt-len", "6", "--vocab", "300", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    assert set(result["step_seconds"]) == {"transformer", "lstm+luong", "lstm+attention"}
    for name, by_threads in result["rounds"].items():
        assert set(by_threads) == {"1", "2"} and all(len(v) == 2 and min(v) > 0 for v in by_threads.values())
        assert result["speedup"][name] == result["step_seconds"][name]["1"] / result["step_seconds"][name]["2"]


def test_the_models_are_the_studys():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_rnn_threads as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    study = bench.study_models()
    for name in bench.NAMES:
        model = bench.build(name, 300)
        rnn = study[name]["model"].get("rnn")
        if rnn:  # the recurrent models: the study's cell and attention
            assert (model.config.rnn.cell, model.config.rnn.attention) == (rnn["cell"], rnn["attention"])
        else:
            assert (model.config.arch, model.config.num_layers, model.config.d_model) == ("encoder_decoder", 3, 256)
