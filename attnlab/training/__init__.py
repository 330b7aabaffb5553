"""Training: typed run configs, optimizers with weight-decay groups, schedules, fused losses,
checkpoints with exact resume, distributed hooks, and the one Trainer loop over tasks
(pretraining objectives here, fine-tuning heads in attnlab.finetune).

    from attnlab.training import Trainer, TrainConfig, load_config_file
    Trainer(TrainConfig.from_dict(load_config_file("examples/shakespeare_char.json"))).fit()
"""

from attnlab.io.checkpoints import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from attnlab.training.config import (DataConfig, OptimConfig, RunConfig, ScheduleConfig, TokenizerConfig, TrainConfig,
                                     apply_overrides, load_config_file)
from attnlab.nn.losses import cross_entropy, linear_cross_entropy
from attnlab.training.optim import Schedule, build_optimizer, decay_groups, lr_factor, noam_factor
from attnlab.training.tasks.pretrain import PretrainTask
from attnlab.training.tasks.protocol import StepLoss, Task
from attnlab.training.trainer import NonFiniteLossError, Trainer

__all__ = [
    "CheckpointError", "DataConfig", "NonFiniteLossError", "OptimConfig", "PretrainTask", "RunConfig", "Schedule",
    "ScheduleConfig", "StepLoss", "Task", "TokenizerConfig", "TrainConfig", "Trainer", "apply_overrides", "build_optimizer", "cross_entropy",
    "decay_groups", "linear_cross_entropy", "load_checkpoint", "load_config_file", "lr_factor", "noam_factor",
    "resolve_checkpoint", "save_checkpoint",
]
