"""Step time, memory and bytes sent per rank of each `parallel` layout, measured on the training
path `attnlab train CONFIG --nproc N` runs (the Trainer on the tp x pp x dp mesh, one process per
rank through attnlab.parallel.spawn), next to `attnlab.parallel.plan_layout`'s prediction for the
same layout. Prints JSON, with the ratios measured / predicted.

Layouts, all with the same model, data and global batch of G rows per step (grad_accum 1):
1 process; dp 2; tp 2; pp 2 under GPipe and under 1F1B (m micro-batches); tp 2 x dp 2;
pp 2 x dp 2 (1F1B). Model (defaults): a GPT-2-style decoder (pre-LN, learned positions, tied
embeddings), 4 layers, d_model 256, 4 heads, d_ff 1024, a word vocabulary of 4,096 (a synthetic
Zipf corpus written to a temporary folder, its token cache there too), seq_len 128, G = 16, m = 4,
fp32, dropout 0, AdamW, 1 torch thread per rank, on the CPU (gloo).

Measured on each rank:

    time      median seconds from one step to the next after the warm-up steps (Trainer.fit's
              on_step; logs, evaluation and checkpoints fall outside the timed steps), and the
              process CPU time per step. wall - CPU is time the rank did not compute: waiting for
              its peers, the pipeline bubble and, on a loaded machine, waiting for a core; so
              "idle_share" bounds the bubble from above, it is not the bubble
    bytes     what the process wrote per step (/proc/self/io wchar: gloo's TCP sends with their
              headers; nothing else writes during a timed step), against the plan's bytes sent by
              one rank (ring) of its stage: tp + pp + pp shared + dp
    tensors   counted by torch after a step: the parameters the rank holds (with data: a pipeline
              rank's other stages are on the meta device) and those its optimizer
              trains, their gradients, the AdamW moments; and the peak bytes autograd holds for
              backward during a step (saved-tensor hooks; a storage counts once, parameters and
              buffers not at all) -- against the plan's weights, gradients, Adam and activations
              (the micro-batches GPipe or 1F1B hold at once)
    resident  the resident set (VmRSS) above the one the rank had with torch, attnlab and the
              process group loaded, before the Trainer: once the Trainer is built (data,
              tokenizer, model: "rss_init_above_start"), between steps ("rss_between_steps_
              above_start"), and at the peak of a step (/proc/self/clear_refs "5", then VmHWM:
              "rss_peak_above_start", against the plan's total); "rss_step_extra" is that peak
              above the resident set just before the step. Before each of these steps the C
              allocator's free pages are handed back (glibc malloc_trim), else the resident set
              never falls from its first peak and a step's own peak cannot be seen

Each pipeline rank's weights + AdamW moments are checked against the plan's weights + Adam for its
stage: "pp_weights_and_optimizer_within_20pct_of_plan" in the JSON, per pp layout (every rank's
ratio within 0.8-1.2).

The plan does not predict time: the JSON's "table" gives each layout's step time (the slowest
rank's median), its speed against the 1-process layout, and the CPU seconds of a step summed over
its ranks (against the 1-process layout's: the work the layout adds, which the load disturbs far
less than wall time).

Caveats, recorded in the JSON too: this is a CPU run. The 2- and 4-process layouts share the
machine's cores with each other (4 ranks on 2 cores run 2 to a core) and with whatever else runs
(the load average is recorded before and after), so a layout's time is what it costs on this
machine, not what it would cost with a device per rank. On a loaded machine the scheduler also
shares the cores among processes, so 4 ranks take a larger share of them from the other work than
1 process does: a speed-up can exceed 2 on 2 cores. The resident set holds what the plan leaves
out (the interpreter's and the data's memory, allocator caches, DDP's gradient buckets, the
pipeline's buffers, transient backward tensors): the torch counts are the ones to hold against
the plan term by term.

--rounds R runs all layouts R times, in turns (forward, then backward order, ...), so a change of
load hits all alike; each number is the median over the rounds.

    python benchmarks/bench_parallel_layouts.py                   # 3 rounds, ~8 minutes on 2 busy cores
    python benchmarks/bench_parallel_layouts.py --quick           # smaller model, fewer steps, 1 round: ~2 minutes
    python benchmarks/bench_parallel_layouts.py --layouts tp2,pp2-1f1b --rounds 5 --out layouts.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import loadavg, reset_peak_rss, status_bytes

MIB = 2**20
NEVER = 10**9  # log_every / eval_every / checkpoint_every: not during the measured steps

# name -> (processes, the run's `parallel` section); "M" is replaced by --micro-batches
LAYOUTS = {
    "1proc": (1, {}),
    "dp2": (2, {}),
    "tp2": (2, {"tp": 2}),
    "pp2-gpipe": (2, {"pp": 2, "micro_batches": "M", "schedule": "gpipe"}),
    "pp2-1f1b": (2, {"pp": 2, "micro_batches": "M", "schedule": "1f1b"}),
    "tp2xdp2": (4, {"tp": 2}),
    "pp2xdp2": (4, {"pp": 2, "micro_batches": "M", "schedule": "1f1b"}),
}


# ---------------------------------------------------------------- the run
def write_corpus(folder: Path, words: int, tokens: int, seed: int = 0) -> tuple[Path, Path]:
    """train.txt and valid.txt of lines of random lower-case words drawn with Zipf weights
    (1 / rank): `words` distinct words, about `tokens` words of training text."""
    rng = random.Random(seed)
    vocab = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                    for _ in range(2 * words)})[:words]
    rng.shuffle(vocab)
    weights = [1.0 / (i + 1) for i in range(len(vocab))]

    def text(n: int) -> str:
        drawn = rng.choices(vocab, weights, k=n)
        return "\n".join(" ".join(drawn[i:i + 16]) for i in range(0, n, 16)) + "\n"

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(text(tokens))
    (folder / "valid.txt").write_text(text(tokens // 20))
    return folder / "train.txt", folder / "valid.txt"


def run_config(s: dict, corpus: tuple[Path, Path], out: Path, nproc: int, parallel: dict) -> dict:
    """The `attnlab train` config of one layout: G rows per step over its dp replicas."""
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    dp = nproc // (tp * pp)
    return {
        "model": {"preset": "gpt2-small", "d_model": s["d_model"], "num_layers": s["layers"], "num_heads": s["heads"],
                  "d_ff": 4 * s["d_model"], "dropout": 0.0, "position": {"scheme": "learned", "max_len": s["seq_len"]}},
        "data": {"source": str(corpus[0]), "valid": str(corpus[1]), "seq_len": s["seq_len"],
                 "batch_size": s["global_batch"] // dp, "tokenizer": {"kind": "word", "vocab_size": s["vocab"]}},
        "optim": {"name": "adamw", "lr": 1e-3},
        "schedule": {"name": "constant", "warmup_steps": 0},
        "train": {"out_dir": str(out), "max_steps": s["warmup"] + s["steps"] + s["memory_steps"] + 1,
                  "precision": "fp32", "device": "cpu", "threads": 1, "seed": 0, "log_every": NEVER,
                  "eval_every": NEVER, "eval_batches": 1, "checkpoint_every": NEVER, "keep_last": 1},
        "parallel": parallel,
    }


# ---------------------------------------------------------------- what one rank measures
def _written() -> int:
    """Bytes this process has written so far (/proc/self/io wchar: files, pipes and sockets)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io (this benchmark needs Linux)")


