"""benchmarks/goals.py: reads each benchmark's JSON as the benchmark writes it, and a goal is met
only when its value is there and on the right side of the target."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def goals():
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import their sibling `machine`
    try:
        spec = importlib.util.spec_from_file_location("goals", BENCHMARKS / "goals.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["goals"] = module  # its dataclass looks its module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("goals", None)
        sys.path.remove(str(BENCHMARKS))


def test_every_goal_names_a_benchmark_that_exists(goals):
    assert {g.bench for g in goals.GOALS} == set(goals.BENCHES)
    for _, argv in goals.BENCHES.values():
        assert (BENCHMARKS / argv[0]).is_file()


def test_last_json_takes_the_final_object_after_log_lines(goals):
    out = 'loading\n{"a": 1}\nstep 3\n' + json.dumps({"b": {"c": [1, 2]}}, indent=1) + "\n"
    assert goals.last_json(out) == {"b": {"c": [1, 2]}}
    assert goals.last_json('{"a": 1}\n') == {"a": 1}
    assert goals.last_json("no json here\n{broken") is None


def test_a_real_long_attention_report(goals):
    """A report bench_long_attention.py wrote (examples/long_inputs/): 2.11 s and 142.1 MiB beyond
    the gradients at 64k tokens on a busy machine."""
    report = json.loads((ROOT / "examples" / "long_inputs" / "bench_long_attention_lse_2threads.json").read_text())
    rows = {g.name: g.check(report) for g in goals.GOALS if g.bench == "long"}
    seconds, memory = rows["sliding window w=256 at 64k, fwd+bwd: seconds"], \
        rows["sliding window w=256 at 64k: MiB beyond q/k/v grads"]
    assert seconds["value"] == pytest.approx(2.107, abs=1e-3) and not seconds["met"]
    assert memory["value"] == pytest.approx(142.1) and memory["met"]


def test_a_missing_value_or_a_failed_benchmark_is_never_met(goals):
    goal = next(g for g in goals.GOALS if g.bench == "seq2seq" and "Marian" in g.name)
    assert goal.check(None) == {"goal": goal.name, "target": ">= 1", "value": None, "met": False}
    assert goal.check({"ratio_vs_nn_transformer": 9.0})["met"] is False  # the Marian ratio is absent
    assert goal.check({"ratio_vs_marian": 1.0})["met"] is True  # the target itself meets it
    assert goal.check({"ratio_vs_marian": 0.99})["met"] is False


def test_lower_is_better_goals_compare_the_other_way(goals):
    goal = next(g for g in goals.GOALS if g.name.startswith("BPE training 20 MB -> 32k: time"))
    report = {"results": [{"vocab_size": 16000, "time_ratio": 9.0}, {"vocab_size": 32000, "time_ratio": 1.4}]}
    assert goal.check(report)["met"] is True
    report["results"][1]["time_ratio"] = 1.6
    assert goal.check(report) == {"goal": goal.name, "target": "<= 1.5", "value": 1.6, "met": False}


def test_a_seq2seq_report_from_the_benchmark_itself(goals, tmp_path):
    """bench_seq2seq_train.py at a tiny size: the goals find both of its ratios."""
    import subprocess

    done = subprocess.run([sys.executable, "bench_seq2seq_train.py", "--threads", "1", "--steps", "1", "--vocab", "300",
                           "--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64", "--src-len", "8",
                           "--tgt-len", "8"], cwd=BENCHMARKS, capture_output=True, text=True, check=True, timeout=600)
    report = goals.last_json(done.stdout)
    rows = [g.check(report) for g in goals.GOALS if g.bench == "seq2seq"]
    assert len(rows) == 2 and all(isinstance(r["value"], float) and r["value"] > 0 for r in rows)
    assert 0 < report["attnlab_mfu"] < 1


# goals whose values the benchmarks began to report after the Xeon runs (read from a later run below)
ADDED_AFTER_THE_XEON_RUNS = {"bf16 weights, 355M: decoding step x fp32", "int8 weights, 355M: decoding step x fp32",
                             "int8 weights, 355M: a step's products, fraction of copy bandwidth"}


def test_every_goal_reads_its_value_from_a_full_recorded_run(goals):
    """The committed run of every benchmark (benchmarks/results/): each goal finds its value in the
    JSON its benchmark wrote, and the table it recorded is what the goals compute from those reports
    now (a renamed key in a benchmark, or a goal reading the wrong case, fails here)."""
    run = json.loads((BENCHMARKS / "results" / "goals-2026-11-28-xeon-amx-2.json").read_text())
    reports = {name: bench["report"] for name, bench in run["benchmarks"].items()}
    assert set(reports) == set(goals.BENCHES)
    rows = [g.check(reports[g.bench]) for g in goals.GOALS if g.name not in ADDED_AFTER_THE_XEON_RUNS]
    assert all(r["value"] is not None for r in rows), [r["goal"] for r in rows if r["value"] is None]
    assert rows == run["goals"]
    table = goals.table(rows)
    assert "| greedy fp32 batch 1 V=50,304: fraction of copy bandwidth | >= 0.85 | 0.626 | no |" in table
    assert "| int8 weights V=4,096: x fp32 | >= 3 | 1.61 | no |" in table
    # the 355M shape is its own case: a goal reading the 6-layer V=50,304 case instead gets 0.718
    assert "| bf16 weights, 355M (beyond the cache): x fp32 | >= 1.8 | 1.41 | no |" in table


def test_an_encode_report_from_the_benchmark_itself(goals, capsys):
    """bench_encode.py on the one text that needs no download (the standard library's code), tiny:
    the ids agree with Hugging Face `tokenizers`; the English goal reads its own row only."""
    spec = importlib.util.spec_from_file_location("bench_encode", BENCHMARKS / "bench_encode.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--texts", "code", "--vocab", "600", "--train-mb", "0.1", "--encode-mb", "0.02", "--rounds", "1"])
    report = goals.last_json(capsys.readouterr().out)
    (code,) = report["results"]
    assert code["text"] == "code" and code["identical"] is True and code["speedup"] > 0 and code["tokens"] > 0
    english, identical = (g for g in goals.GOALS if g.bench == "encode")
    assert english.check(report)["value"] is None  # no English row: missing, not met
    assert identical.check(report)["met"] is False  # one text of three
    report["results"].append({**code, "text": "english", "speedup": 1.3})
    assert english.check(report) == {"goal": english.name, "target": ">= 1", "value": 1.3, "met": True}


def test_the_decoding_goals_read_a_later_recorded_run(goals):
    """`goals.py --only decoding` on the 2-core AMD EPYC (2026-12-06): every decoding goal,
    those added after the Xeon runs included, finds its value, and the recorded table is what
    the goals compute from the reports now."""
    run = json.loads((BENCHMARKS / "results" / "goals-decoding-2026-12-06-epyc.json").read_text())
    reports = {name: bench["report"] for name, bench in run["benchmarks"].items()}
    decoding = [g for g in goals.GOALS if goals.BENCHES[g.bench][0] == "decoding"]
    rows = [g.check(reports[g.bench]) for g in decoding]
    assert all(r["value"] is not None for r in rows), [r["goal"] for r in rows if r["value"] is None]
    assert ADDED_AFTER_THE_XEON_RUNS <= {g.name for g in decoding}
    assert rows == run["goals"]
    table = goals.table(rows)
    assert "| int8 weights, 355M: decoding step x fp32 | >= 3 | 2.4 | no |" in table
    assert "| int8 weights, 355M: a step's products, fraction of copy bandwidth | >= 0.8 | 0.71 | no |" in table


def test_the_long_and_tokenizer_goals_read_a_later_recorded_run(goals):
    """`goals.py --only long tokenizers` on the 2-core AMD EPYC (2026-12-06): every goal of the two
    groups finds its value, and the recorded table is what the goals compute from the reports now."""
    run = json.loads((BENCHMARKS / "results" / "goals-long-tokenizers-2026-12-06-epyc.json").read_text())
    reports = {name: bench["report"] for name, bench in run["benchmarks"].items()}
    chosen = [g for g in goals.GOALS if goals.BENCHES[g.bench][0] in ("long", "tokenizers")]
    rows = [g.check(reports[g.bench]) for g in chosen]
    assert all(r["value"] is not None for r in rows), [r["goal"] for r in rows if r["value"] is None]
    assert rows == run["goals"]
    window = reports["long"]["results"][0]
    assert window["fraction_of_matmul_floor"] == round(window["matmul_floor_seconds"] / window["seconds"], 3)
    assert "| encoding English (byte-level BPE): x tokenizers | >= 1 | 0.828 | no |" in goals.table(rows)
