"""Sequence-to-sequence training throughput: attnlab's encoder-decoder against Hugging Face
MarianMT and `torch.nn.Transformer`, the same sizes, the same batch, in one run.

The shape is the Transformer base (Vaswani et al. 2017): 6 + 6 post-LN layers, d_model 512, 8
heads, d_ff 2048, a shared vocabulary (default 32,000) with the embedding tied to the output
layer, sinusoidal positions, dropout 0; batch 8 x 64 source and 64 target tokens, no padding.
- Marian: `MarianMTModel` built from that config (sdpa attention), its own `labels=` loss.
- attnlab: the same Marian converted by `attnlab.from_hf` (identical weights and function), and
  the step `attnlab train` runs (`batch_loss`: the output layer fused into a chunked
  cross-entropy).
- nn.Transformer: `torch.nn.Transformer(batch_first=True)` with the same sizes and activation,
  plus the embedding (scaled by sqrt(d), as Marian's config says), sinusoidal positions and a tied
  output layer, `F.cross_entropy` on its logits.
All three step with torch's fused AdamW. Steps are interleaved (A B C, C B A, ...), medians are
reported, and the median of the per-round ratios. MFU: the FLOPs of one attnlab step (forward
and backward, counted by `torch.utils.flop_counter`) over its time, against the fp32 (or bf16)
matmul peak sampled in the same run.

    python benchmarks/bench_seq2seq_train.py                       # prints one JSON object
    python benchmarks/bench_seq2seq_train.py --threads 1 --steps 3 --vocab 8000
    python benchmarks/bench_seq2seq_train.py --bf16                # all three under bf16 autocast
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from machine import PEAKS, loadavg, sample_peaks

SIDES = ("attnlab", "marian", "nn_transformer")


def marian_config(vocab: int, d: int, layers: int, heads: int, d_ff: int):
    from transformers import MarianConfig

    return MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=d, encoder_layers=layers,
                        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                        encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff, dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, max_position_embeddings=512, pad_token_id=vocab - 1,
                        decoder_start_token_id=vocab - 1, eos_token_id=0, share_encoder_decoder_embeddings=True,
                        attn_implementation="sdpa")


class TorchSeq2Seq(nn.Module):
    """`nn.Transformer` with what a translation model needs around it: a shared embedding scaled
    by sqrt(d), sinusoidal positions, and the output layer tied to the embedding."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, d_ff: int, activation, max_len: int = 512):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=0.02)  # Marian's init_std: N(0, 1) rows make logits in the hundreds
        self.core = nn.Transformer(d, heads, layers, layers, d_ff, dropout=0.0, activation=activation,
                                   batch_first=True)
        pos = torch.arange(max_len)[:, None] * torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        table = torch.zeros(max_len, d)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("positions", table, persistent=False)
        self.scale = math.sqrt(d)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.embed(src) * self.scale + self.positions[:src.shape[1]]
        y = self.embed(tgt) * self.scale + self.positions[:tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        hidden = self.core(x, y, tgt_mask=causal, tgt_is_causal=True)
        return F.linear(hidden, self.embed.weight)


def build(side: str, args: argparse.Namespace):
    """The model of `side` (fresh random weights), its training step (one batch -> loss value),
    and its loss (one batch -> loss tensor)."""
    from attnlab.interop import from_hf
    from attnlab.training.tasks.batch_loss import batch_loss

    from transformers import MarianMTModel

    config = marian_config(args.vocab, args.d_model, args.layers, args.heads, args.d_ff)
    if side == "attnlab":
        model = from_hf(MarianMTModel(config))
    elif side == "marian":
        model = MarianMTModel(config)
    else:  # the same sizes and activation; no Marian built only to read them
        act = config.activation_function
        model = TorchSeq2Seq(args.vocab, args.d_model, args.layers, args.heads, args.d_ff,
                             F.silu if act in ("swish", "silu") else act)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else nullcontext

    def loss_of(src: torch.Tensor, tgt_in: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if side == "attnlab":
            return batch_loss(model, {"src_ids": src, "tgt_ids": tgt_in, "labels": labels})
        if side == "marian":
            return model(input_ids=src, decoder_input_ids=tgt_in, labels=labels).loss
        return F.cross_entropy(model(src, tgt_in).flatten(0, 1).float(), labels.flatten())

    def step(src: torch.Tensor, tgt_in: torch.Tensor, labels: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_of(src, tgt_in, labels)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return model, step, loss_of


def step_flops(loss_of, batch) -> int:
    """FLOPs of one forward + backward (torch's flop counter: matmuls and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_of(*batch).backward()
    return counter.get_total_flops()


def precision(args: argparse.Namespace) -> str:
    return "bf16" if args.bf16 else "fp32"


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    sides = {side: build(side, args) for side in SIDES}
    g = torch.Generator().manual_seed(0)
    B, S, T = args.batch, args.src_len, args.tgt_len
    src = torch.randint(0, args.vocab - 1, (B, S), generator=g)
    tgt = torch.randint(0, args.vocab - 1, (B, T + 1), generator=g)
    batch = (src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous())
    flops = step_flops(sides["attnlab"][2], batch)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(args.warmup + args.steps):
        sample_peaks(precisions=(precision(args),))
        order = list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]
        for side in order:
            t = time.perf_counter()
            sides[side][1](*batch)
            if i >= args.warmup:
                times[side].append(time.perf_counter() - t)
    peak = PEAKS[precision(args)]
    tokens = B * (S + T)
    out = {"benchmark": "seq2seq_train", "shape": {"d_model": args.d_model, "layers": f"{args.layers}+{args.layers}",
                                                   "heads": args.heads, "d_ff": args.d_ff, "vocab": args.vocab,
                                                   "batch": B, "src_len": S, "tgt_len": T},
           "precision": "bf16" if args.bf16 else "fp32", "threads": torch.get_num_threads(),
           "measured_steps": args.steps, "params": {s: sum(p.numel() for p in m[0].parameters()) for s, m in sides.items()},
           "attnlab_step_flops": flops, "matmul_peak_flops": peak}
    for side in SIDES:
        med = statistics.median(times[side])
        out[f"{side}_step_s"] = round(med, 4)
        out[f"{side}_tokens_per_s"] = round(tokens / med, 1)
        out[f"{side}_step_s_all"] = [round(t, 4) for t in times[side]]
    out["attnlab_mfu"] = round(flops / out["attnlab_step_s"] / peak, 4)
    for peer in ("marian", "nn_transformer"):
        out[f"ratio_vs_{peer}"] = round(out[f"{peer}_step_s"] / out["attnlab_step_s"], 3)
        paired = [p / a for p, a in zip(times[peer], times["attnlab"])]
        out[f"ratio_vs_{peer}_paired_median"] = round(statistics.median(paired), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6, help="encoder layers = decoder layers")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=64)
    p.add_argument("--tgt-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=8, help="measured steps per side (median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bf16", action="store_true", help="all three under bf16 autocast")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sample_peaks(2048, precisions=(precision(args),))
    load = loadavg()
    result = run(args)
    print(json.dumps({**result, "loadavg_start": load, "loadavg_end": loadavg()}, indent=1))


if __name__ == "__main__":
    main()
