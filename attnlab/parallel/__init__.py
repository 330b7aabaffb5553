"""Scaling out on torch.distributed: data parallel (DDP under torchrun), Megatron-style tensor
parallel (module surgery on a built model) and pipeline parallel (stages of the layer stack,
GPipe/1F1B micro-batches through torch.distributed.pipelining), on a (pipeline x data x tensor)
process mesh; `plan_layout` predicts a layout's memory per rank, communication and bubble.

    from attnlab.parallel import init_from_env, wrap_model, shard_batch, tensor_parallel
    ctx = init_from_env(tp=2)                            # torchrun --nproc-per-node 4 ...
    model = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group)
    model = wrap_model(model, ctx)                       # DDP over ctx.dp_group

See attnlab/parallel/tensor.py for what tensor parallel supports, cost.py for the bytes each
layer communicates, checkpoint.py for full checkpoints (gather on save, shard on load); materialise.py for a pipeline
rank that makes its own stage alone (the model on the meta device), stage_checkpoint.py for the
full-layout checkpoint a pipeline's stages stream to rank 0 and read back by name; mesh.py
for the Trainer's hooks when `attnlab train` runs a `parallel: {tp, pp, dp}` layout, layout.py
for what such a layout asks of the run's config (`check_layout`). The process
context (`init_from_env`, `ParallelContext`) lives in attnlab/training/strategy/distributed.py beside the
trainer's data-parallel hooks; this package builds on it.
"""

from attnlab.parallel.checkpoint import (gather_full_state, gather_optimizer_state, load_full_checkpoint,
                                         load_optimizer_state, save_full_checkpoint)
from attnlab.parallel.comm import copy_to_parallel, gather_from_parallel, reduce_from_parallel
from attnlab.parallel.data import (all_reduce_gradients, all_reduce_metrics, is_main, shard_batch, shard_batches,
                                   unwrap, wrap_model)
from attnlab.training.strategy.distributed import CollectiveError, LossModule, ParallelContext, init_from_env, shutdown
from attnlab.parallel.launch import WorkerError, free_port, spawn
from attnlab.parallel.layout import check_layout
from attnlab.parallel.pipeline import Pipeline
from attnlab.parallel.stages import check_pipeline_supported, split_stages, stage_layers
from attnlab.parallel.plan import format_plan, plan_layout
from attnlab.parallel.tensor import check_supported, tensor_parallel, vocab_parallel_cross_entropy

__all__ = [
    "CollectiveError", "LossModule", "ParallelContext", "Pipeline", "WorkerError", "all_reduce_gradients",
    "all_reduce_metrics", "check_layout", "check_pipeline_supported", "check_supported", "format_plan", "plan_layout",
    "split_stages", "stage_layers", "copy_to_parallel", "free_port", "gather_from_parallel", "gather_full_state",
    "gather_optimizer_state", "init_from_env", "is_main", "load_full_checkpoint", "load_optimizer_state",
    "reduce_from_parallel", "save_full_checkpoint", "shard_batch", "shard_batches", "shutdown", "spawn",
    "tensor_parallel", "unwrap", "vocab_parallel_cross_entropy", "wrap_model",
]
