"""Which strategy a run gets, and the one-process strategy's step against plain PyTorch."""

import pytest
import torch

from attnlab.training import TrainConfig
from attnlab.training.strategy import DataParallel, SingleProcess, choose_strategy
from attnlab.training.strategy.distributed import ParallelContext
from attnlab.training.tasks.protocol import StepLoss
from tests.training.helpers import tiny_config


def test_one_process_alone_and_a_split_model_needs_the_mesh_hooks(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config = TrainConfig.from_dict(tiny_config(tmp_path))
    strategy = choose_strategy(config, torch.device("cpu"))
    assert type(strategy) is SingleProcess and not isinstance(strategy, DataParallel)
    config = TrainConfig.from_dict({**tiny_config(tmp_path), "parallel": {"tp": 2}})
    with pytest.raises(ValueError, match="pass the mesh hooks"):
        choose_strategy(config, torch.device("cpu"))


class _Task:
    def weight(self, batch):
        return int(batch["w"])


def test_backward_scales_each_micro_batch_by_its_share_of_the_steps_weight():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = [torch.randn(4, 3), torch.randn(2, 3)]
    strategy = SingleProcess(ParallelContext(), torch.device("cpu"))
    strategy.place(model, None, _Task())
    strategy.set_loss(lambda m, b, label_smoothing=0.0: StepLoss(m(b["x"]).pow(2).mean(), {"n": 1.0}))
    batches = [{"x": x[0], "w": 4}, {"x": x[1], "w": 2}]
    loss, parts, problem = strategy.backward(batches, _Task(), autocast=torch.enable_grad, scale=lambda t: t,
                                             label_smoothing=0.0)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    expected = reference(torch.cat(x)).pow(2).mean()  # the mean over all 6 rows
    expected.backward()
    assert problem is None and parts == {"n": 1.0}
    assert loss == pytest.approx(float(expected.detach()))
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)


def test_backward_reports_a_step_without_weight_and_a_non_finite_loss():
    strategy = SingleProcess(ParallelContext(), torch.device("cpu"))
    strategy.place(torch.nn.Linear(1, 1), None, _Task())
    strategy.set_loss(lambda m, b, label_smoothing=0.0: StepLoss(m(b["x"]).sum() * float("inf"), {}))
    run = lambda batches: strategy.backward(batches, _Task(), autocast=torch.enable_grad, scale=lambda t: t,  # noqa: E731
                                            label_smoothing=0.0)
    assert run([{"x": torch.ones(1, 1), "w": 0}])[2] == "no label tokens in the step's batches"
    assert run([{"x": torch.ones(1, 1), "w": 1}])[2].startswith("loss is ")