class StepClock:
    """on_step callback: wall seconds, CPU seconds and bytes written from the end of one call to
    the start of the next, i.e. one training step (and the loop's bookkeeping around it)."""

    def __init__(self):
        self.steps: list[tuple[int, float, float, int]] = []  # (step, wall, cpu, bytes)
        self._last = None

    def __call__(self, info: dict) -> None:
        wall, cpu, sent = time.perf_counter(), time.process_time(), _written()
        if self._last is not None:
            self.steps.append((info["step"], wall - self._last[0], cpu - self._last[1], sent - self._last[2]))
        self._last = (time.perf_counter(), time.process_time(), _written())


class _Held:
    """What a saved-tensor pack hook returns: the tensor, and its storage's count while alive."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor, meter: "SavedActivations", key: int):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self):  # the graph that saved it is gone
        self.meter.release(self.key)


class SavedActivations:
    """Bytes autograd holds for backward, now and at the peak (`torch.autograd.graph.
    saved_tensors_hooks`). A storage counts once however many saved tensors view it; the
    storages in `skip` (parameters, buffers) not at all."""

    def __init__(self, skip: set[int]):
        self.skip = skip
        self.refs: dict[int, list[int]] = {}  # storage address -> [bytes, saved tensors holding it]
        self.bytes = self.peak = 0

    def pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip or storage.nbytes() == 0:
            return t
        entry = self.refs.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.bytes += entry[0]
            self.peak = max(self.peak, self.bytes)
        entry[1] += 1
        return _Held(t.detach(), self, key)  # detached: holding t itself would tie a saved output to its own node

    @staticmethod
    def unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self.refs[key]

    def reset_peak(self) -> None:
        self.peak = self.bytes


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors`."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and not t.is_meta:  # (a pipeline rank's other stages: no data)
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _tensor_counts(trainer) -> dict[str, int]:
    """Bytes of the parameters the rank holds and trains, their gradients and the optimizer state."""
    trained = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if hasattr(v, "untyped_storage")]
    return {"weights_held": _storage_bytes(trainer.model.parameters()), "weights_trained": _storage_bytes(trained),
            "gradients": _storage_bytes(p.grad for p in trained), "optimizer": _storage_bytes(state)}


def _trim() -> bool:
    """Hand the C allocator's free pages back to the system (glibc's malloc_trim), so that the
    resident set is what is in use; False where there is no malloc_trim (not glibc)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


