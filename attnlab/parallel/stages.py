"""A pipeline's stages: how a model's layers are cut into stages (`stage_layers`, `split_stages`),
which models can be cut (`check_pipeline_supported`), each stage as a module of the model's own
modules (`StageModule`), the parameters several stages share, and the padding that keeps a
batch's widths fixed for torch's schedules (`pad_batch`, `join_batches`). The schedules that run
the stages, and the picture of what each stage holds and sends: `attnlab.parallel.pipeline`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.families import FAMILIES, family
from attnlab.models.transformer import EncoderDecoder
from attnlab.nn.kernels import kernel_class

PER_TOKEN_HEADS = ("lm", "mlm", "token_classification", "none")


def stage_inputs(arch: str) -> dict[str, str | None]:
    """The keyword inputs of every stage of a model of `arch` (the batch tensors its family's
    `batch_loss` reads besides the first stage's ids and the targets), each with the axis it
    spans: "input" the width of the first stage's ids (T; an encoder-decoder's source, S),
    "target" the targets' (Tt), None a number per row."""
    return family(arch).stage_inputs or {}


def pipeline_archs() -> tuple[str, ...]:
    """The archs whose models a pipeline can cut (their family names `stage_inputs`)."""
    return tuple(name for name, f in FAMILIES.items() if f.stage_inputs is not None)


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """The layer indices of each stage: as even as possible, earlier stages one more.

    >>> stage_layers(5, 2)
    [range(0, 3), range(3, 5)]
    """
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for s in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return [range(bounds[s], bounds[s + 1]) for s in range(num_stages)]


def check_pipeline_supported(config: ModelConfig, num_stages: int) -> None:
    """Raise ValueError when `config` cannot be cut into `num_stages` pipeline stages.

    Args:
        config: the model's config.
        num_stages: P, the pipeline-parallel size.

    Raises:
        ValueError: the message names the variant (field and value) and the pipeline axis.
    """
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"pp must be a positive integer, got {num_stages!r}")
    if num_stages == 1:
        return
    own = family(config)
    if own.stage_inputs is None:
        raise ValueError(f"pipeline parallel (pp={num_stages}) supports arch {', '.join(pipeline_archs())}, not "
                         f"arch={config.arch!r}; use pp=1 (tensor or data parallel) for it")
    if len(own.stacks(config)) > 1:  # the encoder's layers, then the decoder's, cut as one stack
        layers = config.num_layers + config.resolved_decoder_layers
        if num_stages > layers:
            raise ValueError(f"pipeline parallel: pp={num_stages} stages is deeper than the model's {layers} layers "
                             f"(num_layers={config.num_layers} encoder + {config.resolved_decoder_layers} decoder); "
                             f"choose pp <= {layers}")
    elif num_stages > config.num_layers:
        raise ValueError(f"pipeline parallel: pp={num_stages} stages is deeper than the model's "
                         f"num_layers={config.num_layers}; choose pp <= {config.num_layers}")
    if config.head not in PER_TOKEN_HEADS:
        raise ValueError(f"pipeline parallel (pp={num_stages}) supports the per-token heads "
                         f"({', '.join(PER_TOKEN_HEADS)}), not head={config.head!r} (pooled)")
    if config.moe.num_experts:
        raise ValueError(f"pipeline parallel (pp={num_stages}) does not support moe.num_experts="
                         f"{config.moe.num_experts}: the balance loss sums over layers on every stage; use pp=1")
    if config.memory_len:
        raise ValueError(f"pipeline parallel (pp={num_stages}) does not support memory_len={config.memory_len} "
                         "(a segment memory carries every layer's state between steps); use pp=1")
    att = config.attention
    if kernel_class(att.kernel).needs_token_ids(att.kernel_options):
        raise ValueError(f"pipeline parallel (pp={num_stages}) does not support attention.kernel={att.kernel!r} "
                         "with these options: it picks tokens by id, which only the first stage sees")


class _Part(NamedTuple):
    """A stage's share of one stack: where its modules sit on the stage, and what it holds."""

    modules: nn.Module  # the stage itself (decoder, encoder) or its `encoder` / `decoder` child
    stack: nn.Module  # the model's Encoder or Decoder (its `layer_inputs` builds the masks and positions)
    start: bool  # holds the stack's first layer: the embeddings run here
    end: bool  # holds its last layer: the final norm (and, last in the model, the head) run here


