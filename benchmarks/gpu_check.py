"""The GPU path end to end, in one command: every section timed and caught on its own (one failure
does not hide the rest), one JSON with each section's status, numbers and error.

Install on a fresh GPU machine (Linux, an NVIDIA driver for CUDA 12.8 or later; pick the wheel index of
your CUDA: cu126, cu128, cu130), from the repository root:

    python3 -m venv .venv && . .venv/bin/activate
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128
    pip install -e '.[test]'          # transformers, peft and the tests' references
    python benchmarks/gpu_check.py    # writes benchmarks/results/gpu-check-*.json (sized for <= 8 min on one H100)

(Not `-c constraints.txt` there: it pins the CPU wheel.) On a machine without a GPU the same
sections run at toy sizes, skipping what needs CUDA with the reason, so the script cannot rot:

    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu-check.json    # 1-2 minutes

Sections (`--only NAME ...` picks some):
  environment    GPU name, capability, memory, count; torch, CUDA, cuDNN, NCCL, transformers versions
  sdpa_kernels   attnlab's sdpa kernel in bf16 under each of PyTorch's backends (flash, efficient, math)
  train_cli      `attnlab train` on the device: bf16 autocast; fp16 with the loss scaler; train.compile
                 (torch.compile, Triton on a GPU); checkpoint + `--resume` equal to an uninterrupted run
  gpt2_training  GPT-2 124M training tokens/s and MFU in bf16: attnlab vs HF GPT2LMHeadModel vs a
                 nanoGPT-shaped model (benchmarks/gpu_measure.py), eager and compiled
  decoding       greedy tokens/s, attnlab.generate vs HF generate, batch 1 and 8
  lora           a LoRA run through the Trainer: only the adapters move
  viewer         the attention viewer's capture of a model on the device == the same model on the CPU
  ddp            NCCL (gloo on a CPU): a 1-rank group's all-reduce and DDP step; with 2 GPUs or more,
                 `attnlab train --nproc N`
  pytest         the device-dependent tests (`pytest -m device --device cuda`), counts and failures

The exit status is 1 when a section failed (a skip is not a failure), so CI can run the dry run.
`--table FILE` prints the README table of a results JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from gpu_sections import ROOT, SECTIONS, Check, SectionFailed, Skip


def run_sections(sections: list[tuple[str, Callable[[Check], dict]]], check: Check,
                 on_record: Callable[[dict], None] = lambda record: None) -> list[dict]:
    """Run each section, timed; an exception fails that section only (KeyboardInterrupt stops all)."""
    records = []
    for name, fn in sections:
        record: dict[str, Any] = {"section": name}
        start = time.perf_counter()
        try:
            record["result"] = fn(check)
            record["status"] = "ok"
        except Skip as skip:
            record.update(status="skipped", reason=str(skip))
        except Exception as err:  # noqa: BLE001 -- recorded, and the next section runs
            record.update(status="failed", error=f"{type(err).__name__}: {err}",
                          traceback=traceback.format_exc()[-4000:])
            if isinstance(err, SectionFailed):
                record["result"] = err.details
        record["seconds"] = round(time.perf_counter() - start, 2)
        _release_memory(check.device)
        records.append(record)
        print(f"[gpu_check] {name}: {record['status']} in {record['seconds']} s"
              + (f" ({record.get('reason') or record.get('error')})" if record["status"] != "ok" else ""),
              file=sys.stderr, flush=True)
        on_record(record)
    return records


def _release_memory(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)



# ---------------------------------------------------------------- the run
def gpu_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3": a file-name piece."""
    words = name.lower().replace("nvidia", "").replace("-", " ").split()
    return "-".join("".join(c for c in w if c.isalnum()) for w in words) or "gpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="default cuda")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the CPU dry run CI runs)")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION",
                        help=f"run these sections only: {', '.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, help="the JSON (default benchmarks/results/gpu-check-DATE-GPU.json)")
    parser.add_argument("--pytest-paths", nargs="+", default=[], metavar="PATH",
                        help="test files for the pytest section (default: every test marked device; "
                             "--quick: tests/nn/test_losses.py)")
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the README table of a results JSON and stop")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())))
        return 0
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # (before torch loads OpenMP) see tests/conftest.py
    import torch

    from attnlab.io.files import atomic_write_json
    from machine import loadavg

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} sees no CUDA device (a CPU build, or no "
                         "driver); install the CUDA wheel (see this file's docstring) or run --device cpu --quick")
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    stamp = datetime.now(timezone.utc)
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"gpu-check-{stamp:%Y-%m-%d}-{gpu_slug(gpu) if gpu else 'cpu'}{'-quick' if args.quick else ''}.json")
    results: dict[str, Any] = {"started": stamp.isoformat(timespec="seconds"), "device": args.device,
                               "gpu": gpu or None, "quick": args.quick, "loadavg_start": loadavg(), "sections": []}
    chosen = [(name, SECTIONS[name]) for name in (args.only or SECTIONS)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        check = Check(device, args.quick, Path(work), gpu, args.pytest_paths)

        def record(rec: dict) -> None:  # after each section: a killed run keeps what it measured
            results["sections"].append(rec)
            results["seconds"] = round(time.perf_counter() - start, 1)
            results["loadavg_end"] = loadavg()
            atomic_write_json(out, results)

        run_sections(chosen, check, record)
    print(json.dumps(results, indent=1))
    print(f"[gpu_check] wrote {out}", file=sys.stderr)
    return 1 if any(r["status"] == "failed" for r in results["sections"]) else 0


def _fmt(value: Any, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def markdown_table(results: dict) -> str:
    """The README's table from a results JSON: each section's status, then the headline numbers."""
    sections = {r["section"]: r for r in results["sections"]}
    env = sections.get("environment", {}).get("result", {})
    lines = [f"GPU: {results.get('gpu') or 'none (' + results['device'] + ')'}; torch {env.get('torch')}, CUDA "
             f"{env.get('cuda')}; {results['started']}{' (--quick)' if results.get('quick') else ''}", "",
             "| section | status | seconds | note |", "|---|---|---|---|"]
    for name, r in sections.items():
        note = r.get("reason") or r.get("error") or ""
        lines.append(f"| {name} | {r['status']} | {r['seconds']} | {note.splitlines()[0][:120] if note else ''} |")
    training = sections.get("gpt2_training", {}).get("result") or {}
    if training.get("models"):
        lines += ["", "| GPT-2 124M training (bf16) | tokens/s | MFU (measured peak) | MFU (nominal peak) |",
                  "|---|---|---|---|"]
        for name, m in training["models"].items():
            lines.append(f"| {name} | {_fmt(m['tokens_per_s'])} | {_fmt(m['mfu_vs_measured_peak'], 100, 1)}% | "
                         f"{_fmt(m['mfu_vs_nominal_peak'], 100, 1)}% |")
    decode = sections.get("decoding", {}).get("result") or {}
    if decode.get("cases"):
        lines += ["", "| greedy decoding | attnlab tokens/s | HF tokens/s | attnlab / HF |", "|---|---|---|---|"]
        for name, c in decode["cases"].items():
            lines.append(f"| {name} | {_fmt(c['attnlab']['tokens_per_s'])} | {_fmt(c['hf']['tokens_per_s'])} | "
                         f"{c['speedup_attnlab_vs_hf']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules: machine, gpu_measure
    sys.exit(main())
