"""benchmarks/gpu_check.py: a failing section is recorded and the others still run, the JSON is
written after each section, the exit status says whether one failed, and the real sections run
at toy sizes on the CPU (the whole dry run, 1-3 minutes here, is the slow test and a line of .ci/run)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its siblings (gpu_sections, gpu_measure, machine)
    try:
        yield importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("gpu_check", "gpu_sections", "gpu_measure", "machine"):
            sys.modules.pop(name, None)


@pytest.fixture
def check(gpu_check, tmp_path):
    return gpu_check.Check(torch.device("cpu"), True, tmp_path)


def _sections(gpu_check, ran: list):
    def ok(check):
        ran.append("ok")
        return {"value": 1}

    def broken(check):
        ran.append("broken")
        raise ZeroDivisionError("division by zero in a section")

    def skipped(check):
        ran.append("skipped")
        raise gpu_check.Skip("needs a CUDA device")

    def wrong(check):
        ran.append("wrong")
        raise gpu_check.SectionFailed("the numbers are off", {"measured": 3})

    def last(check):
        ran.append("last")
        return {}

    return [("ok", ok), ("broken", broken), ("skipped", skipped), ("wrong", wrong), ("last", last)]


def test_a_failing_section_is_recorded_and_the_rest_still_run(gpu_check, check):
    ran, written = [], []
    records = gpu_check.run_sections(_sections(gpu_check, ran), check, written.append)
    assert ran == ["ok", "broken", "skipped", "wrong", "last"]  # every section ran, in order
    assert [r["status"] for r in records] == ["ok", "failed", "skipped", "failed", "ok"]
    assert written == records  # reported as each one ended
    assert records[0]["result"] == {"value": 1}
    assert records[1]["error"] == "ZeroDivisionError: division by zero in a section"
    assert "ZeroDivisionError" in records[1]["traceback"] and "result" not in records[1]
    assert records[2]["reason"] == "needs a CUDA device"
    assert records[3]["error"] == "SectionFailed: the numbers are off" and records[3]["result"] == {"measured": 3}
    assert all(r["seconds"] >= 0 for r in records)


def test_main_writes_every_section_and_exits_1_when_one_failed(gpu_check, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_check, "SECTIONS", dict(_sections(gpu_check, ran)))
    out = tmp_path / "results" / "check.json"
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(out)]) == 1
    saved = json.loads(out.read_text())
    assert [r["section"] for r in saved["sections"]] == ["ok", "broken", "skipped", "wrong", "last"]
    assert saved["device"] == "cpu" and saved["quick"] is True and saved["gpu"] is None
    assert not list(out.parent.glob(".*"))  # the atomic writer left no temporary file
    ran.clear()
    assert gpu_check.main(["--device", "cpu", "--only", "ok", "skipped", "--out", str(out)]) == 0  # a skip passes
    assert ran == ["ok", "skipped"]
    assert "| skipped | skipped |" in gpu_check.markdown_table(json.loads(out.read_text()))


def test_cuda_without_a_gpu_is_refused_naming_the_way_out(gpu_check, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--device cuda: .* no CUDA device .* --device cpu --quick"):
        gpu_check.main(["--device", "cuda", "--out", "/nonexistent/never-written.json"])


@pytest.mark.parametrize("name", ["environment", "sdpa_kernels", "decoding", "lora", "viewer"])
def test_the_quick_sections_run_on_the_cpu(gpu_check, check, name):
    (record,) = gpu_check.run_sections([(name, gpu_check.SECTIONS[name])], check)
    assert record["status"] == "ok", record.get("error")
    result = record["result"]
    if name == "sdpa_kernels":  # the math backend is the reference; CPU has a flash kernel of its own
        flash = result["flash_attention"]
        assert flash["runs"] and flash["max_abs_diff_vs_math"] < 1e-5 and flash["forward_ms"] > 0
    if name == "decoding":  # the same weights, fp32 greedy: the same tokens
        assert {c["same_tokens_fraction"] for c in result["cases"].values()} == {1.0}
    if name == "lora":
        assert result["frozen_weights_moved"] == [] and result["lora_B_norm"] > 0
    if name == "viewer":
        assert result["maps"] == 2 and result["max_abs_diff_vs_cpu"] == 0.0


def test_the_table_has_a_row_per_section_and_the_measured_models(gpu_check):
    results = {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "started": "2026-12-06T12:00:00+00:00",
               "sections": [
                   {"section": "environment", "status": "ok", "seconds": 1.0, "result": {"torch": "2.13.0", "cuda": "12.8"}},
                   {"section": "gpt2_training", "status": "ok", "seconds": 90.0, "result": {"models": {
                       "attnlab": {"tokens_per_s": 400000.0, "mfu_vs_measured_peak": 0.5, "mfu_vs_nominal_peak": 0.4}}}},
                   {"section": "ddp", "status": "failed", "seconds": 2.0, "error": "SectionFailed: nccl\nmore"}]}
    table = gpu_check.markdown_table(results)
    assert "GPU: NVIDIA H100 80GB HBM3; torch 2.13.0, CUDA 12.8" in table
    assert "| ddp | failed | 2.0 | SectionFailed: nccl |" in table
    assert "| attnlab | 400,000 | 50.0% | 40.0% |" in table


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_section(gpu_check, tmp_path):
    out = tmp_path / "dry.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--device", "cpu", "--quick", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(out.read_text())
    assert [r["section"] for r in saved["sections"]] == list(gpu_check.SECTIONS)
    assert {r["status"] for r in saved["sections"]} == {"ok"}  # on a CPU what needs CUDA skips inside a section
    assert json.loads(done.stdout) == saved