class StageModule(nn.Module):
    """Stage `index` of `num_stages`: the model's own modules, under the model's names (`embed`,
    `layers.<i>`, `final_norm`, `head`; `encoder.layers.<i>`, `decoder.embed`, ... for an
    encoder-decoder), so that the state dicts of all stages together are the model's.

    An encoder-decoder's layers are cut as one stack, the encoder's first: a stage holding the
    encoder's last layer applies its final norm (the memory), and every stage after it passes the
    memory on beside the decoder's hidden states, for the cross-attention of its decoder layers.

        what a stage receives (`receives`) and returns:
        decoder, encoder     ids (b, T) on the first stage, hidden (b, T, D) elsewhere -> hidden, or the
                             head's output on the last stage
        encoder-decoder      src ids (b, S) | encoder hidden (b, S, D) -> encoder hidden, or the memory
                             (b, S, D) where the encoder ends; with decoder layers -> (decoder hidden
                             (b, Tt, D), memory); memory | (decoder hidden, memory) -> the same, or the
                             head's output on the last stage

    The masks and the target ids are keyword arguments of every stage (torch's schedules pass a
    step's keyword arguments to every stage): attention_mask (b, T), prefix_lengths (b,),
    document_ids (b, T), token_type_ids (b, T) for a decoder or encoder; src_mask (b, S), tgt_ids
    (b, Tt), tgt_mask (b, Tt) for an encoder-decoder. Each stage builds its layers' masks,
    positions and position bias from them with the stack's own `layer_inputs`, as `features` does.
    """

    def __init__(self, model: nn.Module, index: int, num_stages: int):
        super().__init__()
        if not 0 <= index < num_stages:
            raise ValueError(f"stage index {index} is outside [0, {num_stages})")
        self.index, self.num_stages = index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.encoder_decoder = isinstance(model, EncoderDecoder)
        stacks = [("encoder", model.encoder), ("decoder", model.decoder)] if self.encoder_decoder else [("", model)]
        span = stage_layers(sum(len(stack.layers) for _, stack in stacks), num_stages)[index]
        self._parts: dict[str, _Part] = {}  # "encoder", "decoder", or "" (a decoder or encoder): a plain dict
        offset = 0
        for name, stack in stacks:
            n = len(stack.layers)
            mine = range(max(span.start - offset, 0), min(span.stop - offset, n))  # this stack's layers here
            offset += n
            if len(mine):
                self._parts[name] = self._hold(name, stack, mine)
        first_layer = "decoder" if "encoder" not in self._parts else "encoder"
        if self.is_first:
            self.receives: tuple[str, ...] = ()
        elif self.encoder_decoder and first_layer == "decoder" and not self._parts["decoder"].start:
            self.receives = ("target", "input")  # (decoder hidden (b, Tt, D), memory (b, S, D))
        else:
            self.receives = ("input",)  # hidden (b, T, D); an encoder-decoder's encoder hidden or memory (b, S, D)

    def _hold(self, name: str, stack: nn.Module, mine: range) -> _Part:
        """Register the modules of `stack` this stage runs (layers `mine`) under the model's names."""
        container = self
        if name:
            container = nn.Module()
            self.add_module(name, container)
        start, end = mine.start == 0, mine.stop == len(stack.layers)
        container.layers = nn.ModuleDict({str(i): stack.layers[i] for i in mine})  # global indices: the model's names
        container.position_bias = stack.position_bias  # ALiBi / T5 bias: every stage computes its own
        for child, module in stack.named_children():  # embeddings first, the rest (final norm, head, ...) last
            if child in ("layers", "position_bias") or module is None:
                continue
            if (child == "embed" and start) or (child != "embed" and end):
                container.add_module(child, module)
        return _Part(container, stack, start, end)

    def forward(self, *received: Tensor, attention_mask: Tensor | None = None, prefix_lengths: Tensor | None = None,
                document_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                src_mask: Tensor | None = None, tgt_ids: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        if not self.encoder_decoder:
            x = received[0]
            h = self._run(self._parts[""], x if self.is_first else None, x, attention_mask,
                          prefix_lengths=prefix_lengths, document_ids=document_ids, token_type_ids=token_type_ids)
            return self._head(self, h) if self.is_last else h
        encoder, decoder = self._parts.get("encoder"), self._parts.get("decoder")
        h = None
        if encoder is not None:
            x = received[0]
            memory = self._run(encoder, x if encoder.start else None, x, src_mask)  # (b, S, D)
            if decoder is None:
                return memory  # the encoder's hidden states, or (where it ends) the memory
        else:
            memory = received[-1]
            h = received[0] if len(received) == 2 else None
        h = self._run(decoder, tgt_ids if decoder.start else None, h, tgt_mask, memory=memory, memory_mask=src_mask)
        return self._head(self.decoder, h) if self.is_last else (h, memory)

    @staticmethod
    def _run(part: _Part, ids: Tensor | None, h: Tensor | None, padding: Tensor | None, *,
             memory: Tensor | None = None, memory_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
             **structure: Tensor | None) -> Tensor:
        """This stage's layers of one stack: its embeddings of `ids` first where it holds the
        stack's first layer (else the hidden states `h` it received), its final norm last where it
        holds the stack's last layer. `structure`: prefix_lengths, document_ids."""
        B, T = (ids if ids is not None else h).shape[:2]
        device = (ids if ids is not None else h).device
        x = part.stack.layer_inputs(B, T, padding, memory_mask=memory_mask, device=device, **structure)
        modules = part.modules
        if ids is not None:
            h = modules.embed(ids, x.positions, token_type_ids)  # (b, T, D)
        for layer in modules.layers.values():
            h = layer(h, x.mask, bias=x.bias, positions=x.positions, key_positions=x.key_positions, memory=memory,
                      memory_mask=x.memory_mask)
        final_norm = getattr(modules, "final_norm", None) if part.end else None
        return final_norm(h) if final_norm is not None else h

    @staticmethod
    def _head(modules: nn.Module, h: Tensor) -> Tensor:
        head = getattr(modules, "head", None)
        return head(h) if head is not None else h


def split_stages(model: nn.Module, num_stages: int) -> list[StageModule]:
    """Every stage of `model` (views that share its modules; nothing is copied).

    Raises:
        ValueError: a model or split `check_pipeline_supported` refuses.
        TypeError: a model without `.config`.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"pipeline parallel expects a model from attnlab.build_model (with .config), got "
                        f"{type(model).__name__}")
    check_pipeline_supported(config, num_stages)
    return [StageModule(model, s, num_stages) for s in range(num_stages)]


def shared_parameters(model: nn.Module, stages: list[StageModule]) -> list[tuple[str, nn.Parameter, list[int]]]:
    """(name, parameter, stages holding it) for each parameter held by more than one stage, in
    the model's parameter order (the tied token embedding / LM head, the T5 bias table)."""
    held = [{id(p) for p in stage.parameters()} for stage in stages]
    out = []
    for name, p in model.named_parameters():
        holders = [s for s, ids in enumerate(held) if id(p) in ids]
        if len(holders) > 1:
            out.append((name, p, holders))
    return out


def _widen(t: Tensor, width: int, value: int) -> Tensor:
    """(B, W) t right-padded to `width` columns of `value`."""
    extra = width - t.shape[1]
    return t if extra <= 0 else torch.cat([t, t.new_full((t.shape[0], extra), value)], 1)


def pad_batch(arch: str, input_ids: Tensor, targets: Tensor, inputs: dict[str, Tensor], widths: tuple[int, int], *,
              ignore_index: int = -100) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """A pipeline's batch right-padded to `widths` (of the ids, of the targets) without changing
    its loss or gradients: the padded positions take no loss (`ignore_index`) and no real position
    attends to them -- a decoder's come after every real one (causal), an encoder's and a source's
    are masked out (a mask of ones is made first where the batch has none). torch's schedules fix
    the shapes the stages send at the first step: a pipeline pads narrower batches to them
    (`Pipeline.step`), and batches to one width to join them.

        >>> ids, labels, _ = pad_batch("decoder", torch.tensor([[5, 6]]), torch.tensor([[6, 7]]), {}, (3, 3))
        >>> ids.tolist(), labels.tolist()
        ([[5, 6, 0]], [[6, 7, -100]])
    """
    width, target_width = widths
    axes = stage_inputs(arch)
    inputs = dict(inputs)
    bidirectional = family(arch).padding_mask
    if bidirectional is not None and bidirectional not in inputs and width > input_ids.shape[1]:
        inputs[bidirectional] = torch.ones_like(input_ids)
    for name, t in inputs.items():
        if axes[name] is not None:
            inputs[name] = _widen(t, width if axes[name] == "input" else target_width, 0)
    return _widen(input_ids, width, 0), _widen(targets, target_width, ignore_index), inputs


def join_batches(arch: str, batches: list[tuple[Tensor, Tensor, dict[str, Tensor]]], *,
                 ignore_index: int = -100) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(ids, targets, keyword inputs) batches padded to the widest (`pad_batch`) and joined along
    the rows; a mask some of them lack is ones there.

    Raises:
        ValueError: batches that differ in a tensor other than a mask.
    """
    widths = (max(ids.shape[1] for ids, _, _ in batches), max(t.shape[1] for _, t, _ in batches))
    padded = [pad_batch(arch, *b, widths, ignore_index=ignore_index) for b in batches]
    names = sorted(set().union(*(inputs for _, _, inputs in padded)))
    for ids, _, inputs in padded:
        for name in names:
            if name not in inputs and not name.endswith("mask"):
                raise ValueError(f"batches to join must hold the same tensors: one has {name}, another not")
            if name not in inputs:
                width = widths[0] if stage_inputs(arch)[name] == "input" else widths[1]
                inputs[name] = torch.ones(ids.shape[0], width, dtype=torch.long, device=ids.device)
    return (torch.cat([ids for ids, _, _ in padded]), torch.cat([t for _, t, _ in padded]),
            {name: torch.cat([inputs[name] for _, _, inputs in padded]) for name in names})
