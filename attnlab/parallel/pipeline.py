"""Pipeline parallelism: a Transformer's layer stack cut into P stages on P ranks, trained on
micro-batches under a GPipe or 1F1B schedule from `torch.distributed.pipelining`.

GPipe: Huang et al. 2019, https://arxiv.org/abs/1811.06965; 1F1B and the tp x pp x dp recipe
(PTD-P): Narayanan et al. 2021, https://arxiv.org/abs/2104.04473. Notation: P stages, m
micro-batches of b rows, T positions, D d_model, V vocabulary, L layers.

    stage 0      embeddings, layers [0, L_0)                     ids (b, T)  -> h (b, T, D)
    stage s      layers [L_{s-1}, L_s)                           h (b, T, D) -> h (b, T, D)
    stage P-1    layers [L_{P-2}, L), final norm, head, loss     h (b, T, D) -> logits (b, T, V)

    an encoder-decoder (S source, Tt target positions): its Le + Ld layers cut as one stack, e.g.
    stage 0      encoder: embeddings, layers, final norm         src (b, S) -> memory (b, S, D)
                 (decoder: embeddings, first layers)                        -> (h (b, Tt, D), memory)
    stage s      decoder layers (cross-attention to the memory)  (h, memory) -> (h, memory)
    stage P-1    decoder layers, final norm, head, loss          (h, memory) -> logits (b, Tt, V)

    GPipe, P = 2, m = 4      stage 0   F1 F2 F3 F4 .  .  B1 B2 B3 B4
                             stage 1   .  F1 F2 F3 F4 B1 B2 B3 B4 .
    idle share of each stage (the bubble): (P - 1) / (m + P - 1); 1F1B has the same bubble but
    holds at most P - s micro-batches of activations on stage s instead of m.

On a tp x pp x dp mesh (`init_from_env(tp, pp=pp)`, `attnlab.training.strategy.distributed`):

    ctx = init_from_env(tp=2, pp=2)                                  # torchrun --nproc-per-node 8: dp = 2
    model = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)
    pipe = Pipeline(model, ctx.pp_group, micro_batches=8, dp_group=ctx.dp_group)
    loss = pipe.step(*shard_batch((ids, labels), ctx))              # this pipeline's rows

Every rank has the same full model and keeps the modules of its stage (`StageModule`, views
sharing the model's modules, its state-dict names the full model's); `attnlab train` builds that
model on the meta device and each rank makes its own stage's tensors alone
(attnlab.parallel.materialise), so a rank holds its stage, not the model. The stages send the hidden
states forward and their gradients backward, one (b, T, D) tensor per micro-batch each way (an
encoder-decoder's stages after the encoder: the memory too). The masks (padding, prefix lengths,
document ids) and an encoder-decoder's target ids are keyword arguments that torch's schedules
give every stage, each of which builds its layers' masks, positions and position bias from them
with the stack's own `layer_inputs`. Parameters that several stages hold are kept equal by summing
their gradients over the stages that hold them after each step: the token embedding tied to the
LM head (first and last stage, as in Megatron-LM; an encoder-decoder's shared embedding also
where the decoder starts), the T5 bias table (every stage of its stack). The layers split as
evenly as they go, earlier stages taking one more when P does not divide L (`stage_layers`).
torch fixes the shapes the stages send at the first step: a narrower batch is padded to them
(`pad_batch`: the padding takes no loss and no real position sees it), a wider one makes the
stages agree on new shapes.

Loss: each micro-batch's summed token loss divided by the number of targets of the whole batch,
so the step's loss and gradients are those of one pass over the whole batch, padding and
ignored targets included (`scale_grads=False` in torch's schedule). A tensor-parallel model
(`tensor_parallel(model, tp_group, gather_output=False)` first) uses the vocabulary-parallel
cross-entropy on its last stage.

Supported: arch decoder, encoder and encoder_decoder with a per-token head (lm, mlm,
token_classification) or none, every position scheme and kernel but those that pick tokens by
id; padded batches, prefix LMs, packed documents (`stage_inputs`). Refused
(`check_pipeline_supported`): more stages than layers, rnn_encoder_decoder, pooled heads,
mixture-of-experts (its balance loss spans the stages), segment memory (memory_len). Dropout
draws from each rank's own generator: masks differ from a one-process run.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.families import family
from attnlab.parallel.comm import group_rank, group_size
from attnlab.parallel.stages import pad_batch, shared_parameters, split_stages, stage_inputs

def is_backend_error(err: RuntimeError) -> bool:
    """Whether err comes from the communication backend (a peer gone, a timeout), not from the
    model: NCCL raises DistError subclasses, gloo plain RuntimeErrors naming itself."""
    return isinstance(err, dist.DistError) or "gloo" in str(err).lower()


def _collective_error(index: int, num_stages: int, err: RuntimeError) -> RuntimeError:
    """The CollectiveError naming this stage for a backend error (`is_backend_error`)."""
    from attnlab.training.strategy.distributed import CollectiveError

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
        model: a decoder, encoder or encoder-decoder from `attnlab.build_model` (or
            tensor-parallel with gather_output=False), identical on every rank of the group.
        group: the pipeline-parallel process group; rank r of the group runs stage r. None:
            the default group (or one stage without torch.distributed: plain gradient accumulation).
        micro_batches: m, the micro-batches each step's batch is cut into.
        schedule: "gpipe" (all forwards, then all backwards) or "1f1b" (one forward, one backward).
        loss_fn: (output, targets) -> the micro-batch's summed loss; default the token
            cross-entropy summed over targets that are not `ignore_index`. Each step divides it by
            the number of such targets in the whole batch.
        ignore_index: targets that take no loss.
        label_smoothing: eps of the default loss (PyTorch's definition, as `attnlab.nn.losses`).
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
        self.device = next(self.stage.parameters()).device  # (the other stages' may be on the meta device)
        self.schedule_name = schedule
        self._widths: tuple[int, int] | None = None  # (ids, targets) widths the stages send: set by the first step
        self._schedule, self._step_options = self._build_schedule() if self.num_stages > 1 else (None, {})

    def _build_schedule(self):
        """(torch's schedule over this rank's stage, the options of its `step`); torch fixes the
        shapes the stages send at its first step."""
        from torch.distributed.pipelining import PipelineStage

        torch_stage = PipelineStage(self.stage, self.index, self.num_stages, self.device, group=self.group)
        schedule = _schedules()[self.schedule_name](torch_stage, self.micro_batches, loss_fn=self._scaled_loss,
                                                    scale_grads=False)
        # by default the last stage keeps every micro-batch's output (the (b, T, V) logits) until the
        # next step and concatenates them into a return value `step` never reads: m micro-batches of
        # logits held, not 1F1B's one (a torch without this switch keeps them)
        if "return_outputs" in inspect.signature(schedule.step).parameters:
            return schedule, {"return_outputs": False}
        return schedule, {}

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

    def step(self, input_ids: Tensor, targets: Tensor, **inputs: Tensor) -> float:
        """Forward and backward of one batch in micro-batches; gradients land in `.grad` (added to
        what is there: zero them first). Every rank of the pipeline passes the same batch.

            pipe.step(ids, labels)                                            # a decoder or encoder
            pipe.step(ids, labels, prefix_lengths=prefix)                     # a prefix LM
            pipe.step(src_ids, labels, src_mask=src_mask, tgt_ids=tgt_ids, tgt_mask=tgt_mask)   # seq2seq

        Args:
            input_ids: (B, T) token ids (read on the first stage); an encoder-decoder's source ids (B, S).
            targets: (B, T) targets (read on the last stage), (B, Tt) for an encoder-decoder;
                `ignore_index` where none.
            inputs: the model's keyword tensors, given to every stage (`stage_inputs`):
                attention_mask (B, T), prefix_lengths (B,), document_ids (B, T) of a decoder;
                attention_mask, token_type_ids (B, T) of an encoder; src_mask (B, S), tgt_ids
                (B, Tt, required), tgt_mask (B, Tt) of an encoder-decoder. Masks: 1 on real tokens.
                A batch narrower than the first step's is padded to it (`pad_batch`); a wider one
                makes the stages agree on the new shapes first.

        Returns:
            the batch's loss (mean over its targets; with a dp_group, over the targets of every
            data-parallel pipeline's batch), on every rank.

        Raises:
            ValueError: shapes that differ, an input the model does not take, or B not divisible
                by micro_batches.
            CollectiveError: a peer stage died or timed out.
        """
        self._check_inputs(input_ids, targets, inputs)
        if input_ids.shape[0] % self.micro_batches:
            raise ValueError(f"batch size {input_ids.shape[0]} is not divisible by micro_batches={self.micro_batches}")
        try:
            kept = torch.tensor(float((targets != self.ignore_index).sum()), dtype=torch.float64, device=self.device)
            if self.dp_group is not None:  # the targets of every data-parallel pipeline
                dist.all_reduce(kept, group=self.dp_group)
            self._targets = max(float(kept), 1.0)
            if self._schedule is None:
                loss = torch.tensor(self._step_alone(input_ids, targets, inputs), dtype=torch.float64,
                                    device=self.device)
            else:
                loss = self._step_pipelined(input_ids, targets, inputs)
            if self.dp_group is not None:  # each pipeline's share of the loss and of its gradients: sum them
                self._sum_data_parallel_gradients()
                dist.all_reduce(loss, group=self.dp_group)
        except RuntimeError as err:
            if not is_backend_error(err):
                raise
            raise _collective_error(self.index, self.num_stages, err) from err
        return float(loss)

    @torch.no_grad()
    def forward_only(self, input_ids: Tensor, **inputs: Tensor) -> Tensor | None:
        """The model's output for a whole batch, forward only (evaluation): each stage receives
        the hidden states (and an encoder-decoder's memory) from the one before, runs its layers
        and sends them on; no micro-batches, nothing kept for a backward pass. Every rank of the
        pipeline passes the same batch.

        Args:
            input_ids: (B, T) token ids (read on the first stage; the others read their shape);
                an encoder-decoder's source ids (B, S).
            inputs: the model's keyword tensors, as `step` takes them.

        Returns:
            the last stage's output (the head's logits, (B, T, V) or (B, T, V/n) under tensor
            parallel; (B, Tt, ..) for an encoder-decoder) on the last stage, None on the others.

        Raises:
            ValueError: an input the model does not take.
            CollectiveError: a peer stage died or timed out.
        """
        self._check_inputs(input_ids, None, inputs)
        inputs = {name: t.to(self.device) for name, t in inputs.items()}
        if self.num_stages == 1:
            return self.stage(input_ids.to(self.device), **inputs)
        B = input_ids.shape[0]
        widths = {"input": input_ids.shape[1], "target": inputs["tgt_ids"].shape[1] if "tgt_ids" in inputs else 0}
        try:
            if self.stage.is_first:
                out = self.stage(input_ids.to(self.device), **inputs)
            else:  # float32 between stages
                received = [torch.empty(B, widths[axis], self.config.d_model, device=self.device)
                            for axis in self.stage.receives]
                for t in received:
                    dist.recv(t, group_src=self.index - 1, group=self.group)
                out = self.stage(*received, **inputs)
            if self.stage.is_last:
                return out
            for t in out if isinstance(out, tuple) else (out,):
                dist.send(t.float().contiguous(), group_dst=self.index + 1, group=self.group)
        except RuntimeError as err:
            if not is_backend_error(err):
                raise
            raise _collective_error(self.index, self.num_stages, err) from err
        return None

    def _check_inputs(self, input_ids: Tensor, targets: Tensor | None, inputs: dict[str, Tensor]) -> None:
        """Raise ValueError for a keyword input the model does not take or a shape that does not fit."""
        arch, takes = self.config.arch, stage_inputs(self.config.arch)
        encdec = family(arch).traits.has_source  # the targets have their own width, Tt
        unknown = sorted(set(inputs) - set(takes))
        if unknown:
            raise ValueError(f"a pipeline of arch {arch!r} takes the inputs {', '.join(takes)}; got "
                             f"{', '.join(unknown)}")
        if encdec and "tgt_ids" not in inputs:
            raise ValueError("an encoder-decoder pipeline needs tgt_ids (B, Tt) beside the source ids")
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got {tuple(getattr(input_ids, 'shape', ()))}")
        B, widths = input_ids.shape[0], {"input": input_ids.shape[1], None: None}
        widths["target"] = inputs["tgt_ids"].shape[-1] if "tgt_ids" in inputs else input_ids.shape[1]
        if targets is not None and tuple(targets.shape) != (B, widths["target"]):
            raise ValueError(f"targets must be (B, {'Tt' if encdec else 'T'}) = "
                             f"{(B, widths['target'])}, got {tuple(targets.shape)}")
        for name, t in inputs.items():
            axis = takes[name]
            want = (B,) if axis is None else (B, widths[axis])
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")

    def _step_pipelined(self, input_ids: Tensor, targets: Tensor, inputs: dict[str, Tensor]) -> Tensor:
        """torch's schedule over the stages; the loss (from the last stage) on every stage."""
        widths = (input_ids.shape[1], targets.shape[1])
        if self._widths is not None and widths != self._widths:  # torch sends the shapes of the first step
            grown = (max(widths[0], self._widths[0]), max(widths[1], self._widths[1]))
            input_ids, targets, inputs = pad_batch(self.config.arch, input_ids, targets, inputs, grown,
                                                   ignore_index=self.ignore_index)
            if grown != self._widths:  # wider than before: the stages agree on new shapes (every rank sees it)
                self._schedule, self._step_options = self._build_schedule()
        self._widths = (input_ids.shape[1], targets.shape[1])
        losses: list[Tensor] = []
        args = (input_ids.to(self.device),) if self.stage.is_first else ()
        kwargs = {"target": targets.to(self.device), "losses": losses} if self.stage.is_last else {}
        inputs = {name: t.to(self.device) for name, t in inputs.items()}
        self._schedule.step(*args, **kwargs, **inputs, **self._step_options)
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

    def _step_alone(self, input_ids: Tensor, targets: Tensor, inputs: dict[str, Tensor]) -> float:
        """One stage: the micro-batches one after the other (gradient accumulation)."""
        total = 0.0
        m = self.micro_batches
        pieces = [{name: t.chunk(m)[i].to(self.device) for name, t in inputs.items()} for i in range(m)]
        for ids, tgt, piece in zip(input_ids.chunk(m), targets.chunk(m), pieces):
            loss = self._scaled_loss(self.stage(ids.to(self.device), **piece), tgt.to(self.device))
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
