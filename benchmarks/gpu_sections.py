"""The sections of benchmarks/gpu_check.py: each a function of a `Check` (the device, toy or full
sizes, a scratch folder) that returns what it measured, raises `Skip` when it cannot run here and
`SectionFailed` (with what it measured) when it finds something wrong. The GPT-2 measurements
themselves are in gpu_measure.py."""

from __future__ import annotations

import copy
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the king queen lord speak hath thou thee love death night day sword crown blood".split()


class Skip(Exception):
    """A section that cannot run here (no CUDA, one GPU): recorded as skipped with this reason."""


class SectionFailed(RuntimeError):
    """A section ran and found something wrong; `details` is what it measured (kept in the JSON)."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}


@dataclass
class Check:
    """What every section gets: the device, the sizes (`quick`: toy), a scratch folder."""

    device: Any  # torch.device
    quick: bool
    work: Path
    gpu_name: str = ""
    pytest_paths: list[str] = field(default_factory=list)

    def size(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


def require(ok: bool, message: str, details: dict | None = None) -> None:
    """A section's own check: raises SectionFailed(message) when `ok` is false."""
    if not ok:
        raise SectionFailed(message, details)


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kw)


# ---------------------------------------------------------------- sections
def environment(check: Check) -> dict:
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "device": str(check.device), "cpus": os.cpu_count(),
           "platform": platform.platform(), "cpu": _cpu_model()}
    commit = _run(["git", "rev-parse", "--short", "HEAD"], 20)
    out["attnlab_commit"] = commit.stdout.strip() if commit.returncode == 0 else None
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        out.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(check.device)),
                   gpu_memory_gib=round(props.total_memory / 2 ** 30, 1), gpus=torch.cuda.device_count(),
                   cudnn=torch.backends.cudnn.version(), nccl=_nccl_version(),
                   bf16_native=torch.cuda.get_device_capability(check.device)[0] >= 8)
        smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,clocks.max.sm", "--format=csv,noheader"],
                   30) if shutil.which("nvidia-smi") else None
        out["nvidia_smi"] = smi.stdout.strip() if smi is not None and smi.returncode == 0 else None
    return out


