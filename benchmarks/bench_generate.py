"""Decoding speed: attnlab.generate against Hugging Face `generate` (both with their KV cache)
on the same random weights, in one run, interleaved, medians. Prints JSON.

Cases (defaults):
- greedy, GPT-2-style decoder (6 layers, d_model 384, 6 heads), vocab 50,304 and 4,096,
  a 32-token prompt then 256 new tokens, batch 1 and batch 8;
- 4-beam search, BART-like encoder-decoder (6 + 6 layers, d_model 384, 6 heads, vocab
  50,304), 32-token sources, 64 new tokens, batch 1 and 4.

Timings are wall time (the `speedup`) and CPU time of this process (`cpu_speedup`, the steadier
one on a shared machine); `loadavg` is recorded before and after. attnlab decodes through the
stack's `step` (the same modules as the forward, the decoding fast path), whose weights take
their inference layout (attnlab.nn.linear) on the first call (the warm-up) and keep it while
the parameters are unchanged.

At batch 1 the report adds the fraction of the memory-bandwidth limit reached:
(bytes of weights read per new token / seconds per token) / the bandwidth of a large tensor
copy measured in the same run. No EOS is set, so every run produces all its tokens.

    python benchmarks/bench_generate.py                  # everything (a few minutes on a CPU)
    python benchmarks/bench_generate.py --quick          # fewer tokens and repeats
    python benchmarks/bench_generate.py --quick --threads 1 --only greedy   # a busy machine, greedy cases
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import transformers

from attnlab.decoding import generate
from attnlab.interop import from_hf
from machine import loadavg


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def memory_bandwidth(device: torch.device, mib: int = 512, repeats: int = 5) -> float:
    """GB/s of a large tensor copy (bytes read + bytes written), best of `repeats`."""
    n = mib * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best / 1e9


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of parameters one decoding step reads: every matrix of the decoder stack and the
    LM head, once (tied matrices once); embedding tables contribute one row each."""
    seen, total = set(), 0
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(getattr(model, "decoder", model), "head", None)
    head_weight = id(head.proj.weight) if head is not None else None
    decoder = getattr(model, "decoder", model)
    for p in decoder.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in embeddings and id(p) != head_weight:
            total += p.shape[-1] * p.element_size()  # one row
        else:
            total += p.numel() * p.element_size()
    return total


def _gpt2(vocab: int, device: torch.device) -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=512, n_embd=384, n_layer=6, n_head=6,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).to(device).eval()
    model.generation_config.eos_token_id = None
    return model


def _bart(vocab: int, device: torch.device) -> torch.nn.Module:
    cfg = transformers.BartConfig(vocab_size=vocab, d_model=384, encoder_layers=6, decoder_layers=6,
                                  encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                                  decoder_ffn_dim=1536, max_position_embeddings=512, pad_token_id=1, bos_token_id=0,
                                  eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    model = transformers.BartForConditionalGeneration(cfg).to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.forced_eos_token_id = None
    return model


def _time(fn, device: torch.device) -> tuple[float, float, torch.Tensor]:
    """(wall seconds, CPU seconds of this process, output); CPU time is the steadier measure
    on a shared CPU machine, wall time the one that matters on a GPU."""
    _sync(device)
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, time.process_time() - c, out



def run_case(name: str, hf: torch.nn.Module, batch: int, prompt_len: int, new: int, beams: int, repeats: int,
             device: torch.device, bandwidth: float, seq2seq: bool) -> dict:
    ours = from_hf(hf.cpu()).to(device).eval()
    hf.to(device)
    vocab = hf.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, prompt_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    start = {"decoder_start_token_id": hf.config.decoder_start_token_id} if seq2seq else {}

    def run_ours():
        return generate(ours, ids, new, attention_mask=mask, num_beams=beams, pad_token_id=1, **start)

    def run_hf():
        with torch.no_grad():
            return hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=beams,
                               pad_token_id=1, eos_token_id=None, use_cache=True)

    # one warm-up each, then interleaved timed runs
    a, b = run_ours(), run_hf()
    times_ours, times_hf, cpu_ours, cpu_hf = [], [], [], []
    for _ in range(repeats):
        t, c, a = _time(run_ours, device)
        times_ours.append(t)
        cpu_ours.append(c)
        t, c, b = _time(run_hf, device)
        times_hf.append(t)
        cpu_hf.append(c)
    produced = batch * new
    med_ours, med_hf = statistics.median(times_ours), statistics.median(times_hf)
    result = {
        "case": name, "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new, "num_beams": beams,
        "vocab": vocab, "ours_tok_per_s": round(produced / med_ours, 1), "hf_tok_per_s": round(produced / med_hf, 1),
        "speedup": round(med_hf / med_ours, 3), "ours_s": [round(t, 4) for t in times_ours],
        "hf_s": [round(t, 4) for t in times_hf],
        "cpu_speedup": round(statistics.median(cpu_hf) / statistics.median(cpu_ours), 3),
        "ours_cpu_s": [round(t, 4) for t in cpu_ours], "hf_cpu_s": [round(t, 4) for t in cpu_hf],
        "same_ids": bool(a.shape == b.shape and torch.equal(a.cpu(), b.cpu())),
    }
    if batch == 1 and beams == 1:
        per_token = med_ours / new
        bytes_tok = weight_bytes_per_token(ours)
        result["weight_bytes_per_token"] = bytes_tok
        result["ours_fraction_of_bandwidth_limit"] = round(bytes_tok / per_token / 1e9 / bandwidth, 3)
        result["hf_fraction_of_bandwidth_limit"] = round(bytes_tok / (med_hf / new) / 1e9 / bandwidth, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (median)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--beam-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--quick", action="store_true", help="64 new tokens, 2 repeats")
    parser.add_argument("--only", choices=["greedy", "beam"], default=None, help="run only these cases")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.beam_new_tokens, args.repeats = 64, 16, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    load_before = loadavg()
    bandwidth = memory_bandwidth(device)
    cases = []
    if args.only in (None, "greedy"):
        for vocab in (50304, 4096):
            hf = _gpt2(vocab, device)
            for batch in (1, 8):
                cases.append(run_case(f"greedy gpt2-6L-384 V={vocab}", hf, batch, 32, args.new_tokens, 1,
                                      args.repeats, device, bandwidth, seq2seq=False))
    if args.only in (None, "beam"):
        hf = _bart(50304, device)
        for batch in (1, 4):
            cases.append(run_case("beam4 bart-6+6L-384 V=50304", hf, batch, 32, args.beam_new_tokens, 4,
                                  args.repeats, device, bandwidth, seq2seq=True))
    print(json.dumps({
        "benchmark": "generate", "device": str(device), "loadavg_before": load_before, "loadavg_after": loadavg(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "memory_bandwidth_GBps": round(bandwidth, 2), "cases": cases,
    }, indent=2))


if __name__ == "__main__":
    main()
