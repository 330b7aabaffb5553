"""LoRA: low-rank adapters on a model's Linear layers (Hu et al. 2021, https://arxiv.org/abs/2106.09685).

Notation: in/out a Linear's widths, r the rank, s = alpha / r the scaling.

    y = x W^T + b  +  s * dropout(x) A^T B^T        A (r, in): kaiming-uniform (as peft)
                      `------ the adapter ------'    B (out, r): zeros, so the wrapped model
                                                     starts equal to the base

W and b (and every other base parameter) are frozen; only A and B train, plus any module named
in `train_modules` (a new task head: peft's `modules_to_save`). `merge_lora` folds the adapter
into the weight, W += s B A (same outputs, no extra cost: for export); `unmerge_lora` takes it
out again; `unload_lora` puts plain Linears back.

Fused projections. attnlab's attention keeps q, k, v in one Linear (`qkv_proj`: rows q | k | v;
a cross-attention `q_proj` and `kv_proj`: rows k | v; attnlab.nn.attention), and a gated
feed-forward keeps W1 and W3 in one `w13`. A target is either a real Linear, adapted whole (the
fused `qkv_proj`, as peft adapts GPT-2's fused `c_attn`), or one projection inside a fused one,
named as if it stood alone: `<attention>.q`, `.k`, `.v` (BERT's `query`/`key`/`value`, LLaMA's
`q_proj`/`v_proj` in peft) and `<ffn>.w1`, `.w3` of a gated feed-forward. Such a part gets its
own A and B, which cover its rows only:

    qkv_proj (H Dh + 2 G Dh, D):   rows [ q: H Dh | k: G Dh | v: G Dh ]
    target_modules ["q", "v"]:     y[q rows] += s x A_q^T B_q^T;  y[v rows] += s x A_v^T B_v^T

The adapter's tensors are `<linear>.lora_A.<part>` (r, in) and `<linear>.lora_B.<part>` (rows, r),
part `q`, `k`, `v`, `w1`, `w3`, or `all` for a whole Linear; the base tensors keep their names.

Names. A pattern made of letters, digits, `_` and `.` matches a layer whose name is it or ends
in `.` + it (`q` matches `layers.0.self_attn.q`; `0.self_attn.q` only layer 0's); any other
pattern is a regular expression that must match the whole name (`layers\\.[01]\\..*\\.(q|v)`).
A pattern that matches nothing is an error. Linears LoRA cannot adapt are left out of the
names: a weight tied to another (the LM head and the embedding), a vocabulary head's output
matrix (the fused loss reads its weight directly) and, in a model with a segment memory,
`qkv_proj` (the memory's keys and values read its weight directly).

    names = add_lora(model, rank=8, alpha=16, target_modules=["q", "v"])   # in place
    save_adapters(model, "adapter/")       # the adapters (and train_modules) alone + their settings
    load_adapters(base_model, "adapter/")  # onto the same base: the same outputs
    merge_lora(model); unload_lora(model)  # a plain model again, adapters folded in
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FORMAT = "attnlab-lora"
WHOLE = "all"  # the part name of an adapter over a whole Linear

_PLAIN_NAME = re.compile(r"[\w.]+")


class LoraError(ValueError):
    """A LoRA argument that does not fit the model; `argument` names it (`target_modules`)."""

    def __init__(self, argument: str, problem: str):
        self.argument, self.problem = argument, problem
        super().__init__(f"{argument}: {problem}")


class LoraLinear(nn.Module):
    """A Linear with low-rank adapters over some of its output rows (module docstring).

    The base `weight` and `bias` are the wrapped Linear's own parameters (same names in the
    state dict); `lora_A[part]` (r, in) and `lora_B[part]` (rows, r) are the adapters.

    Args:
        base: the nn.Linear to adapt.
        parts: part name -> (start, stop) of the output rows it adapts.
        rank, alpha: r and alpha (the update is scaled by alpha / r).
        dropout: dropout on the adapter's input while training.
        generator: draws A (kaiming-uniform, a = sqrt(5), as nn.Linear and peft); None: torch's.
    """

    def __init__(self, base: nn.Linear, parts: Mapping[str, tuple[int, int]], *, rank: int, alpha: float,
                 dropout: float = 0.0, generator: torch.Generator | None = None):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.rows = {name: (int(a), int(b)) for name, (a, b) in sorted(parts.items(), key=lambda kv: kv[1])}
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        w = base.weight
        dtype = w.dtype if w.dtype in (torch.float32, torch.float64) else torch.float32  # adapters in fp32 under half
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        for name, (a, b) in self.rows.items():
            A = torch.empty(rank, self.in_features, dtype=torch.float32)
            if w.device.type != "meta":
                nn.init.kaiming_uniform_(A, a=math.sqrt(5), generator=generator)
            self.lora_A[name] = nn.Parameter(A.to(device=w.device, dtype=dtype))
            self.lora_B[name] = nn.Parameter(torch.zeros(b - a, rank, device=w.device, dtype=dtype))
        self.merged = False

    def extra_repr(self) -> str:
        parts = ", ".join(f"{n}[{a}:{b}]" for n, (a, b) in self.rows.items())
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"alpha={self.alpha}, parts=({parts}), merged={self.merged}")

    def delta_weight(self, part: str) -> Tensor:
        """s B A (rows, in) of one part, in fp32: what merging adds to its rows of W."""
        return (self.lora_B[part].float() @ self.lora_A[part].float()) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out): the base Linear plus each part's update on its rows."""
        y = F.linear(x, self.weight, self.bias)  # (..., out)
        if self.merged:
            return y
        h = self.lora_dropout(x)
        updates = {}
        for name, (a, b) in self.rows.items():
            A, B = self.lora_A[name], self.lora_B[name]
            updates[name] = (F.linear(F.linear(h.to(A.dtype), A), B) * self.scaling).to(y.dtype)  # (..., rows)
        if len(self.rows) == 1 and next(iter(self.rows.values())) == (0, self.out_features):
            return y + next(iter(updates.values()))
        pieces, at = [], 0  # rows without an adapter kept as they are, the others with their update
        for name, (a, b) in self.rows.items():
            if a > at:
                pieces.append(y[..., at:a])
            pieces.append(y[..., a:b] + updates[name])
            at = b
        if at < self.out_features:
            pieces.append(y[..., at:])
        return torch.cat(pieces, dim=-1)

    @torch.no_grad()
    def merge(self) -> None:
        """W[rows] += s B A for every part; the forward then skips the adapters. No-op when merged.
        Being merged is not part of the state dict: keep a merged model's weights with unload_lora
        (or merged_copy), its adapters with save_adapters."""
        if not self.merged:
            for name, (a, b) in self.rows.items():
                self.weight[a:b] += self.delta_weight(name).to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W[rows] -= s B A (exact up to float rounding). No-op when not merged."""
        if self.merged:
            for name, (a, b) in self.rows.items():
                self.weight[a:b] -= self.delta_weight(name).to(self.weight.dtype)
            self.merged = False

    def plain(self) -> nn.Linear:
        """An nn.Linear holding this module's weight and bias (the same tensors; merged or not, as they are)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        linear.register_parameter("bias", self.bias)
        return linear