def _nccl_version() -> str:
    import torch

    version = torch.cuda.nccl.version()  # (2, 27, 3) in recent torch, an int in older ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def sdpa_kernels(check: Check) -> dict:
    """attnlab's self-attention (kernel sdpa, causal, bf16 on a GPU) under each SDPA backend alone."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlab import build_model, presets
    from gpu_measure import sync

    dtype = torch.bfloat16 if check.device.type == "cuda" else torch.float32
    T = check.size(1024, 32)
    cfg = presets.get("tiny-decoder", vocab_size=256, d_model=check.size(512, 32), num_heads=check.size(8, 2),
                      num_layers=2, d_ff=check.size(2048, 64), attention={"kernel": "sdpa"},
                      position={"scheme": "rotary", "max_len": T})
    model = build_model(cfg).to(check.device, dtype).eval()
    ids = torch.randint(0, 256, (4, T), device=check.device)
    out: dict[str, Any] = {"dtype": str(dtype), "tokens": T}
    def forward_ms() -> float:  # the median of 5 forwards, after the one that gave `got`
        times = []
        for _ in range(5):
            sync(check.device)
            t = time.perf_counter()
            model(ids)
            sync(check.device)
            times.append(time.perf_counter() - t)
        return round(1000 * statistics.median(times), 3)

    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        reference = model(ids).float()
        out["math"] = {"runs": True, "forward_ms": forward_ms()}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with torch.no_grad(), sdpa_kernel([backend]):
                got = model(ids).float()
                out[backend.name.lower()] = {"runs": True, "max_abs_diff_vs_math": (got - reference).abs().max().item(),
                                             "forward_ms": forward_ms()}
        except RuntimeError as err:  # "No available kernel": the backend refused these inputs
            out[backend.name.lower()] = {"runs": False, "why": str(err).splitlines()[0][:300]}
    if check.device.type == "cuda":
        # FlashAttention takes no attn_mask (causality only as is_causal): a decoder that hands the
        # kernel a causal mask tensor is served by the slower memory-efficient kernel instead
        require(out["flash_attention"]["runs"], "sdpa: FlashAttention refused attnlab's causal self-attention in "
                "bf16 (nn/kernels/sdpa.py passes the mask as attn_mask, never is_causal)", out)
    return out


def _corpus(folder: Path, chars: int) -> tuple[Path, Path]:
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    text = lambda n: "\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(max(1, n // 60)))
    (folder / "train.txt").write_text(text(chars))
    (folder / "valid.txt").write_text(text(chars // 10))
    return folder / "train.txt", folder / "valid.txt"


def run_config(check: Check, out: Path, **train) -> dict:
    """A small char-level decoder run on the device (toy under --quick); `train` overrides the loop."""
    source, valid = _corpus(check.work / "corpus", check.size(1_000_000, 40_000))
    steps = check.size(50, 4)
    return {"model": {"preset": "tiny-decoder", "d_model": check.size(256, 32), "num_layers": check.size(4, 1),
                      "num_heads": check.size(4, 2), "d_ff": check.size(1024, 64), "dropout": 0.0,
                      "position": {"scheme": "rotary", "max_len": check.size(256, 32)}},
            "data": {"source": str(source), "valid": str(valid), "seq_len": check.size(256, 16),
                     "batch_size": check.size(32, 4)},
            "optim": {"lr": 0.003}, "schedule": {"name": "constant", "warmup_steps": 0},
            "train": {"out_dir": str(out), "max_steps": steps, "eval_every": steps, "eval_batches": 2,
                      "log_every": 1, "checkpoint_every": steps, "device": check.device.type, "seed": 0, **train}}


def _metrics(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train_loss" in r]


def _train(check: Check, name: str, *extra: str, timeout: float = 300, **train) -> tuple[Path, dict]:
    out = check.work / name
    cfg = run_config(check, out, **train)
    path = check.work / f"{name}.json"
    path.write_text(json.dumps(cfg))
    start = time.perf_counter()
    done = _run([sys.executable, "-m", "attnlab.cli.main", "train", str(path), *extra], timeout)
    seconds = time.perf_counter() - start
    require(done.returncode == 0, f"attnlab train ({name}) exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    records = _metrics(out)
    summary = json.loads((out / "config.json").read_text())
    steady = [r["tokens_per_s"] for r in records[len(records) // 2:]]  # past compilation and warm-up
    return out, {"seconds": round(seconds, 1), "steps": records[-1]["step"], "first_loss": records[0]["train_loss"],
                 "last_loss": records[-1]["train_loss"], "precision": summary.get("precision"),
                 "tokens_per_s_median": statistics.median(steady)}


def train_cli(check: Check) -> dict:
    """`attnlab train` in bf16, fp16 (loss-scaled), compiled; a checkpoint resumed equals one run."""
    from attnlab.training.setup.speedups import has_cxx_compiler

    results, problems = {}, []
    for name, train in (("bf16", {"precision": "bf16"}), ("fp16", {"precision": "fp16"})):
        out, results[name] = _train(check, name, **train)
        records = _metrics(out)
        if results[name]["precision"] != name:
            problems.append(f"{name}: the run computed in {results[name]['precision']}")
        if not results[name]["last_loss"] < results[name]["first_loss"]:
            problems.append(f"{name}: the loss did not fall ({results[name]})")
        if name == "fp16":
            results[name]["loss_scale_last"] = records[-1].get("loss_scale")
            if records[-1].get("loss_scale") is None:
                problems.append("fp16: no loss_scale in metrics.jsonl (no gradient scaler)")
    if check.device.type == "cpu" and not has_cxx_compiler():
        results["compile"] = {"skipped": "no C++ compiler for torch.compile on a CPU"}
    elif check.quick and check.device.type == "cpu":
        results["compile"] = {"skipped": "--quick on a CPU: compiling takes minutes on a small machine"}
    else:
        _, results["compile"] = _train(check, "compiled", timeout=420, precision="bf16", compile=True)
        eager = results["bf16"]
        results["compile"]["speedup_vs_eager"] = results["compile"]["tokens_per_s_median"] / eager["tokens_per_s_median"]
    # checkpoint + resume: half the steps, then --resume to the end == the whole run at once
    steps = run_config(check, check.work)["train"]["max_steps"]
    whole, _ = _train(check, "whole", precision="bf16", checkpoint_every=steps // 2)
    half, _ = _train(check, "half", precision="bf16", max_steps=steps // 2, checkpoint_every=steps // 2)
    done = _run([sys.executable, "-m", "attnlab.cli.main", "train", "--resume", str(half), "--train.max_steps",
                 str(steps)], 300)
    require(done.returncode == 0, f"attnlab train --resume exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    a = [r["train_loss"] for r in _metrics(whole)]
    b = [r["train_loss"] for r in _metrics(half)]
    diff = max((abs(x - y) for x, y in zip(a, b)), default=float("inf")) if len(a) == len(b) else float("inf")
    results["resume"] = {"whole_losses_tail": a[-3:], "resumed_losses_tail": b[-3:], "bitwise_equal": a == b,
                         "max_abs_diff": diff}
    # bitwise on a CPU; on a GPU the memory-efficient attention backward adds up in a varying order
    # (not deterministic), so two runs of the same config may part in the last bits
    if not (a == b if check.device.type == "cpu" else diff <= 1e-3):
        problems.append(f"resume: the resumed run's losses differ from the uninterrupted run's by up to {diff:.3g}")
    require(not problems, "; ".join(problems), results)
    return results


def gpt2_training(check: Check) -> dict:
    from gpu_measure import GPTShape, training_throughput

    _needs_cuda_or_toy(check)
    shape = check.size(GPTShape(), GPTShape(vocab=512, context=64, layers=2, heads=2, d_model=64))
    return training_throughput(check.device, shape, batch=check.size(16, 2), steps=check.size(10, 2),
                               warmup=check.size(3, 1), compile_too=not check.quick,
                               matmul_n=check.size(8192, 256), gpu_name=check.gpu_name)


def _needs_cuda_or_toy(check: Check) -> None:
    if check.device.type == "cpu" and not check.quick:
        raise Skip("GPT-2 124M on a CPU takes hours: benchmarks/train_throughput.py is the CPU benchmark "
                   "(or --quick for the toy shape)")


def decoding(check: Check) -> dict:
    from gpu_measure import GPTShape, decoding_speed

    _needs_cuda_or_toy(check)
    shape = check.size(GPTShape(vocab=50257), GPTShape(vocab=512, context=64, layers=2, heads=2, d_model=64))
    return decoding_speed(check.device, shape, batches=(1, 8), prompt_len=check.size(32, 8),
                          new_tokens=check.size(256, 8), repeats=check.size(3, 1))


def lora(check: Check) -> dict:
    """A LoRA run through the Trainer on the device: the base weights stay, the adapters move."""
    import torch

    from attnlab.nn.lora import lora_layers
    from attnlab.training import TrainConfig, Trainer

    cfg = run_config(check, check.work / "lora", precision="bf16" if check.device.type == "cuda" else "fp32")
    cfg["lora"] = {"rank": 8, "alpha": 16, "target_modules": ["q", "v", "out_proj"]}
    with warnings.catch_warnings():  # "lora without model.init_from": random base weights are the point here
        warnings.filterwarnings("ignore", "lora without model.init_from")
        trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    start = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - start
    params = dict(trainer.model.named_parameters())
    moved = [n for n, before in frozen.items() if not torch.equal(params[n].detach(), before)]
    adapters = lora_layers(trainer.model)
    b_norm = sum(float(b.detach().float().norm()) for m in adapters.values() for b in m.lora_B.values())
    records = _metrics(trainer.out)
    out = {"adapted_layers": len(adapters), "trainable": sum(p.numel() for p in params.values() if p.requires_grad),
           "frozen": sum(t.numel() for t in frozen.values()), "steps_per_s": records[-1]["step"] / seconds,
           "first_loss": records[0]["train_loss"], "last_loss": records[-1]["train_loss"],
           "lora_B_norm": b_norm, "frozen_weights_moved": moved[:5]}
    require(not moved and b_norm > 0 and adapters, "LoRA: frozen weights moved or the adapters did not", out)
    return out


def viewer(check: Check) -> dict:
    """capture_view of a model on the device against the same model on the CPU."""
    import torch

    from attnlab import build_model, presets
    from attnlab.inspect.viewer import capture_view, render_html

    cfg = presets.get("tiny-decoder", vocab_size=256, d_model=check.size(256, 32), num_layers=check.size(4, 2),
                      num_heads=4, d_ff=check.size(1024, 64), position={"scheme": "learned", "max_len": 128})
    cpu_model = build_model(cfg).eval()
    ids = torch.randint(0, 256, (check.size(96, 12),)).tolist()
    here = capture_view(cpu_model, ids)
    there = capture_view(copy.deepcopy(cpu_model).to(check.device), ids)
    diffs = [float((a.weights - b.weights).abs().max()) for ka, kb in zip(here.kinds, there.kinds)
             for a, b in zip(ka.maps, kb.maps)]
    html = render_html(there)
    out = {"maps": len(diffs), "max_abs_diff_vs_cpu": max(diffs), "html_bytes": len(html)}
    require(diffs and max(diffs) < 1e-4, "viewer: the device's attention weights differ from the CPU's", out)
    return out


DDP_ONE_RANK = r"""
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
device = torch.device(sys.argv[1])
backend = "nccl" if device.type == "cuda" else "gloo"
dist.init_process_group(backend, rank=0, world_size=1)
t = torch.arange(4.0, device=device)
dist.all_reduce(t)
model = DDP(torch.nn.Linear(8, 8).to(device))
model(torch.randn(4, 8, device=device)).sum().backward()
print(backend, t.tolist(), float(model.module.weight.grad.abs().sum()) > 0)
dist.destroy_process_group()
"""


def ddp(check: Check) -> dict:
    """NCCL (gloo on a CPU) in a 1-rank group; `attnlab train --nproc N` over N >= 2 GPUs."""
    import torch

    from attnlab.parallel.launch import free_port

    done = _run([sys.executable, "-c", DDP_ONE_RANK, check.device.type, str(free_port())], 180)
    require(done.returncode == 0, f"1-rank process group failed: {done.stderr.strip()[-1500:]}")
    out = {"one_rank": done.stdout.strip()}
    gpus = torch.cuda.device_count() if check.device.type == "cuda" else 0
    if gpus < 2:
        out["attnlab_nproc"] = (f"skipped: attnlab's data parallel runs one rank per GPU and needs 2 or more "
                                f"(found {gpus}); tests/parallel checks it over gloo on the CPU")
        return out
    ranks = 2 ** (min(gpus, 8).bit_length() - 1)  # a power of two: the batch of 32 splits evenly
    _, out["attnlab_nproc"] = _train(check, "ddp", "--nproc", str(ranks), precision="bf16")
    out["attnlab_nproc"].update(gpus=gpus, ranks=ranks)
    return out


def pytest_device(check: Check) -> dict:
    """The device-dependent tests (`-m device`) on this device; the section fails when one does."""
    report = check.work / "pytest.xml"
    paths = check.pytest_paths or (["tests/nn/test_losses.py"] if check.quick else [])
    cmd = [sys.executable, "-m", "pytest", "-m", "device", "--device", check.device.type, "-q", "-p",
           "no:cacheprovider", f"--junitxml={report}", *paths]
    done = _run(cmd, 600)
    require(report.exists(), f"pytest wrote no report (exit {done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}")
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    out = {"command": " ".join(cmd[1:]), **counts, "failed": failed[:60], "exit_code": done.returncode,
           "tail": done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []}
    require(done.returncode == 0 and counts["tests"] > 0, f"{len(failed)} device tests failed", out)
    return out


SECTIONS: dict[str, Callable[[Check], dict]] = {
    "environment": environment, "sdpa_kernels": sdpa_kernels, "train_cli": train_cli,
    "gpt2_training": gpt2_training, "decoding": decoding, "lora": lora, "viewer": viewer, "ddp": ddp,
    "pytest": pytest_device,
}

