"""Mutation check: plant realistic bugs one at a time and see which tests catch each.

Each mutation names a module, an exact snippet of its source, the snippet's buggy replacement
and the module's own test folder (attnlab/nn/masks.py -> tests/nn). The script copies the
working tree (tracked and untracked, not ignored files) to a scratch folder once, runs each
folder there unmutated (a test that already fails is deselected, so it cannot pass for a catch),
then for each mutation: applies it, runs the folder with `pytest -x`, records caught / missed /
timeout with the first failing test and the seconds, and restores the file. It prints a JSON
report (`--markdown`: a table too) and exits 1 when a mutation is missed.

    python benchmarks/mutations.py --list                   # the mutations, one a line
    python benchmarks/mutations.py --only mask-causal-off-by-one,attn-scale-d
    nice python benchmarks/mutations.py --out benchmarks/results/mutations-$(date +%F).json
    python benchmarks/mutations.py --full --only rotary-sign   # the whole default suite instead

A snippet that is not found exactly once stops the script before it runs anything (and
tests/benchmarks/test_mutations.py fails in the default suite): after moving code, update the
entry it names. A missed mutation is a test to write in that folder; add a mutation here for
every bug a review finds that the tests did not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One planted bug: `old` (found exactly once in `path`) becomes `new`; `folder` is the
    module's own tests."""

    id: str
    path: str
    old: str
    new: str
    description: str
    folder: str


