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

Reduced-precision weights (`--weights bf16 int8`, or `--only weights`): attnlab's batch-1 greedy
with the Linear weights stored as bf16 / int8 (`attnlab.decoding.quantize_weights`) against
attnlab's own fp32 on the same GPT-2-style random weights (vocab 50,304 and 4,096), interleaved
round by round (fp32, bf16, int8, fp32, ...), medians: the whole call (a 32-token prompt, then
the new tokens) and the decoding steps alone (`step_*`: the call less a call for the prompt and
one token); the bandwidth fraction counts the bytes a step really reads (1 per int8 weight + its
scales, 2 per bf16 weight); `matrices_*` times a step's matrix products alone (every Linear
once on one row, best of 3 per round), which is where the weights are read. The 6-layer model's
fp32 weights (50-120 MB) can sit in a large server CPU's last-level cache, where a step is not
bound by memory bandwidth and fewer bytes per weight need not pay; so the same comparison also
runs on a 355M-parameter shape (24 layers, d_model 1024, vocab 50,304: 1.4 GB of fp32 weights,
32 new tokens; `--no-large` skips it), which every CPU streams from memory. Then the quality
cost on a trained model: top-1 agreement with fp32 (teacher-forced on fp32's own 256-token
greedy runs: the same context for both, so one early divergence does not count twice), how
much of each free-running greedy run stays identical, and the validation perplexity of each.
The trained model is, by default, a small char model trained here on Shakespeare for
`--quality-steps` steps (attnlab's cached corpus; The Tempest is the validation text); give a
run of your own with `--quality-model FOLDER` (written by attnlab.save with its tokenizer)
and `--quality-text valid.txt`.

    python benchmarks/bench_generate.py                  # everything (a few minutes on a CPU)
    python benchmarks/bench_generate.py --quick          # fewer tokens and repeats
    python benchmarks/bench_generate.py --quick --threads 1 --only greedy   # a busy machine, greedy cases
    python benchmarks/bench_generate.py --only weights --threads 1          # bf16/int8 weights: speed, quality
    python benchmarks/bench_generate.py --only weights --quality-model runs/my-lm --quality-text valid.txt
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F
import transformers

from attnlab.decoding import QuantizedLinear, generate, quantize_weights
from attnlab.interop import from_hf
from attnlab.nn.linear import fixed_layouts, project
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
    head_weight = id(head.proj.weight) if head is not None and isinstance(head.proj, torch.nn.Linear) else None
    decoder = getattr(model, "decoder", model)
    for p in decoder.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in embeddings and id(p) != head_weight:
            total += p.shape[-1] * p.element_size()  # one row
        else:
            total += p.numel() * p.element_size()
    for m in decoder.modules():  # reduced-precision weights are buffers: their stored bytes
        if isinstance(m, QuantizedLinear):
            total += sum(t.numel() * t.element_size() for t in (m.qweight, m.scale, m.bias) if t is not None)
    return total


def matrix_bytes(model: torch.nn.Module) -> int:
    """Bytes of the matrices (and biases, scales) of every Linear, shared ones once."""
    seen, total = set(), 0
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            tensors = (m.weight, m.bias)
        elif isinstance(m, QuantizedLinear):
            tensors = (m.qweight, m.scale, m.bias)
        else:
            continue
        for t in tensors:
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _gpt2(vocab: int, device: torch.device, d_model: int = 384, layers: int = 6) -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=512, n_embd=d_model, n_layer=layers,
                                  n_head=d_model // 64, bos_token_id=0, eos_token_id=0)
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


def run_weights_case(vocab: int, formats: list[str], new: int, repeats: int, device: torch.device,
                     bandwidth: float, d_model: int = 384, layers: int = 6) -> dict:
    """Batch-1 greedy of attnlab with fp32 and reduced-precision weights (same random weights),
    interleaved round by round; ratios against fp32 from the medians. Each round also times the
    prompt and one new token alone, so that the decoding steps' own time is known: (all `new`
    tokens - prompt and one token) / (new - 1). A step reads every weight once; the prompt's 32
    rows are a matrix product, bound by arithmetic rather than memory."""
    ours = from_hf(_gpt2(vocab, torch.device("cpu"), d_model, layers)).to(device).eval()
    models = {"fp32": ours, **{f: quantize_weights(ours, f) for f in formats}}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, 32), generator=g).to(device)

    def runner(model, tokens):
        return lambda: generate(model, ids, tokens, pad_token_id=1)

    def matrices(model):
        """A step's matrix products alone: every Linear once, on one row, through the call a
        decoding loop makes (`project` in `fixed_layouts`)."""
        mods = [m for m in model.modules() if type(m) in (torch.nn.Linear, QuantizedLinear)]
        rows = [torch.randn(1, m.in_features, device=device) for m in mods]

        def run():
            with torch.no_grad(), fixed_layouts(model):
                for m, x in zip(mods, rows):
                    project(m, x)
        return run

    for model in models.values():  # warm-up: inference layouts, oneDNN's blocked weights, the kernels' build
        runner(model, new)()
    wall = {f: [] for f in models}
    cpu = {f: [] for f in models}
    first = {f: [] for f in models}
    products = {f: [] for f in models}
    alone = {f: matrices(model) for f, model in models.items()}
    for _ in range(repeats):
        for f, model in models.items():
            t, c, _ = _time(runner(model, new), device)
            wall[f].append(t)
            cpu[f].append(c)
            first[f].append(_time(runner(model, 1), device)[0])
            products[f].append(min(_time(alone[f], device)[0] for _ in range(3)))
    med = {f: statistics.median(v) for f, v in wall.items()}
    step = {f: max(statistics.median(wall[f]) - statistics.median(first[f]), 1e-9) / (new - 1) for f in models}
    result = {"case": f"greedy gpt2-{layers}L-{d_model} V={vocab} batch 1, weights", "vocab": vocab,
              "d_model": d_model, "layers": layers, "prompt_tokens": ids.shape[1], "new_tokens": new, "formats": {}}
    for f, model in models.items():
        bytes_tok = weight_bytes_per_token(model)
        result["formats"][f] = {
            "tok_per_s": round(new / med[f], 1),
            "speedup_vs_fp32": round(med["fp32"] / med[f], 3),
            "cpu_speedup_vs_fp32": round(statistics.median(cpu["fp32"]) / statistics.median(cpu[f]), 3),
            "weight_bytes_per_token": bytes_tok,
            "fraction_of_bandwidth_limit": round(bytes_tok / (med[f] / new) / 1e9 / bandwidth, 3),
            "step_ms": round(step[f] * 1e3, 2),
            "step_speedup_vs_fp32": round(step["fp32"] / step[f], 3),
            "step_fraction_of_bandwidth_limit": round(bytes_tok / step[f] / 1e9 / bandwidth, 3),
            "prompt_and_one_token_s": round(statistics.median(first[f]), 4),
            "matrices_ms": round(statistics.median(products[f]) * 1e3, 2),
            "matrices_fraction_of_bandwidth_limit": round(matrix_bytes(model) / statistics.median(products[f])
                                                          / 1e9 / bandwidth, 3),
            "s": [round(t, 4) for t in wall[f]], "cpu_s": [round(t, 4) for t in cpu[f]],
        }
    return result


