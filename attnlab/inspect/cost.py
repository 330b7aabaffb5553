"""Parameters, FLOPs and activation memory per module, for a config and a sequence length.

Conventions (stated once, used everywhere):
- FLOPs count matrix multiplications only, 2 per multiply-add (so y = x W with x (T, a),
  W (a, b) costs 2 T a b). Softmax, norms, activations, biases and embedding lookups are not
  counted: they are O(T d) or O(T^2 H) and never dominate. This is what
  `torch.utils.flop_counter.FlopCounterMode` counts, which the tests use as the reference.
- One forward pass of B = 1 sequence of T tokens (an encoder-decoder: source and target both T,
  unless `src_len` is given).
- Activation memory: elements a module's forward produces (q, k, v, the T x Tk weights when the
  eager kernel materialises them, the feed-forward hidden), times bytes per element.

Per Transformer layer, with H heads of width Dh, G kv heads, D = d_model, F = d_ff, Tk keys:

    projections   2 T D H Dh (q) + 2 * 2 Tk D G Dh (k, v) + 2 T H Dh D (out)     = 8 T D^2   when H Dh = G Dh = D
    scores+mix    2 H T Tk Dh (q k^T) + 2 H T Tk Dh (weights v)                  = 4 T^2 D   (self-attention)
    feed-forward  2 T D F (W1) + 2 T F D (W2) [+ 2 T D F (gate W3)]              = 4 T D F

So a layer's T^2 term overtakes its T d^2 terms at

    4 T^2 D = 8 T D^2 + 4 T D F   <=>   T* = 2 D + F        (6 D with F = 4 D; 3072 for Vaswani base)

`crossover_seq_len` computes T* from the general per-token costs (GQA, gated FFN, head_dim).

What a layer really computes is read from the model itself, built on the meta device (nothing
allocated): the scores + weighted sum are its kernel's `cost` (`attnlab.nn.kernels.Kernel.cost`:
dense by default; 2 H T b (Dh + Dh) for attention within blocks of b positions; the strided
convolutions plus 2 H T ceil(T / c) (Dh + Dh) for keys and values compressed c-fold), with q' and
k' as wide as the score makes them (the Gaussian score appends a feature) and
the score's own products (`general`'s q W, `additive`'s projections) counted on meta tensors. A
mixture-of-experts feed-forward counts its router (2 T D E) and the experts that run: every token
goes through top_k of the E experts, so k / E of the experts' FLOPs of a dense pass over all of
them (at inference: no capacity limit, no gating noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config import ModelConfig
from attnlab.models.families import family
from attnlab.nn.activations import GATED
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.moe import MoEFeedForward


@dataclass
class CostRow:
    """One module's cost: parameters, forward FLOPs, activation elements."""

    name: str
    params: int
    flops: int
    activations: int