M = Mutation
MUTATIONS: list[Mutation] = [
    # ---- nn: masks, scores, positions, cache, norms, losses ----
    M("mask-causal-off-by-one", "attnlab/nn/masks.py",
      ".tril(diagonal=t_k - t_q)", ".tril(diagonal=t_k - t_q + 1)",
      "causal mask lets each query see the next token", "tests/nn"),
    M("mask-padding-inverted", "attnlab/nn/masks.py",
      "return attention_mask.bool()[:, None, None, :]", "return (attention_mask == 0)[:, None, None, :]",
      "padding mask read the Hugging Face-additive way round: padding attended, real tokens hidden", "tests/nn"),
    M("positions-ignore-left-padding", "attnlab/nn/masks.py",
      "return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)",
      "return torch.arange(attention_mask.shape[-1], device=attention_mask.device).expand_as(attention_mask)",
      "position ids count padding, so a left-padded row starts at a later position", "tests/nn"),
    M("attn-scale-d", "attnlab/nn/scores.py",
      "return q, k, q.shape[-1] ** -0.5", "return q, k, q.shape[-1] ** -1.0",
      "scaled dot-product divides by d instead of sqrt(d)", "tests/nn"),
    M("rotary-freq-dim", "attnlab/nn/positions.py",
      "inv_freq = base ** (-torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim)",
      "inv_freq = base ** (-torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / head_dim)",
      "rotary frequencies spread over the head size instead of the rotated dimensions (partial rotary)",
      "tests/nn"),
    M("rotary-sign", "attnlab/nn/positions.py",
      "torch.cat((-half2, half1), dim=-1) * sin", "torch.cat((half2, -half1), dim=-1) * sin",
      "rotary rotates the other way (still relative, but not the published rotation)", "tests/nn"),
    M("rotary-base-dropped", "attnlab/nn/positions.py",
      "RotaryEmbedding(s.head_dim, p.rotary_dim, p.rotary_base,", "RotaryEmbedding(s.head_dim, p.rotary_dim, 10000.0,",
      "the configured rotary base never reaches the layers (always 10000)", "tests/nn"),
    M("alibi-slope-heads", "attnlab/nn/positions.py",
      "start = 2 ** (-8 / n)", "start = 2 ** (-8 / num_heads)",
      "ALiBi slopes from the head count, not the closest power of two (wrong for 6, 12 heads)", "tests/nn"),
    M("t5-bucket-sign", "attnlab/nn/positions.py",
      "bucket = bucket + (relative_position > 0).long() * num_buckets",
      "bucket = bucket + (relative_position < 0).long() * num_buckets",
      "T5 bidirectional buckets give the upper half to past keys instead of future ones", "tests/nn"),
    M("shaw-distance-sign", "attnlab/nn/positions.py",
      "d = k_pos[:, None, :] - q_pos[:, :, None]", "d = q_pos[:, :, None] - k_pos[:, None, :]",
      "Shaw relative positions index the tables by i - j instead of j - i", "tests/nn"),
    M("gelu-tanh-exact", "attnlab/nn/activations.py",
      '_gelu_tanh = partial(F.gelu, approximate="tanh")', '_gelu_tanh = partial(F.gelu, approximate="none")',
      "gelu_tanh (GPT-2's gelu_new, T5's gated-gelu) computes the exact erf GELU", "tests/nn"),
    M("kv-cache-position-stuck", "attnlab/nn/kv_cache.py",
      "new = self._positions[:, n - 1:n] + 1", "new = self._positions[:, n - 1:n]",
      "a cached decoding step reuses the last position instead of advancing it", "tests/nn"),
    M("gqa-head-mapping", "attnlab/nn/kernels/base.py",
      "return k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)",
      "return k.repeat(1, n, 1, 1), v.repeat(1, n, 1, 1)",
      "grouped-query attention tiles key/value heads (h -> h % G) instead of grouping them (h -> h // (H/G))",
      "tests/nn"),
    M("rmsnorm-eps-dropped", "attnlab/nn/norms.py",
      '"rmsnorm": lambda d_model, eps, bias: nn.RMSNorm(d_model, eps=eps)',
      '"rmsnorm": lambda d_model, eps, bias: nn.RMSNorm(d_model)',
      "RMSNorm ignores the configured eps (falls back to the dtype's machine epsilon)", "tests/nn"),
    M("loss-ignored-rows-get-gradient", "attnlab/nn/losses.py",
      "row_scale = valid.to(acc) / count", "row_scale = torch.ones_like(valid, dtype=acc) / count",
      "fused cross-entropy: ignore-index rows drop out of the loss but still get gradient", "tests/nn"),
    M("label-smoothing-grad", "attnlab/nn/losses.py",
      "lp.sub_(label_smoothing / V)", "lp.sub_(label_smoothing / (V - 1))",
      "fused cross-entropy's gradient uses the eps/(V-1) smoothing convention, its value eps/V", "tests/nn"),
    # ---- models ----
    M("model-positions-ignore-cache", "attnlab/models/transformer.py",
      "position_ids = torch.arange(past + held, past + held + T, device=device)[None]",
      "position_ids = torch.arange(held, held + T, device=device)[None]",
      "new tokens after a cache restart their positions at 0", "tests/models"),
    M("pool-mean-over-padding", "attnlab/models/heads.py",
      "return (hidden * m).sum(1) / m.sum(1).clamp(min=1)", "return (hidden * m).sum(1) / m.shape[1]",
      "mean pooling divides by the padded length, so padding changes a sentence's vector", "tests/models"),
    # ---- data ----
    M("seq2seq-labels-pad-id", "attnlab/data/objectives.py",
      '"labels": pad(labels, IGNORE)}', '"labels": pad(labels, pad_id)}',
      "translation labels padded with the pad id instead of the ignore index (padding takes loss)",
      "tests/data"),
    M("mlm-split", "attnlab/data/objectives.py",
      "u = torch.rand(ids.shape, generator=generator)\n    to_mask = picked & (u < p_mask)\n"
      "    to_random = picked & (u >= p_mask) & (u < p_mask + p_random)",
      "u = torch.rand(ids.shape, generator=generator)\n    to_mask = picked & (u < p_mask)\n"
      "    to_random = picked & (u < p_random)",
      "MLM 80/10/10 becomes 70/10/20: the random draws overlap the [MASK] ones", "tests/data"),
    # ---- tokenizers ----
    M("bpe-merge-order", "attnlab/tokenizers/bpe.py",
      "if hit is not None and (best is None or hit[0] < best[0]):",
      "if hit is not None and (best is None or hit[0] > best[0]):",
      "BPE applies the latest-learned merge first instead of the lowest rank", "tests/tokenizers"),
    # ---- decoding ----
    M("beam-length-penalty", "attnlab/decoding/beam.py",
      "_add(hyps[b], score / n ** length_penalty, new, K)", "_add(hyps[b], score, new, K)",
      "beam search ranks finished hypotheses without the length penalty", "tests/decoding"),
    M("top-p-off-by-one", "attnlab/decoding/processors.py",
      "drop_sorted = mass_before >= p", "drop_sorted = probs.cumsum(-1) > p",
      "nucleus sampling drops the token that crosses p (the nucleus can be empty of its last member)",
      "tests/decoding"),
    M("beam-early-stop", "attnlab/decoding/beam.py",
      "open_[b] = best_running > hyps[b][-1][0]", "open_[b] = best_running > hyps[b][0][0]",
      "beam search closes a row when its best open beam cannot beat the best finished one, not the worst kept",
      "tests/decoding"),
    # ---- inspect ----
    M("entropy-counts-masked-rows", "attnlab/inspect/heads.py",
      "real = real & (w.sum((1, 2)) > 0)[:, None, :]", "real = real",
      "attention entropy averages in padded query rows (they still attend to the real keys), so a padded batch "
      "scores unlike its rows alone",
      "tests/inspect"),
    # ---- training ----
    M("accumulation-equal-shares", "attnlab/training/strategy/base.py",
      "share = weight / total * self.ctx.dp_size", "share = 1 / len(batches) * self.ctx.dp_size",
      "gradient accumulation weighs micro-batches equally, not by their label tokens", "tests/training"),
    M("weight-decay-norms-biases", "attnlab/training/optim.py",
      'if is_table or name.endswith("bias") or p.dim() < 2:', "if isinstance(module, nn.Embedding):",
      "norm gains, biases and position tables are weight-decayed", "tests/training"),
    M("warmup-off-by-one", "attnlab/training/optim.py",
      "warm = s / warmup_steps if warmup_steps and s <= warmup_steps else 1.0",
      "warm = step / warmup_steps if warmup_steps and s <= warmup_steps else 1.0",
      "linear warmup starts at lr 0, so the first update is wasted", "tests/training"),
    M("rng-not-restored", "attnlab/training/trainer.py",
      "self.random.take_current()  # the checkpoint set the RNG states", "pass",
      "resume keeps the fresh run's RNG state instead of the checkpoint's (dropout masks differ)",
      "tests/training"),
    M("best-checkpoint-not-saved", "attnlab/training/trainer.py",
      'or stop_reason != "max_steps" or improved):', 'or stop_reason != "max_steps"):',
      "an evaluation that improves on the best is not written to disk unless a checkpoint is due",
      "tests/training"),
    # ---- parallel, interop ----
    M("tp-copy-no-allreduce", "attnlab/parallel/comm.py",
      "return all_reduce_sum(grad, ctx.group), None", "return grad, None",
      "tensor parallel: the input copy's backward skips the all-reduce (each rank keeps a partial gradient)",
      "tests/parallel"),
    M("hf-gpt2-proj-not-transposed", "attnlab/interop/gpt2.py",
      'transposed(f"{h}attn.c_proj.weight", f"{o}self_attn.out_proj.weight"),',
      'rename(f"{h}attn.c_proj.weight", f"{o}self_attn.out_proj.weight"),',
      "GPT-2 converter copies the square Conv1D c_proj without transposing it", "tests/interop"),
]


