"""An interactive attention viewer: one self-contained HTML page of a model's attention on a text.

The weights come from `attnlab.inspect.attention_maps.attention_maps` (the one capture: modules
not chosen keep their fused kernel). The page has two views over each "attention kind" (the
self-attention of a decoder or encoder stack, an encoder-decoder's decoder self-attention and
its cross-attention, a recurrent decoder's alignment):

    head view    queries in a column left, keys right; hovering a token draws a line to each token
                 it attends to (or that attends to it), one colour per head, opacity = weight;
                 checkboxes toggle heads, a selector picks the layer
    model view   layers x heads thumbnails (canvas heatmaps); a click enlarges one, with the keys
                 each query may not see (causality, a sparse kernel's pattern) shaded grey

Embedding: every map of one example is quantised to uint8 (round(255 w); the error is at most
1/510), the maps and the allowed masks (one byte per (query, key)) are concatenated, compressed
with zlib and written as base64 into a JSON block that the page's script inflates with the
browser's `DecompressionStream`. Sizes measured on trained models: 6 layers x 12 heads on 128
tokens (MiniLM) is 1.2 MB of uint8 weights and a 424 KB page; on 172 tokens 2.1 MB and 644 KB;
a 4 x 4 character decoder on 512 tokens 4.2 MB and 406 KB (its causal zeros compress away).
The page loads nothing: scripts and styles are inline, a Content-Security-Policy forbids any
request, and no URL is written into it.

Long inputs: at most `max_tokens` (default `MAX_TOKENS` = 512) tokens per side are run and
shown: a longer input is cut to its first `max_tokens` tokens before the model runs, and the
page says so at its top (the weights are those of the shortened input, a true forward pass,
not a crop of a longer one). Past 20,000 lines (heads x Tq x Tk) the head view draws on hover only.

    html = attention_html(model, tok.encode("the cat sat"), tokenizer=tok)
    write_attention_html("attention.html", model, tok.encode("the cat"), tok.encode("die Katze"), tokenizer=tok)
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor, nn

from attnlab.inspect.attention_maps import attention_maps, select_modules
from attnlab.io.files import atomic_write_text
from attnlab.models.families import FAMILIES
from attnlab.nn.attention import MultiHeadAttention

MAX_TOKENS = 512
ENCODING = "uint8 weights (round(255 w)) and uint8 allowed masks, concatenated, zlib, base64"
_LAYER = re.compile(r"^(?P<pre>(?:.*\.)?layers\.)(?P<layer>\d+)(?P<post>\..*)$")


@dataclass
class AttentionMap:
    """One module's weights on the example.

    Attributes:
        name: the module's qualified name (`decoder.layers.1.cross_attn`).
        layer: its index in its stack (0 for a module outside one).
        heads: the model's head indices of the rows of `weights`.
        weights: (H', Tq, Tk) float32.
        allowed: (Tq, Tk) bool, True = the query may attend to the key (causality and the kernel's
            sparse pattern); None = every key, or a pattern that is not known as a mask.
        key_labels: labels of the Tk keys when they are not the kind's tokens (a kernel that
            compresses or projects the keys), else None.
        note: what the page says about the map's keys and pattern.
    """

    name: str
    layer: int
    heads: list[int]
    weights: Tensor
    allowed: Tensor | None = None
    key_labels: list[str] | None = None
    note: str = ""


@dataclass
class AttentionKind:
    """The maps of one kind of attention, by layer: `queries` and `keys` say which text
    (`source` or `target`) each axis runs over."""

    id: str
    label: str
    queries: str
    keys: str
    maps: list[AttentionMap] = field(default_factory=list)


@dataclass
class AttentionView:
    """What the page shows: the tokens, the kinds of attention, and a notice (shortened input)."""

    source: list[str]
    target: list[str] | None
    kinds: list[AttentionKind]
    notice: str | None = None
    model: dict[str, Any] = field(default_factory=dict)


def _ids(ids: Sequence[int] | Tensor | None, name: str) -> list[int] | None:
    """Token ids as a list: a sequence, a 1-D tensor or a (1, T) tensor."""
    if ids is None:
        return None
    if isinstance(ids, Tensor):
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.is_floating_point():
            raise ValueError(f"{name} must be one sequence of token ids (T,) or (1, T), got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    ids = list(ids)
    if not ids:
        raise ValueError(f"{name} is empty; give at least one token id")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{name} must hold integer token ids")
    return ids


def token_labels(ids: Sequence[int], tokenizer: Any = None) -> list[str]:
    """The tokens' strings (`tokenizer.id_to_token`), or the ids as text without a tokenizer."""
    out = []
    for i in ids:
        t = tokenizer.id_to_token(i) if tokenizer is not None and hasattr(tokenizer, "id_to_token") else None
        out.append(str(i) if t is None else t)
    return out