def _meta_model(cfg: ModelConfig) -> nn.Module:
    """The model of `cfg` on the meta device: shapes and modules, no memory."""
    from attnlab.models.build import build_model

    with torch.device("meta"):
        return build_model(cfg).eval()


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per tensor name, counted on the meta device (nothing allocated); a shared
    (tied) tensor is counted once, under the first name it appears with."""
    return _parameter_counts(_meta_model(cfg))


def _parameter_counts(model: nn.Module) -> dict[str, int]:
    seen: set[int] = set()
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        out[name] = p.numel()
    return out


def _sum(params: dict[str, int], prefix: str, parts: tuple[str, ...] = ("",)) -> int:
    return sum(n for k, n in params.items() if k.startswith(prefix) and any(part in k for part in parts))


def _score_flops(score: nn.Module, fused: bool, H: int, G: int, T: int, Tk: int, Dh: int) -> tuple[int, int]:
    """(FLOPs of the score's own matrix products, width of the q'/k' a kernel gets): `prepare`
    (fused scores, k with the G heads the kernel takes) or `forward` (the others, k repeated to H),
    run on meta tensors under FlopCounterMode, so any score is counted as it computes."""
    q = torch.empty(1, H, T, Dh, device="meta")
    k = torch.empty(1, G if fused else H, Tk, Dh, device="meta")
    score = score.to("meta")  # a parameterised score (general, additive) on the meta device
    with FlopCounterMode(display=False) as counter:
        width = score.prepare(q, k)[0].shape[-1] if fused else Dh
        if not fused:
            score(q, k)
    return counter.get_total_flops(), width


def _attention_rows(cfg: ModelConfig, prefix: str, module: MultiHeadAttention, T: int, Tk: int,
                    params: dict[str, int]) -> list[CostRow]:
    D, H, G, Dh = cfg.d_model, cfg.num_heads, cfg.resolved_num_kv_heads, cfg.resolved_head_dim
    proj = 2 * T * D * H * Dh + 2 * 2 * Tk * D * G * Dh + 2 * T * H * Dh * D
    proj_params = _sum(params, prefix + ".", ("qkv_proj", "q_proj", "kv_proj", "out_proj"))
    score, kernel = module.score, module.kernel
    values_term = module.relative is not None and module.relative.value_table is not None
    if score.fused and not values_term:  # the kernel computes it (MultiHeadAttention._kernel_call)
        kv = G if kernel.supports.grouped_kv else H
        extra, width = _score_flops(score, True, H, kv, T, Tk, Dh)
        kc = kernel.cost(T, Tk, num_heads=H, num_kv_heads=G, qk_dim=width, v_dim=Dh, causal=module.causal)
        flops, held = extra + kc.flops, kc.activations
    else:  # scored here, the eager softmax: the H T Tk weights are held
        extra, _ = _score_flops(score, False, H, G, T, Tk, Dh)
        flops, held = extra + 2 * H * T * Tk * Dh, H * T * Tk
    return [
        CostRow(f"{prefix}.projections", proj_params, proj, T * H * Dh + 2 * Tk * G * Dh + T * D),
        CostRow(f"{prefix}.scores", _sum(params, prefix + ".") - proj_params, flops, held + T * H * Dh),
    ]


def _ffn_row(cfg: ModelConfig, name: str, module: nn.Module, T: int, params: dict[str, int]) -> CostRow:
    """A feed-forward: 2 T D F (W1, and W3 when gated) + 2 T F D (W2), holding the T F hidden; a
    mixture of experts: the router's 2 T D E, then each token through top_k experts."""
    D, F = cfg.d_model, cfg.d_ff * (2 if cfg.activation in GATED else 1)  # W1 (and W3) widths
    per_token, hidden = 2 * D * F + 2 * cfg.d_ff * D, F + D
    if isinstance(module, MoEFeedForward):
        E, k = module.num_experts, module.top_k
        return CostRow(name, _sum(params, name + "."), 2 * T * D * E + k * T * per_token, T * E + k * T * hidden)
    return CostRow(name, _sum(params, name + "."), T * per_token, T * hidden)


def _stack_rows(cfg: ModelConfig, prefix: str, n: int, T: int, cross_len: int | None,
                params: dict[str, int], model: nn.Module) -> list[CostRow]:
    rows = []
    for i in range(n):
        p = f"{prefix}layers.{i}"
        layer = model.get_submodule(p)
        rows += _attention_rows(cfg, f"{p}.self_attn", layer.self_attn, T, T, params)
        if cross_len is not None:
            rows += _attention_rows(cfg, f"{p}.cross_attn", layer.cross_attn, T, cross_len, params)
        if layer.ffn is not None:  # (attention-only layers have none)
            rows.append(_ffn_row(cfg, f"{p}.ffn", layer.ffn, T, params))
        norms = _sum(params, f"{p}.", ("_block.",))
        rows.append(CostRow(f"{p}.norms", norms, 0, 0))
    return rows


def cost_table(cfg: ModelConfig, seq_len: int, *, src_len: int | None = None,
               kernel: str | None = None) -> list[CostRow]:
    """Rows of (module, parameters, FLOPs, activation elements) for one sequence.

    Args:
        cfg: a Transformer config (arch decoder, encoder or encoder_decoder).
        seq_len: T (the target length of an encoder-decoder).
        src_len: source length of an encoder-decoder (default seq_len).
        kernel: count the model as if `attention.kernel` were this one (with that kernel's default
            options when it is not the config's): `eager` holds the T x Tk weights, a block-local
            kernel computes T b per head; default: the config's kernel (`auto`/`sdpa` fused for
            dot-product scores).

    Returns:
        The rows; their sums are the model's totals (shared embeddings counted once).

    Raises:
        ValueError: seq_len not positive, or a recurrent arch; ConfigError: a kernel that the
            config's score or arch does not allow.
    """
    if not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    stacks = family(cfg).stacks(cfg)
    if not stacks:
        raise ValueError(f"cost_table counts Transformer configs; arch={cfg.arch!r} is not one")
    if kernel is not None and kernel != cfg.attention.kernel:
        cfg = cfg.replace(attention={**cfg.to_dict()["attention"], "kernel": kernel, "kernel_options": {}})
    S = seq_len if src_len is None else src_len
    model = _meta_model(cfg)
    params = _parameter_counts(model)
    T, D = seq_len, cfg.d_model
    rows: list[CostRow] = []
    for i, (prefix, layers) in enumerate(stacks):  # an encoder-decoder: the encoder over S, then the decoder
        last = i == len(stacks) - 1
        rows += _stack_rows(cfg, prefix, layers, T if last else S, S if i else None, params, model)
    embed_prefixes = tuple(prefix + "embed." for prefix, _ in stacks)
    rows.insert(0, CostRow("embeddings", sum(_sum(params, p) for p in embed_prefixes), 0, T * D))
    if cfg.head == "lm":
        rows.append(CostRow("lm_head", _sum(params, family(cfg).head_prefix(cfg)),
                            2 * T * D * cfg.vocab_size, T * cfg.vocab_size))
    elif cfg.head == "mlm":  # BERT's transform (D x D) and the vocabulary projection
        rows.append(CostRow("mlm_head", _sum(params, "head."), 2 * T * D * D + 2 * T * D * cfg.vocab_size,
                            T * D + T * cfg.vocab_size))
    counted = sum(r.params for r in rows)
    rest = sum(params.values()) - counted  # final norms, pooler, other heads, position biases
    if rest:
        rows.append(CostRow("other", rest, 0, 0))
    return rows


def crossover_seq_len(cfg: ModelConfig) -> float:
    """T* where one self-attention layer's T^2 FLOPs (4 T^2 H Dh) equal its per-token FLOPs
    times T (projections + feed-forward); 2 d_model + d_ff for plain multi-head attention."""
    D, H, G, Dh = cfg.d_model, cfg.num_heads, cfg.resolved_num_kv_heads, cfg.resolved_head_dim
    F = cfg.d_ff * (2 if cfg.activation in GATED else 1)
    per_token = 2 * D * H * Dh + 4 * D * G * Dh + 2 * H * Dh * D + 2 * D * F + 2 * cfg.d_ff * D
    return per_token / (4 * H * Dh)


def format_table(rows: list[CostRow], bytes_per_element: int = 4) -> str:
    """A plain-text table with totals."""
    width = max(len(r.name) for r in rows + [CostRow("total", 0, 0, 0)])
    lines = [f"{'module':<{width}}  {'params':>14}  {'FLOPs':>18}  {'activations':>14}"]
    for r in rows + [CostRow("total", sum(r.params for r in rows), sum(r.flops for r in rows),
                             sum(r.activations for r in rows))]:
        lines.append(f"{r.name:<{width}}  {r.params:>14,}  {r.flops:>18,}  "
                     f"{_human(r.activations * bytes_per_element):>14}")
    return "\n".join(lines)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