def check_snippets(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """The problems of the list against the tree at `root`: unknown files, snippets found
    other than exactly once, no-op replacements, repeated ids, missing folders (empty: all good)."""
    problems, seen = [], set()
    for m in mutations:
        if m.id in seen:
            problems.append(f"{m.id}: id used twice")
        seen.add(m.id)
        file = root / m.path
        if not file.is_file():
            problems.append(f"{m.id}: {m.path} does not exist")
            continue
        count = file.read_text(encoding="utf-8").count(m.old)
        if count != 1:
            problems.append(f"{m.id}: snippet found {count} times in {m.path} (expected once): {m.old!r}")
        if m.old == m.new:
            problems.append(f"{m.id}: the replacement equals the snippet")
        if not (root / m.folder).exists():
            problems.append(f"{m.id}: test folder {m.folder} does not exist")
    return problems


def copy_tree(root: Path, dest: Path) -> None:
    """The files git tracks plus the untracked, not-ignored ones (the working tree as it is)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)


def run_pytest(tree: Path, target: str, timeout: float, *, stop_first: bool, marker: str,
               deselect: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict:
    """Run pytest on `target` inside `tree` (`env`: extra environment variables); returns status
    (passed, failed, timeout, no tests), the failing test ids and the seconds."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-m", marker, target]
    cmd += ["-x"] if stop_first else []
    cmd += [f"--deselect={d}" for d in deselect]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    start = time.perf_counter()
    # its own session, so a timeout ends the workers a test started (tests/parallel spawns some) too
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "timeout", "failing": [], "seconds": round(time.perf_counter() - start, 1)}
    seconds = round(time.perf_counter() - start, 1)
    failing = [m.group(2) for m in _FAILED.finditer(stdout)]
    if proc.returncode == 0:
        return {"status": "passed", "failing": [], "seconds": seconds}
    if proc.returncode == 5:  # nothing collected (everything deselected or marked)
        return {"status": "no tests", "failing": [], "seconds": seconds}
    if not failing:  # a crash before any test (import error in conftest, usage error)
        failing = [stdout.strip().splitlines()[-1] if stdout.strip() else stderr.strip()[-200:]]
    return {"status": "failed", "failing": failing, "seconds": seconds}


def run_one(tree: Path, m: Mutation, target: str, timeout: float, marker: str, deselect: tuple[str, ...],
            env: dict[str, str] | None = None) -> dict:
    """Plant `m` in `tree`, run `target`, restore the file."""
    file = tree / m.path
    original = file.read_text(encoding="utf-8")
    file.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
    try:
        res = run_pytest(tree, target, timeout, stop_first=True, marker=marker, deselect=deselect, env=env)
    finally:
        file.write_text(original, encoding="utf-8")
    verdict = {"failed": "caught", "passed": "missed", "no tests": "missed", "timeout": "timeout"}[res["status"]]
    return {"id": m.id, "path": m.path, "folder": target, "description": m.description, "result": verdict,
            "first_failure": res["failing"][0] if res["failing"] else None, "seconds": res["seconds"]}


