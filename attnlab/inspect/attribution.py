"""Which input tokens a prediction rests on: gradient x input and integrated gradients with
respect to the token embeddings, for every text family.

Notation: B batch, T tokens (of the side attributed), D embedding width, N = n * B rows of a
batch of n integration points, alpha in [0, 1].

The attributed tensor is the output of the model's embedding module on one side, x (B, T, D):
the `Embeddings` of a Transformer stack (token vectors, scaled, plus absolute positions, segments
and norm where the config has them; the residual stream entering layer 0), or the `nn.Embedding`
table of a recurrent encoder-decoder. A forward hook on that module swaps its output for the
points we ask about, so the same code reaches a decoder, an encoder, both sides of an
encoder-decoder and the recurrent models, fused attention kernels included.

    gradient x input:      a_t = x_t * df/dx_t                       (Shrikumar et al. 2016)
    integrated gradients:  a_t = (x_t - x'_t) * integral_0^1 df/dx_t(x' + alpha (x - x')) dalpha
                           (Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365)

The integral is a quadrature over `steps` points: Gauss-Legendre (the default, exact for
polynomials of degree 2 steps - 1 in alpha) or a Riemann sum (left, right, middle, trapezoid),
the same points and weights as captum's, but for the trapezoid: ours is the composite rule
(weights 1/(n-1), halved at both ends, summing to 1), captum's weighs 1/n (summing to (n-1)/n). Completeness says sum_t,d a = f(x) - f(x'); the result's `delta` is
sum(a) - (f(x) - f(x')), the quadrature error, which shrinks as `steps` grows.

    att = integrated_gradients(model, ids, target=tok.encode(" Paris")[0])  # last position's log-prob
    att.scores          # (B, T): per-token attribution, summed over D
    att.delta           # (B,): completeness error
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

RULES = ("gausslegendre", "riemann_trapezoid", "riemann_middle", "riemann_left", "riemann_right")
SCORES = ("logprob", "logit")


@dataclass
class EmbeddingSite:
    """Where attributions are taken: `module`'s output on its `call`-th call of a forward pass
    (1 for the target side when source and target share one module: the encoder runs first)."""

    name: str
    module: nn.Module
    call: int
    side: str


@dataclass
class Attribution:
    """attributions (B, T, D); scores (B, T) = attributions summed over D; value (B,) = f(x);
    baseline_value (B,) = f(x') and delta (B,) = sum(attributions) - (f(x) - f(x')) for integrated
    gradients (None for gradient x input); target (B,) the token ids scored (None for a metric);
    baseline: which x' (`pad`, `zeros`, `tensor`; None for gradient x input)."""

    attributions: Tensor
    scores: Tensor
    value: Tensor
    site: str
    target: Tensor | None = None
    baseline_value: Tensor | None = None
    delta: Tensor | None = None
    baseline: str | None = None


def integration_points(steps: int, rule: str = "gausslegendre") -> tuple[list[float], list[float]]:
    """The alphas in [0, 1] and their weights (summing to 1) of a `steps`-point rule.

    Raises:
        ValueError: an unknown rule, or too few steps for it (trapezoid needs 2).
    """
    if rule not in RULES:
        raise ValueError(f"method={rule!r} is not an integration rule; choose from {', '.join(RULES)}")
    if not isinstance(steps, int) or steps < (2 if rule == "riemann_trapezoid" else 1):
        raise ValueError(f"steps must be an integer >= {2 if rule == 'riemann_trapezoid' else 1} for {rule}, got {steps!r}")
    n = steps
    if rule == "gausslegendre":
        import numpy as np

        x, w = np.polynomial.legendre.leggauss(n)  # nodes and weights on [-1, 1]
        return [float(a) for a in (x + 1) / 2], [float(v) for v in w / 2]
    if rule == "riemann_trapezoid":
        alphas = [k / (n - 1) for k in range(n)]
        weights = [1 / (n - 1)] * n
        weights[0] = weights[-1] = 1 / (2 * (n - 1))
        return alphas, weights
    shift = {"riemann_left": 0.0, "riemann_middle": 0.5, "riemann_right": 1.0}[rule]
    return [(k + shift) / n for k in range(n)], [1 / n] * n


