"""Pipeline parallelism: a Transformer's layer stack cut into P stages on P ranks, trained on
micro-batches under a GPipe or 1F1B schedule from `torch.distributed.pipelining`.

GPipe: Huang et al. 2019, https://arxiv.org/abs/1811.06965; 1F1B and the tp x pp x dp recipe
(PTD-P): Narayanan et al. 2021, https://arxiv.org/abs/2104.04473. Notation: P stages, m
micro-batches of b rows, T positions, D d_model, V vocabulary, L layers.

    stage 0      embeddings, layers [0, L_0)                     ids (b, T)  -> h (b, T, D)
    stage s      layers [L_{s-1}, L_s)                           h (b, T, D) -> h (b, T, D)
    stage P-1    layers [L_{P-2}, L), final norm, head, loss     h (b, T, D) -> logits (b, T, V)

    GPipe, P = 2, m = 4      stage 0   F1 F2 F3 F4 .  .  B1 B2 B3 B4
                             stage 1   .  F1 F2 F3 F4 B1 B2 B3 B4 .
    idle share of each stage (the bubble): (P - 1) / (m + P - 1); 1F1B has the same bubble but
    holds at most P - s micro-batches of activations on stage s instead of m.

On a tp x pp x dp mesh (`init_from_env(tp, pp=pp)`, `attnlab.training.distributed`):

    ctx = init_from_env(tp=2, pp=2)                                  # torchrun --nproc-per-node 8: dp = 2
    model = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)
    pipe = Pipeline(model, ctx.pp_group, micro_batches=8, dp_group=ctx.dp_group)
    loss = pipe.step(*shard_batch((ids, labels), ctx))              # this pipeline's rows

Every rank builds the same full model and keeps the modules of its stage (`StageModule`, views
sharing the model's modules, its state-dict names the full model's). The stages send the hidden
states forward and their gradients backward, one (b, T, D) tensor per micro-batch each way.
Parameters that several stages hold are kept equal by summing their gradients over the stages
that hold them after each step: the token embedding tied to the LM head (first and last stage,
as in Megatron-LM), the T5 bias table (every stage). The layers split as evenly as they go,
earlier stages taking one more when P does not divide L (`stage_layers`).

Loss: each micro-batch's summed token loss divided by the number of targets of the whole batch,
so the step's loss and gradients are those of one pass over the whole batch, padding and
ignored targets included (`scale_grads=False` in torch's schedule). A tensor-parallel model
(`tensor_parallel(model, tp_group, gather_output=False)` first) uses the vocabulary-parallel
cross-entropy on its last stage.

Supported: arch decoder and encoder with a per-token head (lm, mlm, token_classification) or
none, every position scheme and kernel but those that pick tokens by id; unpadded batches (no
attention_mask: packed language-model rows). Refused (`check_pipeline_supported`): more stages
than layers, encoder_decoder and rnn_encoder_decoder, pooled heads, mixture-of-experts (its
balance loss spans the stages), segment memory (memory_len). Dropout draws from each rank's own
generator: masks differ from a one-process run.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.nn.kernels import kernel_class
from attnlab.nn.masks import causal_mask
from attnlab.parallel.comm import group_rank, group_size

PER_TOKEN_HEADS = ("lm", "mlm", "token_classification", "none")


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
    if config.arch not in ("decoder", "encoder"):
        raise ValueError(f"pipeline parallel (pp={num_stages}) supports arch decoder and encoder, not "
                         f"arch={config.arch!r}; use pp=1 (tensor or data parallel) for it")
    if num_stages > config.num_layers:
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


class StageModule(nn.Module):
    """Stage `index` of `num_stages` of a decoder or encoder: the model's own modules, under the
    model's names (`embed`, `layers.<i>`, `final_norm`, `head`, ...), so that the state dicts of
    all stages together are the model's.

    forward: ids (b, T) on the first stage, hidden states (b, T, D) elsewhere -> hidden states,
    or the head's output on the last stage. Positions 0..T-1, no padding mask.
    """

    def __init__(self, model: nn.Module, index: int, num_stages: int):
        super().__init__()
        if not 0 <= index < num_stages:
            raise ValueError(f"stage index {index} is outside [0, {num_stages})")
        self.index, self.num_stages = index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.causal = model.causal
        self.kernel_is_causal = model.kernel_is_causal  # the kernel masks the future itself
        span = stage_layers(len(model.layers), num_stages)[index]
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in span})  # global indices: the model's names
        self.position_bias = model.position_bias  # ALiBi / T5 bias: every stage computes its own
        for name, module in model.named_children():  # embeddings first, the rest (final norm, head, ...) last
            if name in ("layers", "position_bias") or module is None:
                continue
            if (name == "embed" and self.is_first) or (name != "embed" and self.is_last):
                self.add_module(name, module)

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        positions = torch.arange(T, device=x.device)[None]  # (1, T)
        h = self.embed(x, positions) if self.is_first else x  # (b, T, D)
        mask = causal_mask(T, device=x.device)[None, None] if self.causal and not self.kernel_is_causal else None
        bias = self.position_bias(positions, positions) if self.position_bias is not None else None
        for layer in self.layers.values():
            h = layer(h, mask, bias=bias, positions=positions, key_positions=positions)
        if not self.is_last:
            return h
        if getattr(self, "final_norm", None) is not None:
            h = self.final_norm(h)
        return self.head(h) if getattr(self, "head", None) is not None else h


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


def is_backend_error(err: RuntimeError) -> bool:
    """Whether err comes from the communication backend (a peer gone, a timeout), not from the
    model: NCCL raises DistError subclasses, gloo plain RuntimeErrors naming itself."""
    return isinstance(err, dist.DistError) or "gloo" in str(err).lower()


def _collective_error(index: int, num_stages: int, err: RuntimeError) -> RuntimeError:
    """The CollectiveError naming this stage for a backend error (`is_backend_error`)."""
    from attnlab.training.distributed import CollectiveError

    return CollectiveError(f"pipeline stage {index} of {num_stages}: a send, receive or all-reduce failed or timed "
                           f"out; another rank probably died or hangs. "
                           f"Cause: {str(err).splitlines()[0] if str(err) else type(err).__name__}")


def _schedules() -> dict[str, type]:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


SCHEDULES = ("gpipe", "1f1b")


class Pipeline:
    """This rank's stage of `model` and the schedule that trains it over the pipeline `group`.

        pipe = Pipeline(attnlab.build_model(cfg), ctx.pp_group, micro_batches=4)
        opt = torch.optim.Adam(pipe.parameters(), lr=1e-3)
        for ids, labels in batches:          # the same batch on every rank of the pipeline
            opt.zero_grad()
            loss = pipe.step(ids, labels)    # forward + backward of all micro-batches; loss on every rank
            opt.step()

    Args:
        model: a decoder or encoder from `attnlab.build_model` (or tensor-parallel with
            gather_output=False), identical on every rank of the group.
        group: the pipeline-parallel process group; rank r of the group runs stage r. None:
            the default group (or one stage without torch.distributed: plain gradient accumulation).
        micro_batches: m, the micro-batches each step's batch is cut into.
        schedule: "gpipe" (all forwards, then all backwards) or "1f1b" (one forward, one backward).
        loss_fn: (output, targets) -> the micro-batch's summed loss; default the token
            cross-entropy summed over targets that are not `ignore_index`. Each step divides it by
            the number of such targets in the whole batch.
        ignore_index: targets that take no loss.
        label_smoothing: eps of the default loss (PyTorch's definition, as `attnlab.training.losses`).
        dp_group: the data-parallel group of this stage (`ParallelContext.dp_group`: the same
            stage of the other pipelines, each given its own rows); the step's loss is then
            divided by the targets of all of them and the gradients summed over them, so that
            dp pipelines take the step of one pipeline over all their rows.

    Raises:
        ValueError: a config `check_pipeline_supported` refuses; micro_batches < 1; an unknown schedule.
    """

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None, *, micro_batches: int = 1,
                 schedule: str = "gpipe", loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
                 ignore_index: int = -100, label_smoothing: float = 0.0, dp_group: dist.ProcessGroup | None = None):
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
        self.num_stages, self.index = group_size(group), group_rank(group)
        stages = split_stages(model, self.num_stages)
        self.stage = stages[self.index]
        self.config: ModelConfig = model.config
        self.group, self.micro_batches, self.ignore_index = group, micro_batches, ignore_index
        self.label_smoothing = label_smoothing
        self.dp_group = dp_group if dp_group is not None and group_size(dp_group) > 1 else None
        shared = shared_parameters(model, stages)
        self._shared = self._shared_groups(shared)
        self._first_holder = {id(p): holders[0] for _, p, holders in shared}
        self._tp_group = model.tp_group if getattr(model, "tp_size", 1) > 1 else None
        self._loss_fn = loss_fn or self._token_loss
        self._targets = 1
        self.device = next(model.parameters()).device
        self._schedule, self._step_options = None, {}
        if self.num_stages > 1:
            from torch.distributed.pipelining import PipelineStage

            torch_stage = PipelineStage(self.stage, self.index, self.num_stages, self.device, group=group)
            self._schedule = _schedules()[schedule](torch_stage, micro_batches, loss_fn=self._scaled_loss,
                                                    scale_grads=False)
            # by default the last stage keeps every micro-batch's output (the (b, T, V) logits) until the
            # next step and concatenates them into a return value `step` never reads: m micro-batches of
            # logits held, not 1F1B's one (a torch without this switch keeps them)
            if "return_outputs" in inspect.signature(self._schedule.step).parameters:
                self._step_options = {"return_outputs": False}

    def parameters(self):
        """This stage's parameters (for the optimizer)."""
        return self.stage.parameters()

    def counts(self, p: nn.Parameter) -> bool:
        """Whether this stage counts parameter p in a sum over the stages (a gradient norm): p is
        its own, or it holds p with other stages and is the first of them (the tied embedding
        counts on the first stage, not again on the last)."""
        return self._first_holder.get(id(p), self.index) == self.index

    def _token_loss(self, output: Tensor, targets: Tensor) -> Tensor:
        if self._tp_group is not None:  # (b, T, V/n) vocabulary slices: the mean over kept targets, times their number
            kept = (targets != self.ignore_index).sum()
            from attnlab.parallel.tensor import vocab_parallel_cross_entropy

            return vocab_parallel_cross_entropy(output, targets, self._tp_group, self.ignore_index,
                                                label_smoothing=self.label_smoothing,
                                                vocab_size=self.config.vocab_size) * kept
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1),
                               ignore_index=self.ignore_index, reduction="sum", label_smoothing=self.label_smoothing)

    def _scaled_loss(self, output: Tensor, targets: Tensor) -> Tensor:
        return self._loss_fn(output, targets) / self._targets

    def step(self, input_ids: Tensor, targets: Tensor) -> float:
        """Forward and backward of one batch in micro-batches; gradients land in `.grad` (added to
        what is there: zero them first). Every rank of the pipeline passes the same batch.

        Args:
            input_ids: (B, T) token ids (read on the first stage).
            targets: (B, T) targets (read on the last stage); `ignore_index` where none.

        Returns:
            the batch's loss (mean over its targets; with a dp_group, over the targets of every
            data-parallel pipeline's batch), on every rank.

        Raises:
            ValueError: shapes that differ, or B not divisible by micro_batches.
            CollectiveError: a peer stage died or timed out.
        """
        if input_ids.dim() != 2 or tuple(targets.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"input_ids must be (B, T) and targets (B, T); got {tuple(input_ids.shape)} and "
                             f"{tuple(targets.shape)}")
        if input_ids.shape[0] % self.micro_batches:
            raise ValueError(f"batch size {input_ids.shape[0]} is not divisible by micro_batches={self.micro_batches}")
        try:
            kept = torch.tensor(float((targets != self.ignore_index).sum()), dtype=torch.float64, device=self.device)
            if self.dp_group is not None:  # the targets of every data-parallel pipeline
                dist.all_reduce(kept, group=self.dp_group)
            self._targets = max(float(kept), 1.0)
            if self._schedule is None:
                loss = torch.tensor(self._step_alone(input_ids, targets), dtype=torch.float64, device=self.device)
            else:
                loss = self._step_pipelined(input_ids, targets)
            if self.dp_group is not None:  # each pipeline's share of the loss and of its gradients: sum them
                self._sum_data_parallel_gradients()
                dist.all_reduce(loss, group=self.dp_group)
        except RuntimeError as err:
            if not is_backend_error(err):
                raise
            raise _collective_error(self.index, self.num_stages, err) from err
        return float(loss)

    @torch.no_grad()
    def forward_only(self, input_ids: Tensor) -> Tensor | None:
        """The model's output for a whole batch, forward only (evaluation): each stage receives
        the hidden states from the one before, runs its layers and sends them on; no micro-batches,
        nothing kept for a backward pass. Every rank of the pipeline passes the same batch.

        Args:
            input_ids: (B, T) token ids (read on the first stage; the others read their shape).

        Returns:
            the last stage's output (the head's logits, (B, T, V) or (B, T, V/n) under tensor
            parallel) on the last stage, None on the others.

        Raises:
            CollectiveError: a peer stage died or timed out.
        """
        if self.num_stages == 1:
            return self.stage(input_ids.to(self.device))
        B, T = input_ids.shape
        try:
            if self.stage.is_first:
                h = self.stage(input_ids.to(self.device))
            else:
                h = torch.empty(B, T, self.config.d_model, device=self.device)  # float32 between stages
                dist.recv(h, group_src=self.index - 1, group=self.group)
                h = self.stage(h)
            if self.stage.is_last:
                return h
            dist.send(h.float().contiguous(), group_dst=self.index + 1, group=self.group)
        except RuntimeError as err:
            if not is_backend_error(err):
                raise
            raise _collective_error(self.index, self.num_stages, err) from err
        return None

    def _step_pipelined(self, input_ids: Tensor, targets: Tensor) -> Tensor:
        """torch's schedule over the stages; the loss (from the last stage) on every stage."""
        losses: list[Tensor] = []
        args = (input_ids.to(self.device),) if self.stage.is_first else ()
        kwargs = {"target": targets.to(self.device), "losses": losses} if self.stage.is_last else {}
        self._schedule.step(*args, **kwargs, **self._step_options)
        loss = torch.tensor(sum(float(x.detach()) for x in losses), dtype=torch.float64, device=self.device)
        self._sum_shared_gradients()
        dist.broadcast(loss, group_src=self.num_stages - 1, group=self.group)
        return loss

    def _sum_data_parallel_gradients(self) -> None:
        """Sum this stage's gradients over the data-parallel group (one flat all-reduce)."""
        params = [p for p in self.stage.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _step_alone(self, input_ids: Tensor, targets: Tensor) -> float:
        """One stage: the micro-batches one after the other (gradient accumulation)."""
        total = 0.0
        for ids, tgt in zip(input_ids.chunk(self.micro_batches), targets.chunk(self.micro_batches)):
            loss = self._scaled_loss(self.stage(ids.to(self.device)), tgt.to(self.device))
            loss.backward()
            total += float(loss.detach())
        return total

    def _shared_groups(self, shared: list[tuple[str, nn.Parameter, list[int]]]
                       ) -> list[tuple[dist.ProcessGroup | None, list[nn.Parameter]]]:
        """(process group of the holding stages, parameters) for each set of stages that share
        parameters and include this one: the pipeline group when every stage holds them (the T5
        bias), else a group of the holders alone (the first and last stage for a tied embedding),
        created by the holders only (`use_local_synchronization`), so other pipelines of a mesh
        need not take part."""
        by_holders: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for _, p, holders in shared:
            by_holders.setdefault(tuple(holders), []).append(p)
        out = []
        for holders, params in by_holders.items():  # the same order on every holder
            if self.index not in holders:
                continue
            group = self.group
            if len(holders) < self.num_stages:
                ranks = [dist.get_global_rank(self.group, h) if self.group is not None else h for h in holders]
                group = dist.new_group(ranks, use_local_synchronization=True)
            out.append((group, params))
        return out

    def _sum_shared_gradients(self) -> None:
        """Sum the gradients of the parameters several stages hold over those stages (one
        all-reduce per set of holders), so that their copies stay equal."""
        for group, params in self._shared:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            offset = 0
            for p in params:
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole model's state dict, gathered from every stage (every rank calls; each gets it).

        Tensor-parallel shards stay shards (gather those with `gather_full_state` over the
        tensor-parallel group first).
        """
        local = {k: v.detach().cpu().clone() for k, v in self.stage.state_dict().items()}
        if self.num_stages == 1:
            return local
        parts: list[dict[str, Tensor] | None] = [None] * self.num_stages
        dist.all_gather_object(parts, local, group=self.group)
        out: dict[str, Tensor] = {}
        for part in parts:
            out.update(part)
        return out