def markdown(report: dict) -> str:
    lines = ["| mutation | module | tests | result | first failing test | s |", "|---|---|---|---|---|---|"]
    for r in report["mutations"]:
        lines.append(f"| `{r['id']}` | {r['path']} | {r['folder']} | {r['result']} | "
                     f"{'`' + r['first_failure'] + '`' if r['first_failure'] else ''} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--only", default="", help="comma-separated mutation ids (default: all)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    ap.add_argument("--jobs", type=int, default=1, help="mutations run at once, each in its own copy (default 1)")
    ap.add_argument("--full", action="store_true", help="run the whole default suite (tests/), not the module's folder")
    ap.add_argument("--slow", action="store_true", help="include tests marked slow")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table after the JSON")
    ap.add_argument("--out", type=Path, help="also write the JSON report to this file")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.timeout <= 0:
        ap.error(f"--timeout must be > 0, got {args.timeout}")

    chosen = MUTATIONS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = sorted(set(wanted) - {m.id for m in MUTATIONS})
        if unknown:
            ap.error(f"--only: unknown mutation ids {', '.join(unknown)} (see --list)")
        chosen = [m for m in MUTATIONS if m.id in wanted]
    if args.list:
        for m in chosen:
            print(f"{m.id:32} {m.path:40} {m.folder:18} {m.description}")
        return 0
    problems = check_snippets(chosen)
    if problems:
        print("mutation list out of date:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    marker = "" if args.slow else "not slow"
    report = run_all(chosen, full=args.full, marker=marker, timeout=args.timeout, jobs=args.jobs, out=args.out)
    print(json.dumps(report, indent=2))
    if args.markdown:
        print()
        print(markdown(report))
    return 1 if report["summary"]["missed"] else 0


def tree_version(root: Path = ROOT) -> str:
    """HEAD's commit, with "+changes" when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def run_all(chosen: list[Mutation], *, full: bool, marker: str, timeout: float, jobs: int,
            out: Path | None, root: Path = ROOT) -> dict:
    """Baselines, then every mutation, in copies of the working tree at `root`; the report
    (written to `out` after each mutation, with "complete": false until the last, so a long run
    can be read while it goes)."""
    target_of = (lambda m: "tests") if full else (lambda m: m.folder)
    head = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tree": tree_version(root),
            "full": full, "marker": marker or None, "timeout": timeout}
    results: list[dict] = []
    lock = threading.Lock()

    def report(complete: bool) -> dict:
        order = [m.id for m in chosen]
        done = sorted(results, key=lambda r: order.index(r["id"]))
        return {**head, "complete": complete, "baseline": baseline, "mutations": done,
                "summary": {k: [r["id"] for r in done if r["result"] == k] for k in ("caught", "missed", "timeout")},
                "list": [asdict(m) for m in chosen]}

    def save(complete: bool) -> None:
        if out is not None:
            sys.path.insert(0, str(ROOT))
            from attnlab.io.files import atomic_write_bytes
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(out, (json.dumps(report(complete), indent=2) + "\n").encode())

    with tempfile.TemporaryDirectory(prefix="attnlab-mutations-") as tmp:
        trees = []
        for i in range(min(jobs, len(chosen))):
            trees.append(Path(tmp) / f"tree{i}")
            copy_tree(root, trees[-1])
        # the unmutated baseline of each folder: its failures are deselected, so they cannot count as catches
        baseline = {}
        for target in dict.fromkeys(map(target_of, chosen)):
            baseline[target] = res = run_pytest(trees[0], target, timeout, stop_first=False, marker=marker)
            print(f"baseline {target}: {res['status']} ({len(res['failing'])} failing, {res['seconds']} s)",
                  file=sys.stderr)

        def lane(jobs_: list[Mutation], tree: Path) -> None:
            for m in jobs_:  # one tree per lane: no two runs share a copy
                target = target_of(m)
                r = run_one(tree, m, target, timeout, marker, tuple(baseline[target]["failing"]))
                print(f"{r['result']:7} {m.id} ({r['seconds']} s) {r['first_failure'] or ''}", file=sys.stderr)
                with lock:
                    results.append(r)
                    save(False)

        with ThreadPoolExecutor(len(trees)) as pool:
            list(pool.map(lane, [chosen[k::len(trees)] for k in range(len(trees))], trees))
    save(True)
    return report(True)


if __name__ == "__main__":
    sys.exit(main())