def embedding_sites(model: nn.Module) -> dict[str, EmbeddingSite]:
    """The embedding outputs a model's attributions can be taken at, by side: {'input': ...} for
    a decoder or an encoder, {'source': ..., 'target': ...} for an encoder-decoder.

    Raises:
        TypeError: a model without `config` (not built by attnlab) or without token embeddings.
    """
    from attnlab.models.families import family

    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be an attnlab model (built by build_model / load / from_hf), "
                        f"got {type(model).__name__} without .config")
    own = family(config)
    stacks = own.stacks(config)
    names = [prefix + "embed" for prefix, _ in stacks] if stacks else ["src_embed", "tgt_embed"]
    try:
        modules = [model.get_submodule(n) for n in names]
    except AttributeError:
        raise TypeError(f"{own.description} ({type(model).__name__}) has no token embeddings to attribute "
                        "to") from None
    if len(modules) == 1:
        return {"input": EmbeddingSite(names[0], modules[0], 0, "input")}
    return {"source": EmbeddingSite(names[0], modules[0], 0, "source"),
            "target": EmbeddingSite(names[1], modules[1], 1 if modules[1] is modules[0] else 0, "target")}


def embedding_site(model: nn.Module, side: str | None = None) -> EmbeddingSite:
    """One side's site (None: the only one, or an encoder-decoder's source).

    Raises:
        ValueError: a side the model does not have.
    """
    sites = embedding_sites(model)
    if side is None:
        return next(iter(sites.values()))
    if side not in sites:
        raise ValueError(f"side={side!r}: this model's sides are {', '.join(sites)}")
    return sites[side]