# ---------------------------------------------------------------- which layers
@dataclass(frozen=True)
class _Candidate:
    name: str  # what patterns match: a Linear's name, or a projection's inside a fused one
    linear: str  # the Linear it lives in
    part: str
    rows: tuple[int, int]


def _candidates(model: nn.Module) -> tuple[list[_Candidate], dict[str, str]]:
    """([every layer LoRA can adapt], {name of a Linear it cannot: why})."""
    modules = dict(model.named_modules())
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    excluded: dict[str, str] = {}
    for name, m in modules.items():
        if type(m) is nn.Linear and len(owners.get(id(m.weight), ())) > 1:
            other = next(n for n in owners[id(m.weight)] if n != f"{name}.weight")
            excluded[name] = f"its weight is tied to {other.rsplit('.', 1)[0]}"
        if callable(getattr(m, "output_layer", None)):  # a vocabulary head: the fused loss reads its matrix
            out = next((n for n, o in modules.items() if o is m.output_layer()), None)
            if out is not None:
                excluded.setdefault(out, "it is a vocabulary head's output matrix, whose weight the fused loss reads "
                                         "directly")
    memory = bool(getattr(getattr(model, "config", None), "memory_len", 0))
    found: list[_Candidate] = []
    for name, m in modules.items():
        if type(m) is nn.Linear and name not in excluded:
            found.append(_Candidate(name, name, WHOLE, (0, m.out_features)))
        prefix = f"{name}." if name else ""
        if isinstance(m, MultiHeadAttention):
            q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
            if m.qkv_proj is not None:
                fused = prefix + "qkv_proj"
                if memory:
                    excluded[fused] = ("the segment memory's keys and values read its weight directly "
                                       "(MultiHeadAttention._memory_kv)")
                    for part in "qkv":
                        excluded[prefix + part] = excluded[fused]
                    continue
                spans = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
            else:
                fused = prefix + "kv_proj"
                found.append(_Candidate(prefix + "q", prefix + "q_proj", WHOLE, (0, q)))
                spans = {"k": (0, kv), "v": (kv, 2 * kv)}
            found += [_Candidate(prefix + part, fused, part, rows) for part, rows in spans.items()]
        elif isinstance(m, FeedForward) and m.gated:
            d_ff = m.w13.out_features // 2
            found += [_Candidate(prefix + "w1", prefix + "w13", "w1", (0, d_ff)),
                      _Candidate(prefix + "w3", prefix + "w13", "w3", (d_ff, 2 * d_ff))]
    found = [c for c in found if type(modules.get(c.linear)) is nn.Linear and c.linear not in excluded]
    return found, excluded


