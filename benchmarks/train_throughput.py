"""Training throughput of a GPT-2-style decoder: attnlab vs Hugging Face GPT2LMHeadModel.

Both models: 6 layers, 6 heads, d_model 384, context 256, batch 8, GELU (tanh), pre-LN, learned
positions, tied embeddings, dropout 0, AdamW. HF: attn_implementation="sdpa", its own `labels=`
loss, and the optimizer its Trainer picks by default (`adamw_torch_fused`, i.e. torch AdamW with
fused=True, for torch >= 2.8; `--hf-optimizer default` gives plain `torch.optim.AdamW(...)`).
attnlab: exactly the step `attnlab train` runs (`build_optimizer`, `batch_loss` with the output
projection fused into a chunked cross-entropy, `torch.autocast(bf16)` for train.precision=bf16,
zero_grad(set_to_none=True)). Steps are interleaved (A, B, C, A, B, C, ...) so load on a shared
machine hits all alike; medians are reported, and also the median of the per-round ratios
(each round's steps ran back to back, so a load change mostly cancels in them). MFU = model
FLOPs (6 N per token plus the attention term 12 L T d per token, Kaplan et al. 2020) / time,
against a matmul peak sampled in the same run.

    python benchmarks/train_throughput.py                 # prints one JSON object (about 4 min, 2 threads)
    python benchmarks/train_throughput.py --threads 1 --steps 5 --vocab 50304
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch

from machine import PEAKS, loadavg, sample_peaks


def attnlab_model(vocab: int, T: int):
    from attnlab import build_model, presets

    cfg = presets.get("gpt2-small", vocab_size=vocab, d_model=384, num_layers=6, num_heads=6, d_ff=1536, dropout=0.0,
                      position={"scheme": "learned", "max_len": T})
    return build_model(cfg)


def hf_model(vocab: int, T: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab, n_positions=T, n_embd=384, n_layer=6, n_head=6, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                     attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg)


def make_step(kind: str, model, precision: str, hf_optimizer: str = "fused"):
    from attnlab.training.optim import build_optimizer
    from attnlab.training.tasks.batch_loss import batch_loss

    if kind == "attnlab":
        opt = build_optimizer(model, "adamw", lr=1e-4, weight_decay=0.1)
    else:
        fused = {"fused": True} if hf_optimizer == "fused" else {}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else nullcontext

    def step(x: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        with ctx():
            if kind == "attnlab":
                loss = batch_loss(model, {"input_ids": x[:, :-1], "labels": x[:, 1:]})
            else:
                loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def model_flops_per_token(n_params_no_embed: int, vocab: int, d: int, L: int, T: int) -> float:
    # forward + backward = 3 x forward; forward = 2 (N + V d) per token + attention 2 * 2 L T d (causal halves it;
    # counted whole, as in the usual MFU convention)
    return 6 * (n_params_no_embed + vocab * d) + 12 * L * T * d


def run(vocab: int, steps: int, warmup: int, T: int, B: int, pairs: list[tuple[str, str]],
        hf_optimizer: str = "fused") -> dict:
    """Interleaved training steps of each (kind, precision) in `pairs`; tokens/s, medians and
    per-round ratios against HF fp32."""
    torch.manual_seed(0)
    runners = {}
    for kind, precision in pairs:
        model = attnlab_model(vocab, T) if kind == "attnlab" else hf_model(vocab, T)
        model.train()
        runners[(kind, precision)] = (model, make_step(kind, model, precision, hf_optimizer))
    n_attn = sum(p.numel() for p in runners[pairs[0]][0].parameters())
    n_hf = sum(p.numel() for p in runners[next(k for k in runners if k[0] == "hf")][0].parameters())
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (B, T + 1), generator=g)
    times = {k: [] for k in runners}
    for i in range(warmup + steps):
        sample_peaks()
        order = list(runners.items())
        order = order if i % 2 == 0 else order[::-1]  # A B C, C B A, ...: no one always goes first
        for key, (_, step) in order:
            t = time.perf_counter()
            step(x)
            if i >= warmup:
                times[key].append(time.perf_counter() - t)
    tokens = B * T
    out = {"vocab": vocab, "params_attnlab": n_attn, "params_hf": n_hf, "tokens_per_step": tokens,
           "measured_steps": steps, "hf_optimizer": hf_optimizer}
    for (kind, precision), ts in times.items():
        out[f"{kind}_{precision}_tokens_per_s"] = tokens / statistics.median(ts)
        out[f"{kind}_{precision}_step_s_all"] = [round(t, 3) for t in ts]
    hf = out["hf_fp32_tokens_per_s"]
    for (kind, precision) in times:
        if (kind, precision) != ("hf", "fp32"):
            name = f"{kind}_{precision}_vs_hf_fp32"
            out[f"ratio_{name}"] = out[f"{kind}_{precision}_tokens_per_s"] / hf
            paired = [h / t for h, t in zip(times[("hf", "fp32")], times[(kind, precision)])]
            out[f"ratio_{name}_paired_median"] = statistics.median(paired)
    d, L = 384, 6
    non_embed = n_attn - vocab * d - T * d
    out["model_flops_per_token"] = model_flops_per_token(non_embed, vocab, d, L, T)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[50304, 4096])
    parser.add_argument("--steps", type=int, default=8, help="measured steps per model (median), default 8")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument("--hf-bf16", action="store_true", help="also time HF under bf16 autocast")
    parser.add_argument("--hf-optimizer", choices=["fused", "default"], default="fused",
                        help="fused: what HF's Trainer uses by default (adamw_torch_fused); default: "
                             "torch.optim.AdamW's own defaults (a per-parameter loop on CPU)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sample_peaks(2048)
    results = {"threads": torch.get_num_threads(), "loadavg_start": loadavg(), "runs": []}
    for vocab in args.vocab:
        pairs = [("attnlab", "fp32"), ("hf", "fp32")]
        if not args.no_bf16 and vocab == args.vocab[0]:
            pairs.append(("attnlab", "bf16"))
            if args.hf_bf16:
                pairs.append(("hf", "bf16"))
        r = run(vocab, args.steps, args.warmup, 256, 8, pairs, args.hf_optimizer)
        for key in list(r):
            if key.endswith("_tokens_per_s"):
                peak = PEAKS["bf16"] if "_bf16_" in key else PEAKS["fp32"]
                r[key.replace("_tokens_per_s", "_mfu")] = r[key] * r["model_flops_per_token"] / peak
        r["loadavg"] = loadavg()
        results["runs"].append(r)
        print(json.dumps(r), flush=True)
    results["matmul_peak_fp32_flops"], results["matmul_peak_bf16_flops"] = PEAKS["fp32"], PEAKS["bf16"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