@contextmanager
def _at_site(site: EmbeddingSite, replace: Callable[[Tensor], Tensor | None] | None = None,
             ids: Callable[[Tensor], Tensor] | None = None) -> Iterator[list[Tensor]]:
    """During one forward pass: collect the site's output, swapped for `replace(output)` when
    given, and with the module's token ids swapped for `ids(input_ids)` when given."""
    seen: list[Tensor] = []
    calls = [0, 0]

    def pre(mod, args):
        calls[0] += 1
        if ids is not None and calls[0] - 1 == site.call:
            return (ids(args[0]), *args[1:])
        return None

    def post(mod, args, out):
        calls[1] += 1
        if calls[1] - 1 != site.call:
            return None
        new = replace(out) if replace is not None else None
        seen.append(out if new is None else new)
        return new

    handles = [site.module.register_forward_pre_hook(pre), site.module.register_forward_hook(post)]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    """Dropout off for the duration: attributions of a random function mean nothing."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


def _repeat(value, n: int, B: int):
    """A batch input repeated n times along its first axis (alpha-major rows k * B + b)."""
    if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == B and n > 1:
        return value.repeat(n, *([1] * (value.dim() - 1)))
    return value


class _Objective:
    """f: the model's output (N, ...) -> one number per row (N,)."""

    def __init__(self, target, position: int | None, score: str, B: int):
        if score not in SCORES:
            raise ValueError(f"score={score!r}: choose from {', '.join(SCORES)}")
        self.metric = target if callable(target) else None
        self.position, self.score, self.B = position, score, B
        self.target = None if target is None or self.metric else torch.as_tensor(target).long().reshape(-1)
        if self.target is not None and self.target.numel() not in (1, B):
            raise ValueError(f"target must be one token id or one per row ({B}), got {self.target.numel()} ids")

    def _scores(self, output: Tensor) -> Tensor:
        if not isinstance(output, Tensor) or output.dim() not in (2, 3):
            raise ValueError("the model's output is not logits (B, V), (B, T, V): pass target=a metric callable "
                             "that maps the output to one number per row")
        if output.dim() == 2:
            return output.float()
        if self.position is None:
            raise ValueError("position is needed: the output has one row of logits per token")
        T = output.shape[1]
        if not -T <= self.position < T:
            raise ValueError(f"position={self.position} is outside the output's {T} positions")
        return output[:, self.position].float()  # (N, V)

    def resolve(self, output: Tensor) -> None:
        """With no target given: the token the model predicts on the input."""
        if self.metric is None and self.target is None:
            self.target = self._scores(output).argmax(-1)
        if self.target is not None:
            V = self._scores(output).shape[-1]
            if not bool(((self.target >= 0) & (self.target < V)).all()):
                raise ValueError(f"target ids must lie in [0, {V}), got {self.target.tolist()}")

    def __call__(self, output: Tensor) -> Tensor:
        if self.metric is not None:
            values = self.metric(output)
            if not isinstance(values, Tensor) or values.shape != (output.shape[0],):
                raise ValueError(f"target (a metric) must return one number per row, shape ({output.shape[0]},), "
                                 f"got {getattr(values, 'shape', type(values).__name__)}")
            return values.float()
        s = self._scores(output)
        if self.score == "logprob":
            s = torch.log_softmax(s, -1)
        idx = self.target.to(s.device).expand(self.B).repeat(s.shape[0] // self.B)
        return s.gather(-1, idx[:, None])[:, 0]


def _forward(model: nn.Module, site: EmbeddingSite, inputs: tuple, kwargs: dict, n: int, B: int,
             replace: Callable[[Tensor], Tensor | None] | None = None,
             ids: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """(the model's output, the site's output) on the inputs repeated n times."""
    with _at_site(site, replace, ids) as seen:
        output = model(*(_repeat(x, n, B) for x in inputs), **{k: _repeat(v, n, B) for k, v in kwargs.items()})
    if not seen:
        raise ValueError(f"{site.name} was not called {site.call + 1} time(s) in the forward pass; "
                         "is the side given the one the inputs feed?")
    return output, seen[0]


def _prepare(model, inputs, target, position, score, side):
    if not inputs or not isinstance(inputs[0], Tensor) or inputs[0].dim() != 2:
        raise ValueError("inputs: give the model's token ids (B, T) first, as its forward takes them")
    if not callable(target):
        from attnlab.models.families import family

        stacks = family(model.config).stacks(model.config)
        last = model.get_submodule(stacks[-1][0].rstrip(".")) if stacks and stacks[-1][0] else model
        if stacks and getattr(last, "head", None) is None:
            raise ValueError("target: this model has no head and returns hidden states, not logits; give a "
                             "metric callable (output (N, T, D) -> (N,)) to attribute")
    return embedding_site(model, side), inputs[0].shape[0], _Objective(target, position, score, inputs[0].shape[0])


def gradient_x_input(model: nn.Module, *inputs: Tensor, target: int | Tensor | Callable | None = None,
                     position: int | None = -1, score: str = "logprob", side: str | None = None,
                     **kwargs) -> Attribution:
    """x * df/dx at the embeddings of one side.

    Args:
        model: an attnlab text model; run in eval mode here (its modes are restored after).
        *inputs: what `model(*inputs, **kwargs)` takes (ids first; masks as keywords or
            positionally).
        target: the token id(s) scored at `position` ((B,) or one for all rows; None: the one the
            model predicts), or a callable mapping the output (N, ...) to one number per row (N,).
        position: the output position of the scored token (a classifier's (B, C) output has none:
            pass None or leave -1).
        score: `logprob` (log-softmax) or `logit`.
        side: `source` / `target` of an encoder-decoder (default source); None elsewhere.

    Returns:
        An `Attribution` (no baseline, no delta).

    Raises:
        ValueError: bad target, position, score or side.
    """
    site, B, f = _prepare(model, inputs, target, position, score, side)
    with _eval(model), torch.enable_grad():
        output, x = _forward(model, site, inputs, kwargs, 1, B)
        f.resolve(output.detach())
        leaf = x.detach().requires_grad_(True)
        output, _ = _forward(model, site, inputs, kwargs, 1, B, replace=lambda out: leaf)
        value = f(output)
        (grad,) = torch.autograd.grad(value.sum(), leaf)
    a = (leaf.detach() * grad).float()
    return Attribution(a, a.sum(-1), value.detach(), site.name, target=f.target)


def _baseline(model, site, inputs, kwargs, B, x: Tensor, baseline) -> Tensor:
    if isinstance(baseline, Tensor):
        base = baseline.to(x.device, x.dtype)
        if base.shape not in (x.shape, x.shape[1:]):
            raise ValueError(f"baseline must have the embeddings' shape {tuple(x.shape)} or {tuple(x.shape[1:])}, "
                             f"got {tuple(base.shape)}")
        return base.expand_as(x)
    if baseline == "zeros":
        return torch.zeros_like(x)
    if baseline == "pad":
        pad = getattr(model.config, "pad_token_id", None)
        if pad is None:
            raise ValueError("baseline='pad' needs config.pad_token_id; this model has none: use 'zeros' or a tensor")
        with torch.no_grad():
            _, base = _forward(model, site, inputs, kwargs, 1, B, ids=lambda ids: torch.full_like(ids, pad))
        return base
    raise ValueError(f"baseline={baseline!r}: give 'zeros', 'pad' (the pad token's embedding at every position) "
                     "or a tensor of the embeddings' shape")


def integrated_gradients(model: nn.Module, *inputs: Tensor, target: int | Tensor | Callable | None = None,
                         position: int | None = -1, score: str = "logprob", side: str | None = None,
                         baseline: str | Tensor | None = None, steps: int = 50, method: str = "gausslegendre",
                         batch_points: int | None = None, **kwargs) -> Attribution:
    """Integrated gradients at the embeddings of one side, from `baseline` to the input.

    Args:
        model: as `gradient_x_input`, and so are inputs, kwargs, target, position, score and side.
        baseline: x' = `pad` (the embedding module's output on the pad token at every position:
            positions and segments stay, the tokens go), `zeros`, or a tensor (B, T, D) / (T, D);
            None (default): `pad` where the config has a pad_token_id, else `zeros` (GPT-2). Zeros sit badly with a LayerNorm right after the embeddings (post-LN layers,
            BERT's embedding norm): LN(alpha x) = LN(x) for all but the smallest alpha, so f
            jumps next to alpha = 0, where no quadrature looks, and `delta` is large.
        steps: quadrature points.
        method: the rule (`RULES`): gausslegendre (default) or riemann_trapezoid / _middle /
            _left / _right.
        batch_points: integration points per forward pass (default all: `steps` * B rows).

    Returns:
        An `Attribution` with baseline_value and delta = sum(attributions) - (f(x) - f(x')).

    Raises:
        ValueError: bad target, position, score, side, baseline, steps or method.
    """
    alphas, weights = integration_points(steps, method)
    if batch_points is not None and (not isinstance(batch_points, int) or batch_points < 1):
        raise ValueError(f"batch_points must be a positive integer, got {batch_points!r}")
    site, B, f = _prepare(model, inputs, target, position, score, side)
    chunk = batch_points or steps
    with _eval(model):
        with torch.no_grad():
            output, x = _forward(model, site, inputs, kwargs, 1, B)
            f.resolve(output)
            value = f(output)
            if baseline is None:
                baseline = "pad" if getattr(model.config, "pad_token_id", None) is not None else "zeros"
            base = _baseline(model, site, inputs, kwargs, B, x, baseline)
            base_value = f(_forward(model, site, inputs, kwargs, 1, B, replace=lambda out: base)[0])
        total = torch.zeros_like(x, dtype=torch.float32)
        with torch.enable_grad():
            for start in range(0, steps, chunk):
                a = torch.tensor(alphas[start:start + chunk], dtype=x.dtype, device=x.device)
                w = torch.tensor(weights[start:start + chunk], dtype=torch.float32, device=x.device)
                n = len(a)
                leaf = (base + a[:, None, None, None] * (x - base)).flatten(0, 1).requires_grad_(True)  # (n*B, T, D)
                output, _ = _forward(model, site, inputs, kwargs, n, B, replace=lambda out: leaf)
                (grad,) = torch.autograd.grad(f(output).sum(), leaf)
                total += (grad.float().view(n, *x.shape) * w[:, None, None, None]).sum(0)
    a = (x - base).float() * total
    delta = a.sum((1, 2)) - (value - base_value)
    return Attribution(a, a.sum(-1), value, site.name, target=f.target, baseline_value=base_value, delta=delta,
                       baseline=baseline if isinstance(baseline, str) else "tensor")