def _matches(pattern: str, name: str) -> bool:
    """A plain dotted pattern matches a name's ending at a dot; any other is a regex over the whole name."""
    if _PLAIN_NAME.fullmatch(pattern):
        return name == pattern or name.endswith("." + pattern)
    return re.fullmatch(pattern, name) is not None


def check_patterns(argument: str, patterns: Any, *, empty_ok: bool = False) -> list[str]:
    """`patterns` as a list of strings, each a plain name or a valid regular expression.

    Raises:
        LoraError: not a list of non-empty strings (or an empty list, unless `empty_ok`), or a bad regex.
    """
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)) \
            or not all(isinstance(p, str) and p for p in patterns):
        raise LoraError(argument, f"expected a list of module names or regular expressions, got {patterns!r}")
    if not patterns and not empty_ok:
        raise LoraError(argument, "expected at least one module name (e.g. [\"q\", \"v\"]), got []")
    for p in patterns:
        if not _PLAIN_NAME.fullmatch(p):
            try:
                re.compile(p)
            except re.error as err:
                raise LoraError(argument, f"{p!r} is not a valid regular expression ({err})") from None
    return list(patterns)


def _some_names(names: Iterable[str]) -> str:
    """`ends in k, q, qkv_proj, ... (e.g. layers.0.self_attn.q, ...)`: what the names look like."""
    names = list(names)
    if not names:
        return "the model has none"
    ends = sorted({n.rsplit(".", 1)[-1] for n in names})
    return f"its names end in {', '.join(ends[:16])}{', ...' if len(ends) > 16 else ''} (e.g. {', '.join(names[:4])})"