# ---------------------------------------------------------------- quality cost on a trained model

def _shakespeare() -> tuple[str, str]:
    from attnlab.data import corpora

    folder = corpora.fetch("shakespeare")
    return (folder / "train.txt").read_text(encoding="utf-8"), (folder / "valid.txt").read_text(encoding="utf-8")


def train_char_model(text: str, steps: int, seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A small char model (4 layers, d_model 128, the demo recipe's shape) trained for `steps`
    AdamW steps on random 128-character windows of `text`: quick, and peaked enough to be a
    fair test of the weights' precision (a random model's near-ties are not)."""
    from attnlab import ModelConfig, build_model
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train([text], kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    data = torch.tensor(tok.encode(text))
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=128, num_layers=4, num_heads=4, d_ff=512,
                      activation="gelu", dropout=0.0, norm_placement="pre",
                      position={"scheme": "rotary", "max_len": 512})
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for group in opt.param_groups:  # warmup, then cosine to a tenth
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(math.pi * step / steps))
        starts = torch.randint(0, len(data) - 129, (16,), generator=g)
        x = torch.stack([data[s:s + 129] for s in starts])
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model.eval(), tok


@torch.no_grad()
def _mean_nll(model: torch.nn.Module, windows: torch.Tensor, batch: int = 16) -> float:
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


@torch.no_grad()
def quality_cost(model: torch.nn.Module, tok, text: str, formats: list[str], *, new: int, prompts: int,
                 window: int, max_windows: int) -> dict:
    """Top-1 agreement with fp32 and the validation perplexity of each storage, on `text`."""
    device = next(model.parameters()).device
    data = torch.tensor(tok.encode(text), device=device)
    span = window + 1
    n_windows = min(max_windows, (len(data) - 1) // span)
    if n_windows < 1 or len(data) < 32 + prompts:
        raise ValueError(f"the validation text has {len(data)} tokens: too few for {window}-token windows")
    windows = data[:n_windows * span].view(n_windows, span)
    starts = torch.linspace(0, len(data) - 33, prompts).long().tolist()
    prompt_ids = torch.stack([data[s:s + 32] for s in starts])  # (prompts, 32)
    models = {"fp32": model, **{f: quantize_weights(model, f) for f in formats}}
    reference = generate(model, prompt_ids, new)  # (prompts, 32 + new): fp32's greedy runs
    out = {"validation_tokens": n_windows * window, "prompts": prompts, "new_tokens": new, "formats": {}}
    nll32 = _mean_nll(model, windows)
    choice32 = model(reference[:, :-1])[:, 31:].argmax(-1)  # fp32's choice at each new position
    for f, m in models.items():
        nll = nll32 if f == "fp32" else _mean_nll(m, windows)
        row = {"val_nll": round(nll, 5), "val_perplexity": round(math.exp(nll), 4),
               "perplexity_change": round(math.exp(nll - nll32) - 1, 6)}
        if f != "fp32":
            choice = m(reference[:, :-1])[:, 31:].argmax(-1)  # the same contexts as fp32's
            own = generate(m, prompt_ids, new)[:, 32:]
            same = own == reference[:, 32:]
            prefix = [int(r.long().cumprod(0).sum()) for r in same]  # tokens before the first divergence
            row.update(top1_agreement=round((choice == choice32).float().mean().item(), 5),
                       greedy_runs_identical=f"{sum(p == new for p in prefix)}/{prompts}",
                       greedy_identical_prefix_mean=round(statistics.mean(prefix) / new, 4))
        out["formats"][f] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (median)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--beam-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--quick", action="store_true", help="64 new tokens, 2 repeats")
    parser.add_argument("--only", choices=["greedy", "beam", "weights"], default=None, help="run only these cases")
    parser.add_argument("--weights", nargs="+", choices=["bf16", "int8"], default=None,
                        help="also time batch-1 greedy with these reduced-precision weights against fp32, and "
                             "measure their quality cost (default with --only weights: bf16 int8)")
    parser.add_argument("--no-large", action="store_true",
                        help="skip the weights case of a 355M-parameter GPT-2 shape (24 layers, d_model 1024: "
                             "1.4 GB of fp32 weights, about 4 GB of memory with its bf16 and int8 copies)")
    parser.add_argument("--quality-model", default=None,
                        help="a decoder saved by attnlab.save with its tokenizer (default: train a small char "
                             "model on Shakespeare here)")
    parser.add_argument("--quality-text", default=None,
                        help="validation text for --quality-model (default: The Tempest, attnlab's shakespeare valid)")
    parser.add_argument("--quality-steps", type=int, default=600, help="training steps of the default char model")
    parser.add_argument("--quality-prompts", type=int, default=8, help="greedy runs compared with fp32 (default 8)")
    parser.add_argument("--quality-windows", type=int, default=200,
                        help="validation windows of 128 tokens for the perplexity (default 200)")
    args = parser.parse_args()
    if args.only == "weights" and not args.weights:
        args.weights = ["bf16", "int8"]
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
    quality = None
    if args.weights and args.only in (None, "weights"):
        for vocab in (50304, 4096):
            cases.append(run_weights_case(vocab, args.weights, args.new_tokens, args.repeats, device, bandwidth))
        if not args.no_large:  # 355M parameters: 1.4 GB of fp32 weights, beyond any CPU cache
            cases.append(run_weights_case(50304, args.weights, min(args.new_tokens, 32), args.repeats, device,
                                          bandwidth, d_model=1024, layers=24))
        quality = weights_quality(args, device)
    print(json.dumps({
        "benchmark": "generate", "device": str(device), "loadavg_before": load_before, "loadavg_after": loadavg(),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "memory_bandwidth_GBps": round(bandwidth, 2), "cases": cases,
        **({"weights_quality": quality} if quality is not None else {}),
    }, indent=2))


def weights_quality(args: argparse.Namespace, device: torch.device) -> dict:
    """The quality cost of --weights on --quality-model (or a char model trained here)."""
    if args.quality_model is not None:
        from attnlab.interop.serialization import load

        model, tok = load(args.quality_model, with_tokenizer=True)
        if tok is None or hasattr(model, "encode"):
            raise SystemExit(f"--quality-model {args.quality_model}: needs a decoder saved with its tokenizer")
        if args.quality_text is None:
            raise SystemExit("--quality-model needs --quality-text (its validation text)")
        with open(args.quality_text, encoding="utf-8") as f:
            text = f.read()
        source = {"model": args.quality_model, "text": args.quality_text}
        window = min(128, model.config.position.max_len - 1)
    else:
        train, text = _shakespeare()
        t = time.perf_counter()
        model, tok = train_char_model(train, args.quality_steps)
        source = {"model": f"char 4L-128 trained here on shakespeare, {args.quality_steps} steps "
                           f"({time.perf_counter() - t:.0f} s)", "text": "shakespeare valid (The Tempest)"}
        window = 128
    model = model.to(device).eval()
    new = min(256, model.config.position.max_len - 32)  # prompt + run within the model's context
    result = quality_cost(model, tok, text, args.weights, new=new, prompts=args.quality_prompts, window=window,
                          max_windows=args.quality_windows)
    return {**source, **result}


if __name__ == "__main__":
    main()
