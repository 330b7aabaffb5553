"""`train.compile: true`: each transformer layer compiled in place (nn.Module.compile).

The default suite checks the plumbing with a counting backend that runs the traced graphs as
they are (Dynamo traces, nothing is generated; well under a second): the layers go through
compiled graphs in training and not in evaluation, losses equal the eager run's, the compile
time is logged and returned, checkpoints hold the uncompiled names and a resume is exact. The
slow test compiles with Inductor (tens of seconds on a cold cache, C++ code built with g++).
"""

import json

import pytest
import torch

from attnlab.config.validate import ConfigError
from attnlab.io.checkpoints import resolve_checkpoint
from attnlab.models import build_model
from attnlab.config import ModelConfig
from attnlab.nn.layers import TransformerLayer
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup import speedups
from attnlab.training.setup.speedups import CompileClock
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")


@pytest.fixture
def graphs(monkeypatch):
    """Compile with a backend that counts the graphs it is given and runs them as traced."""
    compiled = []

    def backend(graph_module, example_inputs):
        compiled.append(graph_module)
        return graph_module.forward

    monkeypatch.setattr(TransformerLayer, "compile", lambda self: torch.nn.Module.compile(self, backend=backend))
    torch._dynamo.reset()
    yield compiled
    torch._dynamo.reset()


def _trainer(tmp_path, logs=None, dropout=0.1, **train):
    cfg = tiny_config(tmp_path, **{"max_steps": 6, "eval_every": 3, **train})
    cfg["model"]["dropout"] = dropout
    log = logs.append if logs is not None else (lambda _: None)
    return Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=log)


def _losses(trainer):
    lines = (trainer.out / "metrics.jsonl").read_text().splitlines()
    return [r["train_loss"] for r in map(json.loads, lines) if "train_loss" in r]


def test_training_runs_compiled_graphs_that_give_the_eager_losses(tmp_path, graphs):
    eager = _trainer(tmp_path / "eager")
    eager.fit()
    logs = []
    compiled = _trainer(tmp_path / "compiled", logs, compile=True)
    summary = compiled.fit()
    assert compiled.compiled_layers == 1 and len(graphs) >= 1
    after_training = len(graphs)
    compiled.evaluate()  # evaluation runs eagerly: no graph for eval mode
    assert len(graphs) == after_training
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=1e-6)  # the same ops, the same dropout draws
    assert summary["val_loss"] == pytest.approx(eager.evaluate()["val_loss"], rel=1e-6)
    assert summary["compile_seconds"] > 0
    line, = [line for line in logs if line.startswith("compile: ")]
    assert "torch.compile of 1 transformer layer(s), in the first step" in line
    assert float(line.split()[1]) == pytest.approx(summary["compile_seconds"], abs=0.05)  # all compiling: step 1


def test_checkpoints_hold_the_uncompiled_names_and_a_resume_is_exact(tmp_path, graphs):
    full = _trainer(tmp_path / "a", compile=True, checkpoint_every=100)
    full.fit()
    part = _trainer(tmp_path / "b", compile=True, checkpoint_every=4)
    part.fit()
    plain_names = set(build_model(ModelConfig.from_dict(part.model.config.to_dict())).state_dict())
    assert set(part.model.state_dict()) == plain_names
    assert not any("_orig_mod" in name for name in plain_names)
    ckpt = resolve_checkpoint(part.checkpoint_dir / "step-00000004")
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        assert set(f.keys()) <= plain_names and "layers.0.ffn.w1.weight" in set(f.keys())
    resumed = _trainer(tmp_path / "b", compile=True)
    resumed.resume(ckpt)
    resumed.fit()
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_model_without_transformer_layers_is_refused_naming_the_field(tmp_path):
    import types

    cfg = TrainConfig.from_dict(tiny_config(tmp_path, compile=True))
    rnn = build_model(ModelConfig(arch="rnn_encoder_decoder", vocab_size=40, d_model=16))
    with pytest.raises(ConfigError, match="^train.compile: true compiles transformer layers; a RNNEncoderDecoder"):
        Trainer(cfg, task=types.SimpleNamespace(), model=rnn, show_progress=False, log=lambda _: None)


def test_a_cpu_without_a_cpp_compiler_is_refused_before_the_data_is_prepared(tmp_path, monkeypatch):
    monkeypatch.setattr(speedups.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError, match="^train.compile: true on a CPU needs a C\\+\\+ compiler"):
        _trainer(tmp_path, compile=True)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_value_names_the_field(tmp_path, value):
    with pytest.raises(ValueError, match="train.compile: expected true or false"):
        TrainConfig.from_dict(tiny_config(tmp_path, compile=value))


# Inductor compiles C++ for the forward and backward graphs: 30-60 s on a cold cache here
@pytest.mark.slow
def test_inductor_losses_equal_eager_and_checkpoints_stay_loadable(tmp_path):
    torch._dynamo.reset()
    eager = _trainer(tmp_path / "eager", dropout=0.0)  # Inductor draws dropout masks its own way: none here
    eager.fit()
    logs = []
    compiled = _trainer(tmp_path / "compiled", logs, dropout=0.0, compile=True)
    summary = compiled.fit()
    # fused kernels sum in another order: float32 rounding only
    assert _losses(compiled) == pytest.approx(_losses(eager), abs=1e-4)
    assert summary["compile_seconds"] > 0.5 and any(line.startswith("compile: ") for line in logs)
    fresh = build_model(ModelConfig.from_dict(compiled.model.config.to_dict()))
    fresh.load_state_dict(compiled.model.state_dict())  # strict: the plain module's names
    torch._dynamo.reset()


def test_without_dynamo_timers_the_first_step_counts_as_compiling(monkeypatch):
    monkeypatch.setattr(CompileClock, "seconds", staticmethod(lambda: None))
    clock = CompileClock()
    assert clock.lap(2.5) == 2.5 and clock.lap(0.1) == 0.0 and clock.total == 2.5 and clock.laps == 2
