"""The Trainer on a tensor x pipeline x data mesh: what one rank of `attnlab train --nproc N` does
differently when `parallel.tp` or `parallel.pp` is above 1: the hooks `attnlab train` gives the
Trainer, `Trainer(config, mesh=MeshTraining)` (training sits below this package, so the hooks are
passed in, not imported there; plain data parallel needs none of them).

Notation: tp, pp, dp the mesh sizes (attnlab.training.strategy.distributed: rank = (pp_rank dp + dp_rank) tp
+ tp_rank), k = train.grad_accum, m = parallel.micro_batches, V the vocabulary.

    model      tp > 1: split in place (`tensor_parallel(..., gather_output=False)`), the head giving
               (.., V/tp) logits; pp > 1: this rank keeps its stage (`Pipeline`), the optimizer
               sees that stage's parameters only
    step       pp = 1: the Trainer's own accumulation over k micro-batches, each one's loss the
               vocabulary-parallel cross-entropy (`vocab_parallel_loss`), DDP over dp;
               pp > 1: the k batches concatenated (padded to one width), cut into m micro-batches
               by the schedule (GPipe / 1F1B), their masks (and an encoder-decoder's target ids)
               given to every stage, gradients summed over dp by the pipeline
    clipping   the global norm: squares summed over the tp shards and the pp stages, each
               replicated tensor counted once (`clip_grad_norm`)
    evaluation forward only, through the stages (`Pipeline.forward_only`) and the vocabulary
               shards: val_loss, val_ppl, and val_mlm_accuracy for a masked LM
    checkpoint the run folder's checkpoint as a one-process run writes it, by rank 0: on a
               pipeline (tp = 1) the stages stream their tensors to it one at a time
               (attnlab.parallel.stage_checkpoint); with tp > 1 the shards, then the stages, are
               gathered on it first; on resume each rank reads its stage's tensors alone and
               cuts them to its shard: a run resumes on any layout
    memory     pp > 1: the model comes built on the meta device (`pretrain_setup`); each rank
               checks its stage fits, then makes that stage alone, on its device, initialised
               as the whole model would be or read from init_from (attnlab.parallel.materialise)

The loss and every gradient are those of one process with k dp micro-batches (up to float
rounding), so a run's losses match a one-process run of the same config. Not computed under
tp or pp: BLEU/chrF during training (decoding a split model is refused; `attnlab eval RUN`
scores the checkpoint) and the TensorBoard text samples.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.evaluation import perplexity
from attnlab.parallel.checkpoint import gather_full_state, gather_optimizer_state
from attnlab.parallel.comm import all_reduce_sum, gather_from_parallel
from attnlab.parallel.layout import check_layout
from attnlab.parallel.materialise import has_meta, materialise_rank_stage, release_other_stages
from attnlab.parallel.pipeline import Pipeline, is_backend_error
from attnlab.parallel.stage_checkpoint import (StageShare, full_param_groups, optimizer_order, read_checkpoint_part,
                                               write_pipeline_files)
from attnlab.parallel.stages import join_batches, stage_inputs
from attnlab.parallel.tensor import local_part, tensor_parallel, vocab_parallel_cross_entropy
from attnlab.io.checkpoints import read_state, rng_state, save_checkpoint, set_rng_state
from attnlab.models.families import family
from attnlab.training.config import TrainConfig
from attnlab.training.strategy.distributed import CollectiveError, ParallelContext
from attnlab.nn.losses import IGNORE
from attnlab.training.optim import build_optimizer, decay_groups
from attnlab.training.setup.precision import autocast
from attnlab.training.tasks.batch_loss import to_device
from attnlab.training.tasks.protocol import StepLoss

__all__ = ["MeshTraining", "vocab_parallel_loss"]


def _features(model: nn.Module, batch: dict[str, Tensor]) -> tuple[nn.Module, Tensor]:
    """(the stack whose head predicts, its last hidden states (B, T, D)), as its family's `batch_loss` runs them."""
    return family(model.config).features(model, batch)