def _has_source(arch: str | None) -> bool:
    """Whether a model of `arch` reads a source beside its target (an encoder-decoder's family)."""
    own = FAMILIES.get(arch) if isinstance(arch, str) else None
    return own is not None and own.traits.has_source


def _kind_of(name: str, module: nn.Module, arch: str | None) -> tuple[str, int, str, str, str]:
    """(kind id, layer, label, query side, key side) of an attention module."""
    m = _LAYER.match(name)
    kind_id, layer = (m["pre"] + "*" + m["post"], int(m["layer"])) if m else (name, 0)
    if not isinstance(module, MultiHeadAttention):  # a recurrent decoder's attention over the encoder states
        return kind_id, layer, f"RNN alignment: {name} (target -> source)", "target", "source"
    if module.qkv_proj is None:
        return kind_id, layer, f"cross-attention: {kind_id} (target -> source)", "target", "source"
    side = "target" if _has_source(arch) and name.startswith("decoder.") else "source"
    what = "causal self-attention" if module.causal else "self-attention"
    return kind_id, layer, f"{what}: {kind_id}", side, side


def _pattern(module: nn.Module, t_q: int, t_k: int) -> tuple[Tensor | None, str]:
    """(allowed (Tq, Tk) bool or None = every key, a note) for a module's map over Tq x Tk."""
    if not isinstance(module, MultiHeadAttention) or module.qkv_proj is None:
        return None, "every key allowed"
    kernel = module.kernel
    causal = torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q) if module.causal else None
    if t_q != t_k:
        return None, (f"kernel {kernel.name}: the {t_k} keys are the kernel's compressed or projected rows, "
                      "not tokens; zero weights show its pattern")
    pattern = kernel.dense_mask(t_k, module.causal, batch=1)
    if pattern is None:
        if kernel.supports.pattern:  # a sparse pattern without a dense mask to show
            return None, f"kernel {kernel.name}: its pattern is not available as a mask; zero weights show it"
        return causal, f"kernel {kernel.name}: " + ("causal (grey: future keys)" if causal is not None
                                                     else "every key allowed")
    pattern = pattern.reshape(-1, t_q, t_k)[0].cpu()
    if causal is not None:
        pattern = pattern & causal
    return pattern, f"kernel {kernel.name}: grey keys are outside its pattern" + (" or in the future" if
                                                                                  module.causal else "")