class MemoryProbe:
    """on_step callback: after each step, the peak resident set during it and the resident set
    before it (trimmed: `_trim`), the peak bytes autograd held, and the tensor counts; then the
    allocator is trimmed and the peaks reset for the next step."""

    def __init__(self, trainer, saved: SavedActivations):
        self.trainer, self.saved = trainer, saved
        self.rows: list[dict[str, int]] = []
        self.trimmed, self._before = False, 0

    def reset(self) -> None:
        self.trimmed = _trim()
        self._before = status_bytes("VmRSS")  # after the last step, before the next: what persists
        reset_peak_rss()
        self.saved.reset_peak()

    def __call__(self, info: dict) -> None:
        self.rows.append({"rss_before_step": self._before, "rss_peak": status_bytes("VmHWM"),
                          "activations_peak": self.saved.peak, **_tensor_counts(self.trainer)})
        self.reset()


def _plan_for_rank(trainer, ctx) -> dict:
    """plan_layout's prediction for this rank's stage, in bytes."""
    from attnlab.parallel import plan_layout

    cfg, par = trainer.config, trainer.config.parallel
    rows = cfg.data.batch_size * cfg.train.grad_accum
    m = par.micro_batches if par.pp > 1 else cfg.train.grad_accum  # pp 1: the Trainer's accumulation
    plan = plan_layout(trainer.model.config, nproc=ctx.world_size, tp=par.tp, pp=par.pp, dp=ctx.dp_size,
                       micro_batches=m, seq_len=cfg.data.seq_len, batch=rows, bytes_per_value=4)
    row = plan["stages"][ctx.pp_rank]
    schedule = par.schedule if par.pp > 1 else "gpipe"  # one stage: one micro-batch held at once
    activations = row["activation_bytes_1f1b" if schedule == "1f1b" else "activation_bytes_gpipe"]
    by_axis = {"tp": row["tp_ring_bytes"], "pp": row["pp_send_forward_bytes"] + row["pp_send_backward_bytes"],
               "pp_shared": row["pp_shared_ring_bytes"], "dp": row["dp_ring_bytes"]}
    return {"stage": ctx.pp_rank, "layers": row["layers"], "params_total": plan["params_total"],
            "weights": row["weights_bytes"], "gradients": row["gradients_bytes"], "optimizer": row["optimizer_bytes"],
            "activations": activations, "activations_per_micro_batch": row["activation_bytes_per_micro_batch"],
            "total": row["weights_bytes"] + row["gradients_bytes"] + row["optimizer_bytes"] + activations,
            "bytes_sent_per_step": sum(by_axis.values()), "bytes_by_axis": by_axis,
            "bubble_fraction": plan["bubble_fraction"]}