def _local_logits(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(this rank's (N, V/tp) logits of the N positions that take a loss, their targets (N,))."""
    stack, hidden = _features(model, batch)
    keep = batch["labels"] != IGNORE
    head = stack.head
    return head.output_layer()(head.transform(hidden[keep])), batch["labels"][keep]


def _pipeline_batch(arch: str, batch: dict[str, Tensor], objective: str) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(the first stage's ids, the targets, the keyword inputs of every stage) of a batch: the
    tensors `steps.batch_loss` reads (an encoder-decoder does not read encoder_decoder_lm's cuts).

    Raises:
        ValueError: a batch holding a tensor the stages do not take.
    """
    own = family(arch)
    first, names, unread = own.first_input, stage_inputs(arch), own.unstaged
    extra = sorted(set(batch) - {first, "labels", *names} - unread)
    if extra:
        raise ValueError(f"pipeline parallel passes {first}, labels and {', '.join(names)} to the stages of an "
                         f"{arch}; these batches also hold {', '.join(extra)} (data.objective={objective!r})")
    return batch[first], batch["labels"], {name: batch[name] for name in names if name in batch}


def vocab_parallel_loss(model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss:
    """`steps.batch_loss` of a tensor-parallel model (`tensor_parallel(..., gather_output=False)`):
    the head's vocabulary slice on the positions that take a loss, then the vocabulary-parallel
    cross-entropy, so no rank forms (N, V) logits."""
    logits, targets = _local_logits(model, batch)
    loss = vocab_parallel_cross_entropy(logits, targets, model.tp_group, label_smoothing=label_smoothing,
                                        vocab_size=model.config.vocab_size)  # (a padded vocabulary's rows left out)
    return StepLoss(loss, {})


class MeshTraining:
    """One rank's part of a tensor- and/or pipeline-parallel run (see the module docstring).

    Args:
        model: the full model, built alike on every rank (same seed), on its device; or (pp > 1)
            on the meta device with a `stage_source` (`pretrain_setup` builds it so), this rank's
            stage then made alone on its device (`materialise_rank_stage`, after checking that
            the stage fits in memory).
        ctx: this rank's place (`init_from_env(tp, pp=pp, dp=dp)`).
        config: the run; its `parallel` section gives the layout.
        task: the pretraining task (its `pipeline` gives the evaluation batches).

    The Trainer checks the layout first (`MeshTraining.check_layout`, before the data is
    prepared), and under tp takes its step loss from `loss` (`vocab_parallel_loss`).

    Raises:
        ValueError: a task without the evaluation batches of a pretraining objective.
    """

    check_layout = staticmethod(check_layout)  # (config, world_size): called before the data is prepared
    loss = staticmethod(vocab_parallel_loss)  # the step loss of a tensor-parallel model

    def __init__(self, model: nn.Module, ctx: ParallelContext, config: TrainConfig, task: Any):
        if not hasattr(task, "pipeline"):
            raise ValueError(f"parallel.tp / parallel.pp train the pretraining objectives of attnlab train; a "
                             f"{type(task).__name__} trains with data parallel alone")
        self.ctx, self.config = ctx, config
        if has_meta(model):  # pp > 1: built on the meta device; this rank makes its own stage alone
            materialise_rank_stage(model, ctx, config)
        self.tp_group = ctx.tp_group if ctx.tp_size > 1 else None
        if self.tp_group is not None:
            tensor_parallel(model, self.tp_group, gather_output=False)
        self.model = model
        self.pipe = None
        if ctx.pp_size > 1:
            par = config.parallel
            self.pipe = Pipeline(model, ctx.pp_group, micro_batches=par.micro_batches, schedule=par.schedule,
                                 label_smoothing=config.optim.label_smoothing, dp_group=ctx.dp_group)
        self.module: nn.Module = self.pipe.stage if self.pipe is not None else model  # what this rank trains
        if self.pipe is not None:  # a model given whole (init_from read whole, a caller's): the rest let go
            release_other_stages(model, self.module)

    # ---------------------------------------------------------------- training
    def param_groups(self, weight_decay: float) -> list[dict]:
        """The optimizer's groups over this rank's parameters: the whole model's decay groups
        (`attnlab.training.optim.decay_groups`) cut to `module`, so a tensor keeps its group on
        every stage (the tied embedding is not decayed on the last stage as the head's weight)."""
        mine = {id(p) for p in self.module.parameters()}
        groups = decay_groups(self.model, weight_decay)
        return [{**g, "params": [p for p in g["params"] if id(p) in mine]} for g in groups]

    @property
    def pipelined(self) -> bool:
        """Whether a step goes through the pipeline (`pipeline_step`), not the Trainer's accumulation."""
        return self.pipe is not None

    def pipeline_step(self, batches: list[dict[str, Tensor]]) -> float:
        """Forward and backward of one step's k batches through the pipeline (pp > 1), joined
        into one (padded to the widest: `attnlab.parallel.stages.join_batches`); the step's
        loss (mean over its targets on all dp ranks), on every rank.

        Raises:
            ValueError: a batch with a tensor the stages do not take (`_pipeline_batch`).
        """
        arch, objective = self.model.config.arch, self.config.data.objective
        parts = [_pipeline_batch(arch, b, objective) for b in batches]
        ids, labels, inputs = join_batches(arch, parts, ignore_index=IGNORE) if len(parts) > 1 else parts[0]
        return self.pipe.step(ids, labels, **inputs)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale this rank's gradients so that the whole model's gradient norm is at most
        max_norm (as `torch.nn.utils.clip_grad_norm_` on one process); returns that norm."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None and self._counts(p)]
        square = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        for g in grads:
            square += g.detach().double().pow(2).sum()
        for group in (self.tp_group, self.pipe.group if self.pipe is not None else None):
            square = all_reduce_sum(square, group) if group is not None else square
        norm = math.sqrt(float(square))
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0 and math.isfinite(norm):
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def _counts(self, p: nn.Parameter) -> bool:
        """Whether this rank counts p in the global norm: a tp shard on every tp rank, a tensor
        tp replicates on tp rank 0 alone; a tensor several stages hold on the first of them."""
        sharded = getattr(p, "tp_dim", None) is not None
        return (sharded or self.ctx.tp_rank == 0) and (self.pipe is None or self.pipe.counts(p))

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, task: Any, device: torch.device, precision: str) -> dict[str, float]:
        """Validation loss and perplexity (and masked-LM accuracy) on the task's fixed evaluation
        batches, forward only; the same numbers on every rank."""
        mlm = self.model.config.head == "mlm"
        sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)  # loss sum, targets, correct
        with self.guard("evaluation"):
            for batch in task.pipeline.eval_batches(task.eval_batches):
                with autocast(precision, device):
                    sums += self._eval_sums(to_device(batch, device), mlm)
            if self.pipe is not None:  # the last stage computed them
                dist.broadcast(sums, group_src=self.pipe.num_stages - 1, group=self.pipe.group)
        loss = float(sums[0]) / max(float(sums[1]), 1.0)
        out = {"val_loss": loss, "val_ppl": perplexity(loss)}
        if mlm:
            out["val_mlm_accuracy"] = float(sums[2]) / max(float(sums[1]), 1.0)
        return out

    def _eval_sums(self, batch: dict[str, Tensor], mlm: bool) -> Tensor:
        """(summed token loss, targets, correct arg maxes) of one batch; zeros off the last stage."""
        if self.pipe is None:
            logits, targets = _local_logits(self.model, batch)
        else:
            ids, _, inputs = _pipeline_batch(self.model.config.arch, batch, self.config.data.objective)
            out = self.pipe.forward_only(ids, **inputs)
            if out is None:  # not the last stage
                return torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
            keep = batch["labels"] != IGNORE
            logits, targets = out[keep], batch["labels"][keep]
        n, V = targets.numel(), self.model.config.vocab_size
        if self.tp_group is not None:
            loss_sum = vocab_parallel_cross_entropy(logits, targets, self.tp_group, vocab_size=V) * n
        else:
            loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
        correct = 0.0
        if mlm:  # the arg max over the whole vocabulary: the picked rows' logits gathered (few rows)
            whole = gather_from_parallel(logits, self.tp_group)[:, :V] if self.tp_group is not None else logits
            correct = float((whole.argmax(-1) == targets).sum())
        return torch.tensor([float(loss_sum), n, correct], dtype=torch.float64, device=self.ctx.device)

    # ---------------------------------------------------------------- checkpoints
    def gather(self, optimizer: torch.optim.Optimizer) -> tuple[nn.Module | None, torch.optim.Optimizer | None]:
        """The whole model and an optimizer over it holding the whole state, on rank 0 (None, None
        elsewhere): what a one-process run would checkpoint. Every rank calls."""
        with self.guard("gathering the checkpoint"):
            gathered = self._gather_to_rank0(optimizer)
        if gathered is None:
            return None, None
        weights, moments = gathered
        full, full_opt = self._full_twins()
        missing, unexpected = full.load_state_dict(weights, strict=False)
        loaded = {id(p) for name, p in full.named_parameters(remove_duplicate=False) if name in weights}
        named = dict(full.named_parameters(remove_duplicate=False))
        if unexpected or any(id(named[name]) not in loaded for name in missing if name in named):
            raise RuntimeError(f"gathered checkpoint does not fit the model: missing {missing[:5]}, unexpected "
                               f"{unexpected[:5]}")
        by_name: dict[str, dict[str, Tensor]] = {}
        for key, value in moments.items():  # `PARAM_NAME/STATE_KEY`, a stage's name of a tied tensor its own
            name, _, entry = key.rpartition("/")
            by_name.setdefault(name, {})[entry] = value
        for name, p in named.items():
            if name in by_name and p not in full_opt.state:
                full_opt.state[p] = by_name[name]
        lr = optimizer.param_groups[0]["lr"] / optimizer.param_groups[0].get("lr_scale", 1.0)
        for group in full_opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return full, full_opt

    def save(self, folder, *, optimizer: torch.optim.Optimizer, data_generator: torch.Generator,
             **checkpoint: Any) -> Any:
        """`attnlab.io.checkpoints.save_checkpoint(folder, ...)` of the whole model and optimizer,
        as a one-process run writes it; every rank calls, rank 0 writes and returns the checkpoint's
        folder (None elsewhere). On a pipeline (tp = 1) the stages send their tensors one at a time
        to rank 0, which streams them into the files (`attnlab.parallel.stage_checkpoint`): no rank
        holds more than its stage and one other tensor. Otherwise the parts are gathered on rank 0
        first (`gather`). `checkpoint`: save_checkpoint's other arguments (step, schedule_state,
        extra, metric, keep_last)."""
        if self.pipe is None or self.tp_group is not None:
            model, full_opt = self.gather(optimizer)
            if not self.ctx.is_main:
                return None
            return save_checkpoint(folder, model=model, optimizer=full_opt, data_generator=data_generator, **checkpoint)
        if self.ctx.dp_rank != 0:
            return None  # the first pipeline's stages write; the others hold the same
        index, num_stages = self.pipe.index, self.pipe.num_stages
        with self.guard("writing the checkpoint"):
            share = StageShare(self.model, index, num_stages, optimizer, self.config.optim.weight_decay)
            if index != 0:
                write_pipeline_files(None, share, self.pipe.group, index, num_stages)
                return None
            groups = full_param_groups(self.model, optimizer, self.config.optim)

            def files(tmp):
                return write_pipeline_files(tmp, share, self.pipe.group, index, num_stages, param_groups=groups,
                                            rng=rng_state(data_generator), device=self.pipe.device)

            return save_checkpoint(folder, files=files, data_generator=data_generator, **checkpoint)

    def _gather_to_rank0(self, optimizer) -> tuple[dict[str, Tensor], dict[str, Tensor]] | None:
        """(weights, flat optimizer state) in the full layout on rank 0: the tp shards of each stage
        gathered on its tp rank 0, then the stages' parts on rank 0 (the first data-parallel
        replica's; the others hold the same)."""
        if self.ctx.dp_rank != 0:
            return None
        weights = gather_full_state(self.module, self.tp_group)
        moments = gather_optimizer_state(self.module, optimizer, self.tp_group)
        if self.ctx.tp_rank != 0:
            return None
        if self.pipe is None:
            return weights, moments
        part = ({k: v.cpu() for k, v in weights.items()}, {k: v.cpu() for k, v in moments.items()})
        parts = [None] * self.pipe.num_stages if self.ctx.rank == 0 else None
        dist.gather_object(part, parts, group_dst=0, group=self.pipe.group)
        if self.ctx.rank != 0:
            return None
        return ({k: v for w, _ in parts for k, v in w.items()}, {k: v for _, m in parts for k, v in m.items()})

    def _full_twins(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A whole model and the optimizer a one-process run builds over it (drawing no random
        number from this run's generator)."""
        from attnlab.models import build_model

        with torch.random.fork_rng(devices=[]):
            full = build_model(self.model.config)
        o = self.config.optim
        return full, build_optimizer(full, o.name, o.lr, o.betas, o.eps, o.weight_decay)

    def load_checkpoint(self, path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                        data_generator: torch.Generator) -> dict[str, Any]:
        """`attnlab.io.checkpoints.training_state.load_checkpoint` for this rank: from a checkpoint
        in the full layout (written by any layout) only this rank's stage's tensors are read
        (weights and optimizer moments, by name), then cut to its tensor-parallel shard. `model`
        is this rank's (sharded) model, `optimizer` over `self.module`. Returns state.json.

        Raises:
            CheckpointError: corrupted files, or a tensor of this stage missing from them.
        """
        state = read_state(path)  # the files' sha256 checked first
        order = optimizer_order(self.model, self.config.optim.weight_decay)  # the whole model's optimizer's
        weights, moments, rng = read_checkpoint_part(path, self.model, self.module, order,
                                                     state["optimizer"]["state"])
        tp, r = self.ctx.tp_size, self.ctx.tp_rank
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                whole = weights[name]
                p.copy_(local_part(whole, p, tp, r) if getattr(p, "tp_dim", None) is not None else whole)
            for name, b in self.module.named_buffers():
                if name in weights and weights[name].shape == b.shape:  # (ALiBi's sliced slopes are rebuilt, not read)
                    b.copy_(weights[name])
        mine = {id(p): name for name, p in self.module.named_parameters()}
        optimizer.state.clear()
        for group in optimizer.param_groups:
            for p in group["params"]:
                entries = moments.get(mine[id(p)], {})
                optimizer.state[p] = {key: self._local(value, p) for key, value in entries.items()}
        set_rng_state(rng, data_generator)
        return state

    def _local(self, value: Any, p: nn.Parameter) -> Any:
        """This rank's part of an optimizer state entry in the full layout (a moment of p's shape)."""
        if not isinstance(value, Tensor):
            return value
        if getattr(p, "tp_dim", None) is not None and value.dim() == p.dim() and value.shape != p.shape:
            value = local_part(value, p, self.ctx.tp_size, self.ctx.tp_rank)
        return value.clone().to(p.device)

    # ---------------------------------------------------------------- failures
    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn a communication failure inside the block (a peer died or timed out) into a
        CollectiveError naming this rank and `what` it was doing."""
        try:
            yield
        except CollectiveError:
            raise
        except RuntimeError as err:
            if not is_backend_error(err):
                raise
            cause = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CollectiveError(f"rank {self.ctx.rank} of {self.ctx.world_size} (tp {self.ctx.tp_rank}, pp "
                                  f"{self.ctx.pp_rank}, dp {self.ctx.dp_rank}): {what} failed or timed out "
                                  f"(timeout {self.ctx.timeout_s:g} s); another rank probably died or hangs -- check "
                                  f"its log. Cause: {cause}") from err
