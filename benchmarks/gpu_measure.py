"""The measured sections of benchmarks/gpu_check.py: GPT-2 training throughput and MFU (attnlab vs
Hugging Face GPT2LMHeadModel vs a nanoGPT-shaped model written below), and greedy decoding speed
(attnlab.generate vs Hugging Face `generate`).

All three training models have GPT-2 124M's shape (12 layers, 12 heads, d_model 768, context
1024, GELU (tanh), pre-LN, learned positions, tied embeddings) with the vocabulary padded to
50,304 (a multiple of 64, as nanoGPT and llm.c pad it), dropout 0, fused AdamW, bf16 autocast,
interleaved steps (A, B, C, C, B, A, ...), medians. MFU = model FLOPs per token (6 N + 12 L T d;
Kaplan et al. 2020, the convention of PaLM's appendix B) x tokens/s / peak, against two peaks:
a bf16 matmul measured in the same run and the GPU's nominal dense bf16 peak (NOMINAL_BF16).

Notation: B batch, T tokens, D d_model, H heads, Dh = D / H.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, FLOP/s, by a piece of the
# name torch reports; the first match wins (so "H100 PCIe" is tried before the SXM's "H100").
NOMINAL_BF16 = [
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
    ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12),
]


def nominal_bf16_peak(name: str) -> float | None:
    """The nominal dense bf16 FLOP/s of the GPU called `name`, None when it is not in the table."""
    return next((peak for key, peak in NOMINAL_BF16 if key in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_matmul_peak(device: torch.device, n: int, dtype: torch.dtype = torch.bfloat16, reps: int = 10) -> float:
    """FLOP/s of the fastest of `reps` (n, n) x (n, n) products on `device`."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(reps + 2):  # two warm-ups (cuBLAS picks its kernel, clocks rise)
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


# ---------------------------------------------------------------- a nanoGPT-shaped model
@dataclass
class GPTShape:
    vocab: int = 50304
    context: int = 1024
    layers: int = 12
    heads: int = 12
    d_model: int = 768


