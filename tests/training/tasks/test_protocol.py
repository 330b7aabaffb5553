"""The task protocol: a task needs train_batch, weight, loss and evaluate; the optional methods
(prepare, param_groups, state_dict, load_state_dict) have Task's defaults."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.training import TrainConfig, Trainer
from attnlab.training.tasks.protocol import StepLoss, Task, as_task
from tests.training.helpers import tiny_config

V = 11


class Minimal:
    """A duck-typed task with only the required methods: next-token prediction on fixed ids."""

    def __init__(self):
        self.ids = torch.arange(2 * 9).remainder(V).reshape(2, 9)

    def train_batch(self, generator):
        return {"input_ids": self.ids[:, :-1], "labels": self.ids[:, 1:]}

    def weight(self, batch):
        return int(batch["labels"].numel())

    def loss(self, model, batch, *, label_smoothing=0.0):
        logits = model(batch["input_ids"])
        return StepLoss(torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch["labels"].reshape(-1)), {})

    def evaluate(self, model, device, precision):
        return {}


def _trainer(tmp_path, task):
    config = TrainConfig.from_dict(tiny_config(tmp_path, max_steps=3, checkpoint_every=3, eval_every=3))
    model = build_model(ModelConfig(arch="decoder", vocab_size=V, d_model=16, num_layers=1, num_heads=2, d_ff=32))
    return Trainer(config, task=task, model=model, show_progress=False, log=lambda _: None)


def test_a_task_without_a_required_method_is_refused_naming_it(tmp_path):
    class NoWeight(Minimal):
        weight = None

    with pytest.raises(TypeError, match="NoWeight has no weight "):
        _trainer(tmp_path, NoWeight())


def test_a_duck_typed_task_trains_with_the_protocols_defaults_and_resumes(tmp_path):
    trainer = _trainer(tmp_path, Minimal())
    summary = trainer.fit()
    assert summary["steps"] == 3 and summary["train_loss"] < summary["first_loss"]
    again = _trainer(tmp_path, Minimal())
    assert again.resume() and again.step == 3  # state_dict / load_state_dict: Task's defaults


def test_a_tasks_own_optional_methods_are_the_ones_called():
    calls = []

    class Prepared(Minimal):
        def prepare(self, model):
            calls.append("prepare")

    task = as_task(Prepared())
    task.prepare(None)
    assert calls == ["prepare"]
    assert task.param_groups(None, 1.0, 0.0) is None and task.state_dict() == {}
    assert task.train_batch(None)["input_ids"].shape == (2, 8)  # the wrapped task's own


def test_a_subclass_of_task_is_taken_as_it_is():
    class Sub(Minimal, Task):
        pass

    task = Sub()
    assert as_task(task) is task
    assert as_task(Minimal()) is not None and not isinstance(as_task(Minimal()), Minimal)  # wrapped with defaults