def capture_view(model: nn.Module, input_ids: Sequence[int] | Tensor, target_ids: Sequence[int] | Tensor | None = None,
                 *, tokenizer: Any = None, names: Iterable[str] | str | None = None,
                 heads: Sequence[int] | None = None, max_tokens: int = MAX_TOKENS) -> AttentionView:
    """Run `model` once on one example and collect what the viewer shows.

    Args:
        model: an attnlab model with a token input (decoder, encoder, encoder-decoder, recurrent
            encoder-decoder with attention).
        input_ids: the tokens of the text (the source of an encoder-decoder): (T,) or (1, T).
        target_ids: the target of an encoder-decoder (teacher-forced); required for one, refused
            for the others.
        tokenizer: turns ids into the page's labels (`id_to_token`); None shows the ids.
        names: attention module names or shell patterns (`attention_maps`); None = all.
        heads: head indices to keep (None = all).
        max_tokens: at most this many tokens per side are run; a longer side is cut to its first
            `max_tokens` tokens, and the view's `notice` says so.

    Returns:
        an `AttentionView`.

    Raises:
        ValueError: bad ids, a target missing or out of place, max_tokens < 1, a pattern that
            matches no module, or a model without attention.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    arch = getattr(getattr(model, "config", None), "arch", None)
    src, tgt = _ids(input_ids, "input_ids"), _ids(target_ids, "target_ids")
    if _has_source(arch) and tgt is None:
        raise ValueError(f"target_ids are needed for arch={arch!r} (the target to align with the input)")
    if not _has_source(arch) and tgt is not None:
        raise ValueError(f"target_ids are for encoder-decoders; this model has arch={arch!r}: drop them")
    notices = [f"The {side} has {len(ids)} tokens; this page shows the model run on its first {max_tokens} "
               f"(max_tokens={max_tokens})." for side, ids in (("input", src), ("target", tgt))
               if ids is not None and len(ids) > max_tokens]
    src = src[:max_tokens]
    tgt = tgt[:max_tokens] if tgt is not None else None
    modules = select_modules(model, names)
    device = next(model.parameters()).device
    inputs = [torch.tensor([src], device=device)] + ([torch.tensor([tgt], device=device)] if tgt is not None else [])
    maps = attention_maps(model, *inputs, names=list(modules), heads=heads)
    labels = {"source": token_labels(src, tokenizer), "target": token_labels(tgt, tokenizer) if tgt else None}
    kinds: dict[str, AttentionKind] = {}
    for name, weights in maps.items():
        kind_id, layer, label, q_side, k_side = _kind_of(name, modules[name], arch)
        kind = kinds.setdefault(kind_id, AttentionKind(kind_id, label, q_side, k_side))
        w = weights[0].float().cpu()  # (H', Tq, Tk)
        allowed, note = _pattern(modules[name], w.shape[1], w.shape[2])
        keys = labels[k_side]
        key_labels = None if w.shape[2] == len(keys) else [f"#{j}" for j in range(w.shape[2])]
        head_ids = list(heads) if heads is not None else list(range(w.shape[0]))
        kind.maps.append(AttentionMap(name, layer, head_ids, w, allowed, key_labels, note))
    for kind in kinds.values():
        kind.maps.sort(key=lambda m: m.layer)
    config = getattr(model, "config", None)
    info = {k: getattr(config, k) for k in ("arch", "d_model", "num_layers", "num_heads") if hasattr(config, k)}
    if hasattr(config, "attention"):
        info["kernel"] = config.attention.kernel
    return AttentionView(labels["source"], labels["target"], list(kinds.values()), " ".join(notices) or None, info)


def _quantise(w: Tensor) -> bytes:
    return torch.round(w.clamp(0, 1) * 255).to(torch.uint8).contiguous().numpy().tobytes()


def page_data(view: AttentionView, title: str = "attnlab attention") -> dict[str, Any]:
    """The JSON the page embeds: tokens, kinds, each map's shape and byte offsets, and `blob`, the
    base64 of zlib(all quantised maps and allowed masks) (see the module docstring)."""
    chunks: list[bytes] = []
    size = 0

    def put(data: bytes) -> int:
        nonlocal size
        chunks.append(data)
        size += len(data)
        return size - len(data)

    kinds = []
    for kind in view.kinds:
        maps = []
        for m in kind.maps:
            h, t_q, t_k = m.weights.shape
            entry = {"name": m.name, "layer": m.layer, "heads": m.heads, "shape": [h, t_q, t_k],
                     "offset": put(_quantise(m.weights)), "keyLabels": m.key_labels, "note": m.note, "allowed": None}
            if m.allowed is not None and not bool(m.allowed.all()):
                entry["allowed"] = put(m.allowed.to(torch.uint8).contiguous().numpy().tobytes())
            maps.append(entry)
        kinds.append({"id": kind.id, "label": kind.label, "queries": kind.queries, "keys": kind.keys, "maps": maps})
    raw = b"".join(chunks)
    return {"version": 1, "title": title, "model": view.model, "notice": view.notice,
            "tokens": {"source": view.source, "target": view.target}, "kinds": kinds, "encoding": ENCODING,
            "bytes": len(raw), "blob": base64.b64encode(zlib.compress(raw, 6)).decode("ascii")}


def _asset(name: str) -> str:
    return resources.files("attnlab.inspect").joinpath(name).read_text(encoding="utf-8")


def render_html(view: AttentionView, title: str = "attnlab attention") -> str:
    """The page of `view` as one HTML text: inline style, script and data, no URL to load."""
    data = json.dumps(page_data(view, title), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # no "</script>" (or any tag) can end the data block early
    csp = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
           "connect-src data: blob:")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>\n{_asset('viewer.css')}</style>\n</head>\n"
            f'<body>\n<div id="app"><p class="loading">Loading the attention weights...</p></div>\n'
            f'<script type="application/json" id="attnlab-data">{data}</script>\n'
            f"<script>\n{_asset('viewer.js')}</script>\n</body>\n</html>\n")


def attention_html(model: nn.Module, input_ids: Sequence[int] | Tensor,
                   target_ids: Sequence[int] | Tensor | None = None, *, title: str = "attnlab attention",
                   **kwargs: Any) -> str:
    """The viewer page of `model` on one example, as HTML text.

    Args:
        model, input_ids, target_ids: as `capture_view`.
        title: the page's title.
        **kwargs: `capture_view`'s tokenizer, names, heads, max_tokens.

    Returns:
        the HTML text.

    Raises:
        ValueError: as `capture_view`.
    """
    return render_html(capture_view(model, input_ids, target_ids, **kwargs), title)


def write_attention_html(path: str | os.PathLike, model: nn.Module, input_ids: Sequence[int] | Tensor,
                         target_ids: Sequence[int] | Tensor | None = None, **kwargs: Any) -> Path:
    """Write the viewer page (`attention_html`) to `path` atomically; returns the path.

    Raises:
        ValueError: `path` is a folder, or as `capture_view`.
    """
    if Path(path).is_dir():
        raise ValueError(f"path: {os.fspath(path)!r} is a folder; give a file path such as attention.html")
    return atomic_write_text(path, attention_html(model, input_ids, target_ids, **kwargs))