def measure_rank(ctx, config: dict, warmup: int, steps: int, memory_steps: int) -> dict:
    """One rank of a layout: train `config` for warm-up + timed steps (the clock on), then for
    `memory_steps` steps with the memory probes on; returns what it measured and the plan's numbers."""
    import torch

    from attnlab.parallel.mesh import MeshTraining  # code loaded before the baseline resident set
    from attnlab.training import TrainConfig, Trainer

    rss_start = status_bytes("VmRSS")
    trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False, mesh=MeshTraining)
    rss_init = status_bytes("VmRSS")  # the data, the tokenizer and the model built, no step taken
    clock = StepClock()
    trainer.fit(stop_at=warmup + steps, on_step=clock)
    timed = [row for row in clock.steps if row[0] > warmup]

    kept = list(trainer.model.parameters()) + list(trainer.model.buffers())
    saved = SavedActivations({t.untyped_storage().data_ptr() for t in kept})
    probe = MemoryProbe(trainer, saved)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        probe.reset()
        trainer.fit(stop_at=warmup + steps + memory_steps, on_step=probe)
    rows = probe.rows
    measured = {
        "s_per_step": statistics.median(r[1] for r in timed), "cpu_s_per_step": statistics.median(r[2] for r in timed),
        "bytes_sent_per_step": statistics.median(r[3] for r in timed), "timed_steps": len(timed),
        **{k: rows[-1][k] for k in ("weights_held", "weights_trained", "gradients", "optimizer")},
        "activations": max(r["activations_peak"] for r in rows),
        "rss_start": rss_start, "rss_init_above_start": rss_init - rss_start,
        "rss_between_steps_above_start": rows[-1]["rss_before_step"] - rss_start,
        "rss_step_extra": max(r["rss_peak"] - r["rss_before_step"] for r in rows),
        "rss_peak_above_start": max(r["rss_peak"] for r in rows) - rss_start, "trimmed": probe.trimmed,
    }
    return {"rank": ctx.rank, "tp_rank": ctx.tp_rank, "pp_rank": ctx.pp_rank, "dp_rank": ctx.dp_rank,
            "measured": measured, "predicted": _plan_for_rank(trainer, ctx)}


# ---------------------------------------------------------------- the parent
def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def rank_report(rank: dict) -> dict:
    """One rank's numbers in MiB, and the ratios measured / predicted."""
    m, p = rank["measured"], rank["predicted"]
    memory = ("weights_held", "weights_trained", "gradients", "optimizer", "activations", "rss_start",
              "rss_init_above_start", "rss_between_steps_above_start", "rss_step_extra", "rss_peak_above_start")
    measured = {"s_per_step": round(m["s_per_step"], 3), "cpu_s_per_step": round(m["cpu_s_per_step"], 3),
                "idle_share": round(1 - m["cpu_s_per_step"] / m["s_per_step"], 3),
                "sent_mib_per_step": round(m["bytes_sent_per_step"] / MIB, 3), "timed_steps": m["timed_steps"],
                "allocator_trimmed": bool(m["trimmed"]), **{f"{k}_mib": round(m[k] / MIB, 2) for k in memory}}
    predicted = {"stage": p["stage"], "layers": p["layers"], "bubble_fraction": round(p["bubble_fraction"], 3),
                 "sent_mib_per_step": round(p["bytes_sent_per_step"] / MIB, 3),
                 "sent_mib_by_axis": {k: round(v / MIB, 3) for k, v in p["bytes_by_axis"].items()},
                 **{f"{k}_mib": round(p[k] / MIB, 2) for k in ("weights", "gradients", "optimizer", "activations",
                                                              "activations_per_micro_batch", "total")}}
    ratio = {"weights_held": _ratio(m["weights_held"], p["weights"]),
             "weights_and_optimizer": _ratio(m["weights_held"] + m["optimizer"], p["weights"] + p["optimizer"]),
             "weights_trained": _ratio(m["weights_trained"], p["weights"]),
             "gradients": _ratio(m["gradients"], p["gradients"]), "optimizer": _ratio(m["optimizer"], p["optimizer"]),
             "activations": _ratio(m["activations"], p["activations"]),
             "rss_step_extra_vs_activations": _ratio(m["rss_step_extra"], p["activations"]),
             "rss_peak_above_start_vs_total": _ratio(m["rss_peak_above_start"], p["total"]),
             "bytes_sent": _ratio(m["bytes_sent_per_step"], p["bytes_sent_per_step"])}
    return {"rank": rank["rank"], "coords": {"tp": rank["tp_rank"], "pp": rank["pp_rank"], "dp": rank["dp_rank"]},
            "measured": measured, "predicted": predicted, "measured_over_predicted": ratio}


def median_ranks(runs: list[list[dict]]) -> list[dict]:
    """Per rank, the median over rounds of every measured number (the plan's are the same in each)."""
    out = []
    for ranks in zip(*runs):
        first = ranks[0]
        measured = {k: statistics.median(r["measured"][k] for r in ranks) for k in first["measured"]}
        out.append({**first, "measured": measured})
    return out