class _SelfAttention(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.heads = s.heads
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model)  # q | k | v in one product
        self.proj = nn.Linear(s.d_model, s.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash attention where the GPU has it
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class _Block(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(s.d_model), _SelfAttention(s)
        self.ln_2 = nn.LayerNorm(s.d_model)
        self.mlp = nn.Sequential(nn.Linear(s.d_model, 4 * s.d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * s.d_model, s.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """GPT-2 as Radford et al. (2019) describe it and nanoGPT lays it out: token and position
    embeddings, pre-LN blocks, a final LayerNorm, the output head tied to the token embedding;
    weights N(0, 0.02), the residual output projections N(0, 0.02 / sqrt(2 L))."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(s.vocab, s.d_model), nn.Embedding(s.context, s.d_model)
        self.blocks = nn.ModuleList(_Block(s) for _ in range(s.layers))
        self.ln_f = nn.LayerNorm(s.d_model)
        self.lm_head = nn.Linear(s.d_model, s.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * s.layers) if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---------------------------------------------------------------- training throughput
def _attnlab(s: GPTShape) -> nn.Module:
    from attnlab import build_model, presets

    return build_model(presets.get("gpt2-small", vocab_size=s.vocab, d_model=s.d_model, num_layers=s.layers,
                                   num_heads=s.heads, d_ff=4 * s.d_model, dropout=0.0,
                                   position={"scheme": "learned", "max_len": s.context}))


def _hf(s: GPTShape) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=s.vocab, n_positions=s.context, n_embd=s.d_model, n_layer=s.layers, n_head=s.heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                     attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg)


def _step_fn(kind: str, model: nn.Module, device: torch.device, precision: str, compiled: bool):
    """One optimizer step of `model` on a (B, T + 1) batch, as its own training code runs it."""
    from attnlab.training.optim import build_optimizer
    from attnlab.training.setup.speedups import compile_layers
    from attnlab.training.tasks.batch_loss import batch_loss

    fused = {"fused": True} if device.type == "cuda" else {}
    if kind == "attnlab":
        if compiled:
            compile_layers(model)  # what train.compile does: each transformer layer
        opt = build_optimizer(model, "adamw", lr=1e-4, weight_decay=0.1)
        loss_of = lambda x: batch_loss(model, {"input_ids": x[:, :-1], "labels": x[:, 1:]})
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
        run = torch.compile(model) if compiled else model
        if kind == "hf":
            loss_of = lambda x: run(input_ids=x[:, :-1], labels=x[:, :-1]).loss  # HF shifts the labels itself
        else:
            loss_of = lambda x: run(x[:, :-1], x[:, 1:])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else nullcontext

    def step(x: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_of(x)
        loss.backward()
        opt.step()
        return loss
    return step


def model_flops_per_token(s: GPTShape, params_non_embedding: int) -> float:
    """6 (N + V D) + 12 L T D: forward and backward of every weight (the tied head counted once as
    the output product) and of the attention scores and their weighted sum."""
    return 6 * (params_non_embedding + s.vocab * s.d_model) + 12 * s.layers * s.context * s.d_model


def training_throughput(device: torch.device, s: GPTShape, batch: int, steps: int, warmup: int,
                        kinds: tuple[str, ...] = ("attnlab", "hf", "nanogpt"), compile_too: bool = True,
                        precision: str = "bf16", matmul_n: int = 8192, gpu_name: str = "") -> dict:
    """Interleaved training steps of each model in `kinds` (eager, and compiled when `compile_too`);
    tokens/s, step times, MFU against the measured and the nominal peak."""
    builders = {"attnlab": _attnlab, "hf": _hf, "nanogpt": NanoGPT}
    runners = {}
    for kind in kinds:
        for compiled in (False, True) if compile_too else (False,):
            torch.manual_seed(0)
            model = builders[kind](s).to(device).train()
            runners[f"{kind}{'_compiled' if compiled else ''}"] = (model, _step_fn(kind, model, device, precision,
                                                                                   compiled))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, s.vocab, (batch, s.context + 1), generator=g).to(device)
    times = {name: [] for name in runners}
    losses = {}
    compile_s = {}
    for i in range(warmup + steps):
        order = list(runners.items())
        for name, (_, step) in order if i % 2 == 0 else order[::-1]:  # no one always goes first
            sync(device)
            t = time.perf_counter()
            loss = step(x)
            sync(device)
            elapsed = time.perf_counter() - t
            if i == 0:
                compile_s[name] = elapsed  # the first step: compilation (compiled) or allocator warm-up
            if i >= warmup:
                times[name].append(elapsed)
            losses[name] = float(loss.detach())
    peak = measured_matmul_peak(device, matmul_n)
    nominal = nominal_bf16_peak(gpu_name) if device.type == "cuda" else None
    out = {"batch": batch, "context": s.context, "tokens_per_step": batch * s.context, "precision": precision,
           "measured_steps": steps, "warmup_steps": warmup, "matmul_peak_bf16_flops": peak,
           "nominal_peak_bf16_flops": nominal, "models": {}}
    for name, (model, _) in runners.items():
        n = sum(p.numel() for p in model.parameters())  # tied weights counted once
        non_embedding = n - s.vocab * s.d_model - s.context * s.d_model
        per_token = model_flops_per_token(s, non_embedding)
        tokens_per_s = batch * s.context / statistics.median(times[name])
        out["models"][name] = {
            "params": n, "tokens_per_s": tokens_per_s, "step_s_median": statistics.median(times[name]),
            "step_s_all": [round(t, 4) for t in times[name]], "first_step_s": round(compile_s[name], 2),
            "last_loss": losses[name], "model_flops_per_token": per_token,
            "mfu_vs_measured_peak": tokens_per_s * per_token / peak,
            "mfu_vs_nominal_peak": tokens_per_s * per_token / nominal if nominal else None}
    if device.type == "cuda":
        out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    return out


# ---------------------------------------------------------------- decoding
def decoding_speed(device: torch.device, s: GPTShape, batches: tuple[int, ...], prompt_len: int, new_tokens: int,
                   repeats: int) -> dict:
    """Greedy decoding tokens/s (new tokens x rows / s) of attnlab.generate against Hugging Face's
    `generate`, both with their KV cache, the same random GPT-2 weights (converted), fp32, interleaved."""
    from attnlab import generate
    from attnlab.interop import from_hf

    torch.manual_seed(0)
    hf = _hf(s).eval()
    hf.generation_config.eos_token_id = None
    ours = from_hf(hf).to(device).eval()
    hf.to(device)
    out = {"prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats, "cases": {}}
    for batch in batches:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(3, s.vocab, (batch, prompt_len), generator=g).to(device)
        runs = {"attnlab": lambda: generate(ours, ids, new_tokens),
                "hf": lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                          eos_token_id=None, use_cache=True)}
        times = {name: [] for name in runs}
        results = {}
        with torch.no_grad():
            for name, fn in runs.items():
                results[name] = fn()  # warm-up
            for _ in range(repeats):
                for name, fn in runs.items():
                    sync(device)
                    t = time.perf_counter()
                    results[name] = fn()
                    sync(device)
                    times[name].append(time.perf_counter() - t)
        a, b = results["attnlab"], results["hf"]
        same = (a[:, prompt_len:] == b[:, prompt_len:]).float().mean().item() if a.shape == b.shape else 0.0
        case = {name: {"tokens_per_s": batch * new_tokens / statistics.median(ts),
                       "s_all": [round(t, 4) for t in ts]} for name, ts in times.items()}
        case["speedup_attnlab_vs_hf"] = case["attnlab"]["tokens_per_s"] / case["hf"]["tokens_per_s"]
        case["same_tokens_fraction"] = same  # fp32 greedy on the same weights: 1.0 unless near-ties flip
        out["cases"][f"batch_{batch}"] = case
    return out
