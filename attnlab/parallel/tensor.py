"""Megatron-style tensor parallelism as module surgery on a model from `attnlab.build_model`.

Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053. Notation: n tensor-parallel ranks, r this
rank, H/G query/key-value heads, Dh head_dim, F d_ff, V vocabulary; f and g the conjugate
operators of `attnlab.parallel.comm` (f: all-reduce backward, g: all-reduce forward).

    FeedForward     x -f-> w1 (or fused w1 | w3: F/n rows of each) column-parallel -> act -> w2 row-parallel -g-> + b2
    attention       x -f-> fused q | k | v column-parallel (H/n heads of q, G/n of k and v; a cross-attention's
                    q and fused k | v alike) -> softmax(...) v -> out_proj row-parallel -g-> + b
    embedding       rows [r V'/n, (r+1) V'/n) of E; ids outside give 0, then g sums the ranks
    LM / MLM head   h -f-> logits of the local vocabulary slice (B, T, V'/n), all-gathered to
                    (B, T, V) unless gather_output=False (then use vocab_parallel_cross_entropy)

A vocabulary n does not divide is padded (Megatron-LM pads it too): V' = V rounded up to a
multiple of n, zero rows at the end, on the last rank(s). No id reaches them, and
`vocab_parallel_cross_entropy(..., vocab_size=V)` keeps their logits out of the softmax, so
they get no gradient and stay zero; full checkpoints drop them (`gather_full` trims to V).

One all-reduce forward and one backward per attention and per feed-forward block. Norms,
absolute positions, pooler and classifier heads stay replicated; their gradients agree on every
rank. Per-head parameters are sliced: T5 bias columns, ALiBi slopes, the `general`/`additive`
score weights. Parameters shared by all heads inside the parallel region (Shaw relative tables)
stay whole and their gradients are all-reduced over the group.

Supported: decoder, encoder and encoder-decoder Transformers; scores scaled_dot, dot, cosine,
general, additive; positions none, sinusoidal, learned, binary, rotary, relative, alibi, t5_bias;
grouped kv heads when n divides G. Refused with ValueError: the RNN architecture, the kernels
whose heads cannot be split (`Supports.tensor_parallel`: the long-input ones), head counts or
d_ff that n does not divide. Dropout draws from each rank's generator: seed ranks
alike for replicated regions to match. KV-cache decoding on a sharded model is refused (save the full model, decode with it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.embeddings import Embeddings
from attnlab.models.families import family
from attnlab.models.heads import LMHead, MLMHead
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kernels import KERNELS
from attnlab.nn.layers import FeedForward
from attnlab.nn.positions import ALiBi, T5RelativeBias
from attnlab.nn.scores import Additive, General
from attnlab.parallel.comm import (all_gather_last, all_reduce_sum, copy_to_parallel, gather_from_parallel,
                                   group_rank, group_size, reduce_from_parallel)


def _part(t: Tensor, dim: int, n: int, r: int, blocks: tuple[int, ...] | None) -> Tensor:
    """Chunk r of n along dim; of each block when t holds several fused along dim (sizes `blocks`).
    A size n does not divide (a vocabulary) is padded with zeros at the end first."""
    if not blocks:
        pad = -t.shape[dim] % n
        if pad:
            t = torch.cat([t, t.new_zeros(*t.shape[:dim], pad, *t.shape[dim + 1:])], dim=dim)
        return t.chunk(n, dim=dim)[r]
    return torch.cat([b.chunk(n, dim=dim)[r] for b in t.split(list(blocks), dim=dim)], dim=dim)


def _shard(t: Tensor, dim: int, n: int, r: int, blocks: tuple[int, ...] | None = None) -> nn.Parameter:
    """This rank's part of t (`_part`) as a Parameter that remembers its split: `tp_dim`, the
    unpadded size `tp_full`, and `tp_blocks` for a fused tensor (q | k | v, w1 | w3: each block is
    split, its heads or rows stay with their own kind)."""
    p = nn.Parameter(_part(t.detach(), dim, n, r, blocks).clone(), requires_grad=t.requires_grad)
    p.tp_dim, p.tp_full = dim, t.shape[dim]
    if blocks:
        p.tp_blocks = tuple(blocks)
    return p


def local_part(full: Tensor, p: nn.Parameter, n: int, r: int) -> Tensor:
    """Rank r's part of `full`, a tensor in the full layout of the sharded parameter p (its
    value, a gradient, an optimizer moment)."""
    return _part(full, p.tp_dim, n, r, getattr(p, "tp_blocks", None))


def gather_full(t: Tensor, p: nn.Parameter, group) -> Tensor:
    """The full layout of t, this rank's part of the sharded parameter p (every rank calls)."""
    dim, blocks = p.tp_dim, getattr(p, "tp_blocks", None)
    if not blocks:
        return all_gather_last(t, group, dim=dim).narrow(dim, 0, getattr(p, "tp_full", t.shape[dim] * group_size(group)))
    n = group_size(group)
    return torch.cat([all_gather_last(b, group, dim=dim) for b in t.split([s // n for s in blocks], dim=dim)], dim=dim)


class RowParallelLinear(nn.Linear):
    """y = g(x_r W_r^T) + b: the input features are split over the ranks, the output is whole."""

    def __init__(self, source: nn.Linear, group, n: int, r: int):
        with torch.device("meta"):
            super().__init__(source.in_features // n, source.out_features, bias=source.bias is not None)
        self.group = group
        self.weight = _shard(source.weight, 1, n, r)
        if source.bias is not None:
            self.bias = nn.Parameter(source.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)  # (..., out) summed over ranks
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + V'/n) of a (V, D) embedding (padded to V' rows); `num_embeddings` stays V."""

    def __init__(self, source: nn.Embedding, group, n: int, r: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = source.num_embeddings, source.embedding_dim
        self.group = group
        self.weight = _shard(source.weight, 0, n, r)
        self.start = r * self.weight.shape[0]

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        h = F.embedding(local.masked_fill(outside, 0), self.weight)  # (B, T, D)
        h = h.masked_fill(outside[..., None], 0.0)
        return reduce_from_parallel(h, self.group)


class VocabParallelLinear(nn.Module):
    """Logits of the local vocabulary slice (V'/n columns, a padded vocabulary's last ones zero);
    all-gathered to (..., V) when `gather_output`; `out_features` is V."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, vocab_size: int, group,
                 gather_output: bool):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.in_features, self.out_features = weight.shape[1], vocab_size
        self.group, self.gather_output = group, gather_output

    def forward(self, h: Tensor) -> Tensor:
        logits = F.linear(copy_to_parallel(h, self.group), self.weight, self.bias)  # (..., V'/n)
        if not self.gather_output:
            return logits
        return gather_from_parallel(logits, self.group)[..., :self.out_features]  # (..., V)


def vocab_parallel_cross_entropy(local_logits: Tensor, targets: Tensor, group=None,
                                 ignore_index: int = -100, *, label_smoothing: float = 0.0,
                                 vocab_size: int | None = None) -> Tensor:
    """Mean cross-entropy from vocabulary-sharded logits, never forming the full (N, V) row.

    log-softmax needs max and sum over the whole vocabulary: two all-reduces of (N,) numbers
    and one of the target logit, instead of gathering (N, V) logits (Megatron-LM, section 3).
    Label smoothing eps adds eps (log Z - mean_v x_v - (log Z - x_y)) per row (PyTorch's
    definition, as `attnlab.nn.losses`), one more all-reduce of (N,) sums.

    Args:
        local_logits: (..., V'/n), this rank's slice [r V'/n, (r+1) V'/n) of the (padded) vocabulary.
        targets: (...) global ids; `ignore_index` entries take no loss.
        group (torch.distributed.ProcessGroup | None): the tensor-parallel group.
        label_smoothing: eps in [0, 1).
        vocab_size: V, when the slices hold a padded vocabulary (V' > V columns in all): the
            columns from V on take no probability. Default: every column is a token.

    Returns:
        the scalar mean over the non-ignored targets (equal to F.cross_entropy on the full logits).
    """
    n, r = group_size(group), group_rank(group)
    v_local = local_logits.shape[-1]
    x = local_logits.reshape(-1, v_local).float()
    t = targets.reshape(-1)
    keep = t != ignore_index
    V = v_local * n if vocab_size is None else vocab_size
    padding = torch.arange(r * v_local, (r + 1) * v_local, device=x.device) >= V  # (V/n,) columns past V
    if bool(padding.any()):
        x = x.masked_fill(padding, float("-inf"))
    with torch.no_grad():
        m = x.max(-1).values
        if n > 1:
            torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = x - m[:, None]  # the max is a constant shift: no gradient needed through it
    log_z = reduce_from_parallel(shifted.exp().sum(-1), group).log()  # (N,)
    local = t - r * v_local
    mine = (local >= 0) & (local < v_local) & keep
    picked = torch.where(mine, shifted.gather(1, local.clamp(0, v_local - 1)[:, None])[:, 0], 0.0)  # (N,)
    losses = log_z - reduce_from_parallel(picked, group)
    if label_smoothing:
        mean_logit = reduce_from_parallel(shifted.masked_fill(padding, 0).sum(-1), group) / V  # over the vocabulary
        losses = (1 - label_smoothing) * losses + label_smoothing * (log_z - mean_logit)
    return (losses * keep).sum() / keep.sum().clamp(min=1)


def check_supported(config: ModelConfig, n: int) -> None:
    """Raise ValueError when `config` cannot be split over n tensor-parallel ranks.

    Args:
        config: the model's config.
        n: tensor-parallel degree.

    Raises:
        ValueError: the message names the field, its value and what n requires.
    """
    if family(config).traits.recurrent:
        raise ValueError("tensor parallel supports the Transformer archs (decoder, encoder, encoder_decoder), "
                         f"not arch={config.arch!r}")
    if not KERNELS[config.attention.kernel].supports.tensor_parallel:
        splittable = ", ".join(name for name, kernel in KERNELS.items() if kernel.supports.tensor_parallel)
        raise ValueError(f"tensor parallel does not support attention.kernel={config.attention.kernel!r}; use "
                         f"{splittable}")
    if config.moe.num_experts:
        raise ValueError(f"tensor parallel does not support moe.num_experts={config.moe.num_experts}: the ranks "
                         "would route tokens apart (the gating noise); train experts without tensor parallel")
    kv = config.attention.num_kv_heads or config.num_heads
    for name, value in (("num_heads", config.num_heads), ("attention.num_kv_heads", kv), ("d_ff", config.d_ff)):
        if value % n:
            raise ValueError(f"{name}={value} is not divisible by the tensor-parallel size {n}; choose a tp "
                             "that divides it")


def _enter_parallel(group):
    """A forward pre-hook applying f to the attention/ffn input (and a cross-attention context)."""

    def hook(module, args, kwargs):
        if kwargs.get("cache") is not None:
            raise ValueError("KV-cache decoding is not supported on a tensor-parallel model; save it with "
                             "save_full_checkpoint and generate with the whole model")
        args = tuple(copy_to_parallel(a, group) if i < 2 and isinstance(a, Tensor) else a for i, a in enumerate(args))
        if isinstance(kwargs.get("context"), Tensor):
            kwargs = {**kwargs, "context": copy_to_parallel(kwargs["context"], group)}
        return args, kwargs

    return hook


def _reduce_grad_hook(group):
    return lambda grad: all_reduce_sum(grad, group)


def _shard_columns(lin: nn.Linear, n: int, r: int, blocks: tuple[int, ...] | None = None) -> None:
    """Column-parallel in place: this rank's output features (of each fused block)."""
    lin.weight = _shard(lin.weight, 0, n, r, blocks)
    if lin.bias is not None:
        lin.bias = _shard(lin.bias, 0, n, r, blocks)
    lin.out_features = lin.weight.shape[0]


def _shard_attention(attn: MultiHeadAttention, group, n: int, r: int) -> None:
    q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    if attn.qkv_proj is not None:  # self-attention: q | k | v fused, each split by heads
        _shard_columns(attn.qkv_proj, n, r, (q, kv, kv))
        projections = [attn.qkv_proj]
    else:  # cross-attention: q of the input, k | v of the context
        _shard_columns(attn.q_proj, n, r)
        _shard_columns(attn.kv_proj, n, r, (kv, kv))
        projections = [attn.q_proj, attn.kv_proj]
    sharded = {id(p) for lin in projections for p in lin.parameters()}
    attn.out_proj = RowParallelLinear(attn.out_proj, group, n, r)
    sharded.update(id(p) for p in attn.out_proj.parameters())
    if isinstance(attn.score, General):
        attn.score.weight = _shard(attn.score.weight, 0, n, r)
    elif isinstance(attn.score, Additive):
        for name in ("w_q", "w_k", "v"):
            setattr(attn.score, name, _shard(getattr(attn.score, name), 0, n, r))
    sharded.update(id(p) for p in attn.score.parameters())
    attn.num_heads //= n
    attn.num_kv_heads //= n
    for p in attn.parameters():  # shared by every head (Shaw tables): partial gradients per rank
        if id(p) not in sharded and p.requires_grad:
            p.register_hook(_reduce_grad_hook(group))
    attn.register_forward_pre_hook(_enter_parallel(group), with_kwargs=True)


def _shard_ffn(ffn: FeedForward, group, n: int, r: int) -> None:
    if ffn.gated:  # w1 | w3 fused: each half split, so act(w1 x) and w3 x of one rank pair up
        F_ = ffn.w13.out_features // 2
        _shard_columns(ffn.w13, n, r, (F_, F_))
    else:
        _shard_columns(ffn.w1, n, r)
    ffn.w2 = RowParallelLinear(ffn.w2, group, n, r)
    ffn.register_forward_pre_hook(_enter_parallel(group), with_kwargs=True)


def _shard_output(lin: nn.Linear, vocab: int, embeddings: dict[int, nn.Parameter], group, n: int, r: int,
                  gather_output: bool) -> VocabParallelLinear:
    weight = embeddings.get(id(lin.weight))  # tied: the embedding's shard
    weight = _shard(lin.weight, 0, n, r) if weight is None else weight
    bias = _shard(lin.bias, 0, n, r) if lin.bias is not None else None
    return VocabParallelLinear(weight, bias, vocab, group, gather_output)


def tensor_parallel(model: nn.Module, group=None, *, gather_output: bool = True) -> nn.Module:
    """Split `model` in place over the tensor-parallel `group`; every rank passes the same full model.

    A full checkpoint therefore loads into a tensor-parallel model by loading it whole and then
    calling this (shard on load); `gather_full_state` goes back (gather on save).

    Args:
        model: a Transformer from `attnlab.build_model` (or `attnlab.load`), identical on every rank.
        group (torch.distributed.ProcessGroup | None): the tensor-parallel process group
            (`ParallelContext.tp_group`); None = the default group.
        gather_output: LM/MLM heads all-gather their logits to (B, T, V) (the model's usual contract);
            False keeps (B, T, V/n) for `vocab_parallel_cross_entropy`.

    Returns:
        the same model object, with `model.tp_size` and `model.tp_group` set.

    Raises:
        ValueError: a config the surgery does not support (see the module docstring).
        TypeError: a model without `.config`.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"tensor_parallel expects a model from attnlab.build_model (with .config), got "
                        f"{type(model).__name__}")
    if getattr(model, "tp_size", 1) > 1:
        raise ValueError("this model is already tensor-parallel")
    n, r = group_size(group), group_rank(group)
    check_supported(config, n)
    model.tp_size, model.tp_group = n, group
    if n == 1:
        return model
    modules = list(model.modules())
    shared: dict[int, VocabParallelEmbedding] = {}
    embedding_params: dict[int, nn.Parameter] = {}
    for m in modules:
        if isinstance(m, Embeddings):
            if id(m.token) not in shared:
                old = m.token.weight
                shared[id(m.token)] = VocabParallelEmbedding(m.token, group, n, r)
                embedding_params[id(old)] = shared[id(m.token)].weight
            m.token = shared[id(m.token)]
    for m in modules:
        if isinstance(m, MultiHeadAttention):
            _shard_attention(m, group, n, r)
        elif isinstance(m, FeedForward):
            _shard_ffn(m, group, n, r)
        elif isinstance(m, LMHead):
            m.proj = _shard_output(m.proj, config.vocab_size, embedding_params, group, n, r, gather_output)
        elif isinstance(m, MLMHead):
            m.decoder = _shard_output(m.decoder, config.vocab_size, embedding_params, group, n, r, gather_output)
        elif isinstance(m, T5RelativeBias):
            m.weight = _shard(m.weight, 1, n, r)  # (buckets, H) -> (buckets, H/n)
        elif isinstance(m, ALiBi):
            m.slopes = m.slopes.chunk(n)[r].clone()
    return model