def lora_targets(model: nn.Module, target_modules: Iterable[str]) -> dict[str, dict[str, tuple[int, int]]]:
    """The layers `target_modules` names (module docstring), without changing the model:
    {Linear name: {part: (start, stop) of its output rows}}, in the model's order.

    Raises:
        LoraError: a bad pattern, one that matches nothing (the error names it and lists what
            the layers are called), one that matches only Linears LoRA cannot adapt (saying
            why), two targets over overlapping rows (a fused Linear and a part of it), or a
            model that already has adapters.
    """
    patterns = check_patterns("target_modules", list(target_modules) if not isinstance(target_modules, str)
                              else target_modules)
    if lora_layers(model):
        raise LoraError("target_modules", "the model already has LoRA adapters (unload_lora first, or keep those)")
    candidates, excluded = _candidates(model)
    chosen: dict[str, dict[str, tuple[int, int]]] = {}
    names: dict[tuple[str, str], str] = {}  # (linear, part) -> the candidate name that chose it
    for pattern in patterns:
        hits = [c for c in candidates if _matches(pattern, c.name)]
        if not hits:
            refused = [n for n in excluded if _matches(pattern, n)]
            if refused:
                raise LoraError("target_modules", f"{pattern!r} matches {refused[0]}, which LoRA cannot adapt: "
                                                  f"{excluded[refused[0]]}")
            raise LoraError("target_modules", f"{pattern!r} matches no layer LoRA can adapt (a name, matched at its "
                                              "end, or a regular expression over the whole name); "
                                              + _some_names(c.name for c in candidates))
        for c in hits:
            parts = chosen.setdefault(c.linear, {})
            for part, (a, b) in parts.items():
                if part != c.part and a < c.rows[1] and c.rows[0] < b:
                    raise LoraError("target_modules", f"{names[c.linear, part]} and {c.name} adapt the same rows of "
                                                      f"{c.linear}; target one of them")
            parts[c.part] = c.rows
            names.setdefault((c.linear, c.part), c.name)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return {name: chosen[name] for name in sorted(chosen, key=order.__getitem__)}


def _trained_modules(model: nn.Module, train_modules: Iterable[str]) -> list[str]:
    """Names of the parameters of the modules `train_modules` names (trained in full).

    Raises:
        LoraError: a pattern that matches no module with parameters.
    """
    patterns = check_patterns("train_modules", list(train_modules), empty_ok=True)
    owners = [n for n, m in model.named_modules() if n and any(True for _ in m.parameters(recurse=False))]
    found: list[str] = []
    for pattern in patterns:
        hits = [n for n, m in model.named_modules() if n and _matches(pattern, n)
                and any(True for _ in m.parameters())]
        if not hits:
            raise LoraError("train_modules", f"{pattern!r} matches no module with parameters; " + _some_names(owners))
        for module_name in hits:
            found += [f"{module_name}.{p}" for p, _ in model.get_submodule(module_name).named_parameters()]
    return list(dict.fromkeys(found))