def run_layout(name: str, s: dict, corpus: tuple[Path, Path], folder: Path, round_: int) -> list[dict]:
    from attnlab.parallel import spawn

    nproc, parallel = LAYOUTS[name]
    parallel = {k: s["micro_batches"] if v == "M" else v for k, v in parallel.items()}
    config = run_config(s, corpus, folder / f"{name}-{round_}", nproc, parallel)
    return spawn(measure_rank, nproc, args=(config, s["warmup"], s["steps"], s["memory_steps"]),
                 tp=parallel.get("tp", 1), pp=parallel.get("pp", 1), threads=1, timeout_s=s["timeout"],
                 collective_timeout_s=min(600.0, s["timeout"]))


def cpu_per_step(ranks: list[dict]) -> float:
    """CPU seconds of one step, all ranks together: the work the layout does, whatever the load."""
    return round(sum(r["measured"]["cpu_s_per_step"] for r in ranks), 3)


def summary_row(name: str, ranks: list[dict], one: list[dict] | None) -> dict:
    """One line of the table: the slowest rank's step, all ranks' CPU time, the largest rank's
    memory and traffic; against the 1-process layout `one` where it ran."""
    worst = max(r["measured"]["s_per_step"] for r in ranks)

    def top(side: str, key: str) -> float:
        return max(r[side][key] for r in ranks)

    one_s = max(r["measured"]["s_per_step"] for r in one) if one else None
    return {"layout": name, "nproc": LAYOUTS[name][0], "s_per_step": worst,
            "speed_vs_1proc": round(one_s / worst, 2) if one else None,
            "cpu_s_per_step_all_ranks": cpu_per_step(ranks),
            "cpu_vs_1proc": round(cpu_per_step(ranks) / cpu_per_step(one), 2) if one else None,
            "idle_share_max": top("measured", "idle_share"),
            "bubble_predicted": ranks[0]["predicted"]["bubble_fraction"],
            "rss_peak_above_start_mib_max": top("measured", "rss_peak_above_start_mib"),
            "plan_total_mib_max": top("predicted", "total_mib"),
            "rss_init_above_start_mib_max": top("measured", "rss_init_above_start_mib"),
            "rss_step_extra_mib_max": top("measured", "rss_step_extra_mib"),
            "activations_mib_max": top("measured", "activations_mib"),
            "plan_activations_mib_max": top("predicted", "activations_mib"),
            "weights_held_mib_max": top("measured", "weights_held_mib"),
            "plan_weights_mib_max": top("predicted", "weights_mib"),
            "weights_and_optimizer_mib_max": max(r["measured"]["weights_held_mib"] + r["measured"]["optimizer_mib"]
                                                 for r in ranks),
            "plan_weights_and_optimizer_mib_max": max(r["predicted"]["weights_mib"] + r["predicted"]["optimizer_mib"]
                                                      for r in ranks),
            "weights_and_optimizer_ratios": [r["measured_over_predicted"]["weights_and_optimizer"] for r in ranks],
            "sent_mib_per_step_max": top("measured", "sent_mib_per_step"),
            "plan_sent_mib_per_step_max": top("predicted", "sent_mib_per_step")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: python benchmarks/bench_parallel_layouts.py --quick")
    parser.add_argument("--quick", action="store_true", help="smaller model, fewer steps, 1 round")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, from {', '.join(LAYOUTS)}")
    parser.add_argument("--rounds", type=int, help="runs of every layout, in turns; medians over them (default 3, "
                                                   "--quick 1)")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 5, --quick 3)")
    parser.add_argument("--micro-batches", type=int, default=4, help="m, the pipeline layouts' micro-batches")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one layout may take before it is killed")
    parser.add_argument("--out", help="also write the JSON here (atomically)")
    args = parser.parse_args(argv)
    names = args.layouts.split(",")
    for name in names:
        if name not in LAYOUTS:
            raise SystemExit(f"--layouts: unknown layout {name!r}; choose from {', '.join(LAYOUTS)}")
    rounds = args.rounds if args.rounds is not None else 1 if args.quick else 3
    if rounds < 1:
        raise SystemExit(f"--rounds: expected a positive integer, got {rounds}")
    s = dict(d_model=256, layers=4, heads=4, vocab=4096, seq_len=128, global_batch=16, warmup=2, steps=5,
             memory_steps=2, micro_batches=args.micro_batches, timeout=args.timeout)
    if args.quick:
        s.update(d_model=128, vocab=2048, seq_len=64, warmup=1, steps=3, memory_steps=1)
    if args.steps is not None:
        s["steps"] = args.steps
    for flag, value in (("--steps", s["steps"]), ("--micro-batches", s["micro_batches"])):
        if value < 1:
            raise SystemExit(f"{flag}: expected a positive integer, got {value}")
    if s["global_batch"] % (2 * s["micro_batches"]):
        raise SystemExit(f"--micro-batches: {s['micro_batches']} must divide the {s['global_batch'] // 2} rows of a "
                         "pp 2 x dp 2 replica")

    import torch

    load_start, started = loadavg(), time.perf_counter()
    results: dict[str, list[list[dict]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-layouts-") as tmp:
        folder = Path(tmp)
        os.environ["ATTNLAB_CACHE"] = str(folder / "cache")  # the ranks inherit it: the token cache stays here
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        corpus = write_corpus(folder / "corpus", words=s["vocab"] + s["vocab"] // 2, tokens=100 * s["vocab"])
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                results[name].append(run_layout(name, s, corpus, folder, r))
                print(f"round {r + 1}/{rounds} {name}: {time.perf_counter() - t:.0f} s, load {loadavg()}",
                      file=sys.stderr, flush=True)
    layouts = {name: [rank_report(rank) for rank in median_ranks(runs)] for name, runs in results.items()}
    # each pipeline rank holds its stage: weights + Adam within 20 % of the plan's, on every rank
    stage_memory = {name: all(0.8 <= r["measured_over_predicted"]["weights_and_optimizer"] <= 1.2 for r in ranks)
                    for name, ranks in layouts.items() if LAYOUTS[name][1].get("pp", 1) > 1}
    report = {
        "benchmark": "parallel_layouts",
        "settings": {**{k: v for k, v in s.items() if k != "timeout"}, "rounds": rounds},
        "model": "gpt2-small preset: decoder, pre-LN, learned positions, tied embeddings, GELU (tanh); fp32, "
                 "dropout 0, AdamW, grad_clip 1.0; word tokenizer on a synthetic Zipf corpus",
        "layouts": {name: {"nproc": LAYOUTS[name][0], "parallel": LAYOUTS[name][1], "ranks": ranks}
                    for name, ranks in layouts.items()},
        "table": [summary_row(name, ranks, layouts.get("1proc")) for name, ranks in layouts.items()],
        "pp_weights_and_optimizer_within_20pct_of_plan": stage_memory,
        "method": {
            "time": "median over the timed steps of the wall time from one step's end to the next's (Trainer.fit "
                    "on_step); a layout's time is its slowest rank's; idle_share = 1 - CPU time / wall time",
            "bytes": "/proc/self/io wchar per step: what the rank sent over gloo's TCP sockets (headers included)",
            "memory": "torch counts (parameters held and trained, gradients, optimizer state after a step; peak "
                      "bytes saved for backward during a step, by saved-tensor hooks) and the resident set above the "
                      "rank's before the Trainer started: built, between steps, at a step's peak (clear_refs 5, "
                      "VmHWM; the allocator trimmed before the step with malloc_trim)",
            "plan": "attnlab.parallel.plan_layout(model, nproc, tp, pp, dp, micro_batches, seq_len, batch = rows per "
                    "dp rank, bytes_per_value=4), the rank's stage; activations held at once under its schedule",
        },
        "caveats": ["CPU only: each rank is one process with 1 torch thread; the 2- and 4-process layouts share the "
                    f"machine's {os.cpu_count()} cores (4 ranks on 2 cores oversubscribe them 2x) and share them with "
                    "other work (see the load average), so step times are this machine's, not a device per rank's",
                    "on a loaded machine the scheduler shares the cores among processes, so a layout of more "
                    "processes takes a larger share from the other work: speed_vs_1proc can exceed what 2 cores "
                    "allow; cpu_vs_1proc (CPU seconds per step, all ranks) is the layout's own overhead",
                    "idle_share includes waiting for a core on a loaded machine: an upper bound on the bubble",
                    "the resident set also holds what the plan leaves out (interpreter and data, allocator caches, "
                    "DDP buckets, pipeline buffers, transient backward tensors); compare the torch counts term by "
                    "term"],
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "loadavg_before": load_start, "loadavg_after": loadavg(),
                    "wall_s": round(time.perf_counter() - started)},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        from attnlab.io.files import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