# ---------------------------------------------------------------- wrapping
def _check_numbers(rank: Any, alpha: Any, dropout: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraError("rank", f"expected an integer >= 1, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise LoraError("alpha", f"expected a number > 0, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise LoraError("dropout", f"expected a probability in [0, 1), got {dropout!r}")


def _wrap(model: nn.Module, plan: Mapping[str, Mapping[str, tuple[int, int]]], trained: Iterable[str], *,
          rank: int, alpha: float, dropout: float, generator: torch.Generator | None) -> None:
    """Freeze every parameter, replace the Linears of `plan` by LoraLinears, unfreeze `trained`."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name, parts in plan.items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        parent._modules[attr] = LoraLinear(parent._modules[attr], parts, rank=rank, alpha=alpha, dropout=dropout,
                                           generator=generator)
    params = dict(model.named_parameters())
    for name in trained:
        params[name].requires_grad_(True)


def add_lora(model: nn.Module, *, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
             target_modules: Iterable[str] = ("q", "v"), train_modules: Iterable[str] = (),
             generator: torch.Generator | None = None) -> list[str]:
    """Wrap the Linears `target_modules` names with LoRA adapters, in place (module docstring).

    Every base parameter is frozen except those of the modules `train_modules` names; each
    adapter's A is drawn from `generator` (torch's default when None), B is zeros.

    Returns:
        the names of the Linears wrapped, in the model's order.

    Raises:
        LoraError (a ValueError naming the argument): rank < 1, alpha <= 0, dropout outside
            [0, 1), a pattern that matches nothing or what LoRA cannot adapt (`lora_targets`).
    """
    _check_numbers(rank, alpha, dropout)
    plan = lora_targets(model, target_modules)
    trained = _trained_modules(model, train_modules)
    _wrap(model, plan, trained, rank=rank, alpha=alpha, dropout=float(dropout), generator=generator)
    return list(plan)


def lora_layers(model: nn.Module) -> dict[str, LoraLinear]:
    """{name: LoraLinear} of the model's adapted Linears."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight (W += s B A); the outputs stay the same. In place."""
    for m in lora_layers(model).values():
        m.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Take every merged adapter out of its weight again (W -= s B A). In place."""
    for m in lora_layers(model).values():
        m.unmerge()
    return model


def unload_lora(model: nn.Module, *, merge: bool = True) -> nn.Module:
    """Put plain nn.Linears back in place of the LoraLinears, their adapters merged into the
    weights first (or, with merge=False, dropped: the base model again). In place; the
    parameters keep their requires_grad (frozen by add_lora)."""
    for name, m in lora_layers(model).items():
        if merge:
            m.merge()
        else:
            m.unmerge()
        parent_name, _, attr = name.rpartition(".")
        model.get_submodule(parent_name)._modules[attr] = m.plain()
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain copy of `model` with the adapters merged in (the model itself is left as it is)."""
    return unload_lora(copy.deepcopy(model), merge=True)


# ---------------------------------------------------------------- files
def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """What an adapter file holds: every adapter tensor and every other parameter that trains
    (the modules of `train_modules`), by its state-dict name."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters (add_lora first)")
    adapters = {f"{name}.{kind}.{part}": t for name, m in layers.items() for kind in ("lora_A", "lora_B")
                for part, t in getattr(m, kind).items()}
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad and n not in adapters}
    return {n: t.detach() for n, t in {**adapters, **trained}.items()}


def base_fingerprint(model: nn.Module, leave_out: Iterable[str]) -> str:
    """sha256 over the names, shapes and values (as fp32) of the model's state other than
    `leave_out`: the identity of the base weights an adapter file was trained on."""
    skip = set(leave_out)
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if name in skip:
            continue
        t = t.detach().cpu()
        t = t.float() if t.is_floating_point() else t
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        digest.update(t.contiguous().numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def save_adapters(model: nn.Module, folder: str | os.PathLike, *, settings: Mapping[str, Any] | None = None) -> Path:
    """Write the adapters alone (and the modules trained in full) to `folder`, atomically:

        adapter_model.safetensors   the tensors of `adapter_state`
        adapter_config.json         rank, alpha, dropout; the layers and rows adapted; the names
                                    trained in full; the base model's config and weights' sha256;
                                    `settings` (the config's patterns, say) under "settings"

    Returns:
        the folder.

    Raises:
        ValueError: the model has no adapters, or `folder` is a file or a folder attnlab did not write.
    """
    from attnlab.io.files import atomic_folder, json_text
    from attnlab.io.weights import write_safetensors

    state = adapter_state(model)
    layers = lora_layers(model)
    first = next(iter(layers.values()))
    dropout = first.lora_dropout.p if isinstance(first.lora_dropout, nn.Dropout) else 0.0
    adapters = {f"{n}.{k}.{p}" for n, m in layers.items() for k in ("lora_A", "lora_B") for p in m.rows}
    config = getattr(model, "config", None)
    meta = {"format": FORMAT, "rank": first.rank, "alpha": first.alpha, "dropout": dropout,
            "layers": {n: {p: list(rows) for p, rows in m.rows.items()} for n, m in layers.items()},
            "trained": [n for n in state if n not in adapters],
            "base": {"config": config.to_dict() if hasattr(config, "to_dict") else None,
                     "sha256": base_fingerprint(model, state)},
            "settings": dict(settings or {})}
    with atomic_folder(folder) as tmp:
        write_safetensors(state, tmp / ADAPTER_WEIGHTS, metadata={"format": FORMAT})
        (tmp / ADAPTER_CONFIG).write_text(json_text(meta, indent=2) + "\n", encoding="utf-8")
    return Path(folder)


def read_adapter_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The adapter_config.json of an adapter folder.

    Raises:
        FileNotFoundError: no such folder or file.
        ValueError: a file that is not an attnlab adapter config.
    """
    from attnlab.io.files import read_json

    path = Path(folder) / ADAPTER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: expected an adapter folder ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}, "
                                "written by attnlab.nn.lora.save_adapters)")
    meta = read_json(path)
    if meta.get("format") != FORMAT or not isinstance(meta.get("layers"), dict):
        raise ValueError(f"{path}: not an attnlab LoRA adapter config (format {meta.get('format')!r})")
    return meta


def load_adapters(model: nn.Module, folder: str | os.PathLike, *, check_base: bool = True) -> nn.Module:
    """Wrap `model` (the base the adapters were trained on) with the adapters saved in `folder`,
    in place: the same layers, rows and settings, the saved tensors, frozen as add_lora leaves it.

    Args:
        model: the base model, without adapters.
        folder: written by `save_adapters`.
        check_base: refuse a model whose config or weights differ from the base recorded there.

    Returns:
        the model, wrapped.

    Raises:
        FileNotFoundError: not an adapter folder.
        ValueError: another base model (its config or weights' sha256), a model that already has
            adapters, layers the model lacks, or missing, unexpected or mis-shaped tensors.
            The model is unchanged when any of these is found.
    """
    from attnlab.io.weights import read_safetensors

    meta = read_adapter_config(folder)
    path = Path(folder)
    if lora_layers(model):
        raise ValueError(f"{path}: the model already has LoRA adapters")
    saved_config = meta["base"].get("config")
    config = getattr(model, "config", None)
    if check_base and saved_config is not None and hasattr(config, "to_dict") and config.to_dict() != saved_config:
        now = config.to_dict()
        differ = [k for k in sorted(set(now) | set(saved_config)) if now.get(k) != saved_config.get(k)]
        raise ValueError(f"{path}: the adapters were trained on another model (config differs in "
                         f"{', '.join(differ[:5])})")
    modules = dict(model.named_modules())
    plan = {}
    for name, parts in meta["layers"].items():
        m = modules.get(name)
        if type(m) is not nn.Linear:
            raise ValueError(f"{path}: the model has no Linear {name!r} to adapt")
        plan[name] = {p: (int(a), int(b)) for p, (a, b) in parts.items()}
        if any(not 0 <= a < b <= m.out_features for a, b in plan[name].values()):
            raise ValueError(f"{path}: rows {parts} do not fit {name} ({m.out_features} rows)")
    state = read_safetensors(path / ADAPTER_WEIGHTS)
    trained = list(meta.get("trained", []))
    if check_base:
        found = base_fingerprint(model, set(trained))
        if found != meta["base"]["sha256"]:
            raise ValueError(f"{path}: the adapters were trained on other base weights (sha256 {found[:12]}... here, "
                             f"{meta['base']['sha256'][:12]}... when saved); give the same base model, or "
                             "check_base=False")
    rank = int(meta["rank"])
    params = dict(model.named_parameters())
    expected = {n: tuple(params[n].shape) for n in trained if n in params}
    for name, parts in plan.items():
        for part, (a, b) in parts.items():
            expected[f"{name}.lora_A.{part}"] = (rank, modules[name].in_features)
            expected[f"{name}.lora_B.{part}"] = (b - a, rank)
    missing = sorted(set(expected) - set(state)) + sorted(set(trained) - set(params))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path / ADAPTER_WEIGHTS} does not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, t in state.items():
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{path / ADAPTER_WEIGHTS}: {name} has shape {tuple(t.shape)}, the model "
                             f"{expected[name]}")
    _wrap(model, plan, trained, rank=rank, alpha=float(meta["alpha"]), dropout=float(meta["dropout"]),
          generator=torch.Generator().manual_seed(0))  # A and B are overwritten below
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in state.items():
            params[name].copy_(t)
    return model


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "LoraError", "LoraLinear", "adapter_state", "add_lora",
           "base_fingerprint", "load_adapters", "lora_layers", "lora_targets", "merge_lora", "merged_copy",
           "read_adapter_config", "save_adapters", "unload_lora", "unmerge_lora"]
