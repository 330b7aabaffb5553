"""The training memory estimate (attnlab.training.setup.memory): against the peak memory a real step
takes, against the parameters the model holds, at the boundary it reports, and in the Trainer
(before any batch is drawn)."""

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config.validate import ConfigError
from attnlab.data.tokenized import TokenFile
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup import memory
from attnlab.training.setup.free_memory import Available
from attnlab.training.setup.memory import batch_shape, check_training_memory, estimate_training_memory
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")

ROOT = Path(__file__).resolve().parents[3]
GUARD_BYTES = 8 * 2 ** 30  # the address-space limit of the measuring subprocesses: a regression cannot eat the machine

# One training step in a fresh process: the growth of its peak resident anonymous memory (RssAnon,
# sampled through the step, less its value before: the model, the first batches and torch already
# loaded) against the estimate less the weights (already held before the step). Not the whole RSS:
# it counts library code pages too, which other processes' memory pressure evicts and the step
# faults back in (seen: 629 MB of "growth" for a 219 MB step while another job filled memory).
# On a GPU (--device cuda) the growth is that of the CUDA allocator's peak over the step.
MEASURE = r"""
import json, sys, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from tests.training.helpers import tiny_config
from attnlab.training import Trainer, TrainConfig
from attnlab.training.setup.memory import check_training_memory
raw = tiny_config(Path(sys.argv[2]))
for section, fields in json.loads(sys.argv[1]).items():
    raw.setdefault(section, {}).update(fields)
raw["train"]["device"] = sys.argv[4]
trainer = Trainer(TrainConfig.from_dict(raw), show_progress=False, log=lambda _: None)
estimate = check_training_memory(trainer.model, trainer.config, trainer.device, precision=trainer.precision,
                                 task=trainer.task)
def anonymous():  # resident anonymous memory: what allocations hold (code pages evicted by others' load do not count)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon:"))
peak, done = [0], threading.Event()
def watch():  # activations are held from forward to backward: sampling every half millisecond sees the top
    while not done.is_set():
        peak[0] = max(peak[0], anonymous())
        time.sleep(0.0005)
if sys.argv[4] == "cuda":
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with trainer.random.own():
        trainer._train_step()
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_allocated() - before
else:
    before = anonymous()
    watcher = threading.Thread(target=watch)
    watcher.start()
    with trainer.random.own():
        trainer._train_step()
    done.set()
    watcher.join()
    growth = max(peak[0], anonymous()) - before
print(json.dumps({"growth": growth, "estimate": estimate.total - estimate.weights}))
"""

SMALL = {"d_model": 128, "num_layers": 2, "num_heads": 4, "d_ff": 512}


def _guard():
    resource.setrlimit(resource.RLIMIT_AS, (GUARD_BYTES, GUARD_BYTES))


@pytest.mark.parametrize("spec", [
    # grad_accum 2: from the second micro-batch on the allocator holds the most (module docstring)
    {"data": {"batch_size": 64, "seq_len": 64}, "train": {"grad_accum": 2},
     "model": {**SMALL, "position": {"scheme": "rotary", "max_len": 128}}},
    {"data": {"batch_size": 64, "seq_len": 64, "objective": "masked_lm"},
     "model": {**SMALL, "position": {"scheme": "rotary", "max_len": 128}}},
    {"data": {"batch_size": 64, "seq_len": 64, "objective": "span_corruption"},
     "model": {**SMALL, "position": {"scheme": "t5_bias"}}},
], ids=["decoder_grad_accum", "encoder_mlm", "encoder_decoder_t5"])
def test_the_estimate_covers_the_measured_peak_of_a_step_and_is_not_absurd(tmp_path, spec, device):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(spec), str(tmp_path), str(ROOT), device.type],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          preexec_fn=_guard if device.type == "cpu" else None)  # (CUDA reserves terabytes of addresses)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    growth, estimate = measured["growth"], measured["estimate"]
    assert growth > 50 * 2 ** 20  # the step dominates the noise of a first step (thread pools, caches)
    assert growth <= estimate <= 3.5 * growth, measured


def _model(**fields):
    return attnlab.build_model(attnlab.ModelConfig.from_dict({"arch": "decoder", "vocab_size": 64, "d_model": 32,
                                                              "num_layers": 2, "num_heads": 2, "d_ff": 64,
                                                              **fields}))


def test_weights_gradients_and_adam_are_those_of_the_parameters_that_train():
    model = _model()
    p = sum(t.numel() for t in {id(t): t for t in model.parameters()}.values())
    full = estimate_training_memory(model, rows=4, seq_len=16)
    assert (full.weights, full.gradients, full.optimizer) == (4 * p, 4 * p, 8 * p)
    for name, t in model.named_parameters():  # freeze the layers (as LoRA freezes its base)
        t.requires_grad_(not name.startswith("layers."))
    frozen = estimate_training_memory(model, rows=4, seq_len=16)
    trained = sum(t.numel() for t in {id(t): t for t in model.parameters() if t.requires_grad}.values())
    assert frozen.weights == full.weights and (frozen.gradients, frozen.optimizer) == (4 * trained, 8 * trained)
    assert frozen.per_row == full.per_row > 0  # the frozen layers' activations are still held for backward


def test_a_row_costs_the_cost_model_times_the_factor_plus_its_ids_and_bf16_halves_the_activations():
    model = _model()
    config, S = model.config, 16
    counted = memory.stage_activations(config, memory.layer_keys(config),
                                       memory.layer_activations(config, S, S), S, S)
    ids = 8 * memory.BATCH_TENSORS * S
    assert estimate_training_memory(model, rows=3, seq_len=S).per_row == counted * 4 * memory.AUTOGRAD_FACTOR + ids
    bf16 = estimate_training_memory(model, rows=3, seq_len=S, precision="bf16")
    assert bf16.per_row == counted * 2 * memory.AUTOGRAD_FACTOR + ids
    accumulated = estimate_training_memory(model, rows=3, seq_len=S, grad_accum=4)
    assert accumulated.per_row == counted * 4 * memory.AUTOGRAD_FACTOR + 4 * ids  # the step's ids drawn at once
    assert estimate_training_memory(model, rows=6, seq_len=S).total == 2 * 3 * (ids + counted * 24) + 16 * \
        sum(t.numel() for t in model.parameters())


def _config(tmp_path, **data) -> TrainConfig:
    raw = tiny_config(tmp_path)
    raw["data"].update(data)
    return TrainConfig.from_dict(raw)


@pytest.mark.parametrize("data", [
    {"batch_size": 7},
    {"objective": "seq2seq", "batch_tokens": 400, "max_pair_len": 12},
], ids=["batch_size", "batch_tokens"])
def test_the_largest_value_it_names_fits_and_one_more_does_not(tmp_path, data, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cfg = _config(tmp_path, **data)
    arch = "encoder_decoder" if data.get("objective") == "seq2seq" else "decoder"
    model = attnlab.build_model(cfg.model_config().replace(arch=arch, vocab_size=40))
    shape = batch_shape(cfg.data)
    needed = estimate_training_memory(model, rows=shape.rows, seq_len=shape.seq_len, tgt_len=shape.tgt_len).total
    available = Available(needed // 3, "a test")  # the model's weights already on the CPU count as available
    with pytest.raises(ConfigError) as err:
        check_training_memory(model, cfg, torch.device("cpu"), available=available)
    message = str(err.value)
    field = shape.field
    largest = int(re.search(rf"the largest {re.escape(field)} that fits is ([\d,]+)", message).group(1).replace(",", ""))
    assert message.startswith(f"{field}: {shape.value:,} (") and "a test" in message and "\n" not in message
    assert "train.check_memory" in message  # how to skip it
    name = field.split(".")[1]
    fits = _config(tmp_path, **{**data, name: largest})
    assert check_training_memory(model, fits, torch.device("cpu"), available=available) is not None
    step = batch_shape(fits.data).row_tokens if name == "batch_tokens" else 1
    with pytest.raises(ConfigError):
        check_training_memory(model, _config(tmp_path, **{**data, name: largest + step}), torch.device("cpu"),
                              available=available)


def test_switched_off_or_split_over_processes_nothing_is_checked(tmp_path):
    model, nothing = _model(), Available(0, "a test")
    raw = tiny_config(tmp_path, check_memory=False)
    assert check_training_memory(model, TrainConfig.from_dict(raw), torch.device("cpu"), available=nothing) is None
    raw = tiny_config(tmp_path)
    raw["parallel"] = {"tp": 2}  # `attnlab parallel plan` sizes what each rank holds
    assert check_training_memory(model, TrainConfig.from_dict(raw), torch.device("cpu"), available=nothing) is None


def test_a_task_with_batches_of_its_own_checks_the_model_alone(tmp_path):
    model, cfg = _model(), _config(tmp_path)
    held = 16 * sum(t.numel() for t in model.parameters())  # weights, gradients, Adam
    gpu = torch.device("cuda")  # (the memory is given: nothing asks CUDA) the weights are not there yet
    task = object()  # no pipeline: its batches are unknown
    estimate = check_training_memory(model, cfg, gpu, task=task, available=Available(held, "a test"))
    assert estimate.total == held and estimate.rows == 0
    with pytest.raises(ConfigError, match=r"^model: training it needs about .*but .* is available \(a test\): "
                                          r"choose a smaller model"):
        check_training_memory(model, cfg, gpu, task=task, available=Available(held - 1, "a test"))


def test_processes_of_one_machine_share_its_memory(tmp_path, monkeypatch):
    model, cfg = _model(), _config(tmp_path, batch_size=8)
    shape = batch_shape(cfg.data)
    alone = estimate_training_memory(model, rows=shape.rows, seq_len=shape.seq_len)
    room = Available(alone.total, "a test")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert check_training_memory(model, cfg, torch.device("cpu"), available=room) is not None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's four processes on this CPU
    with pytest.raises(ConfigError, match="shared by 4 processes"):
        check_training_memory(model, cfg, torch.device("cpu"), available=room)


def test_the_trainer_refuses_a_batch_that_cannot_fit_before_drawing_one(tmp_path, monkeypatch):
    def no_batch(*args, **kwargs):
        raise AssertionError("a batch was drawn before the memory check")

    monkeypatch.setattr(TokenFile, "random_windows", no_batch)
    raw = tiny_config(tmp_path)
    raw["data"]["batch_size"] = 100_000_000
    with pytest.raises(ConfigError, match=r"^data\.batch_size: 100,000,000 \(.*the largest data\.batch_size that "
                                          r"fits is [\d,]+: lower it"):
        Trainer(TrainConfig.from_dict(raw), show_progress=False, log=lambda _: None)
    raw["train"]["check_memory"] = False  # skipped: the pipeline goes on to draw its first batch
    with pytest.raises(AssertionError, match="a batch was drawn"):
        Trainer(TrainConfig.from_dict(raw), show_progress=False, log=lambda _: None)


def test_the_example_recipes_fit_a_laptop_with_8_gb():
    """Each recipe of examples/ at its own sizes, its vocabulary the tokenizer's size (a char
    tokenizer: 256), within the 6 GiB an 8 GB laptop has free."""
    from attnlab.training.config import load_config_file

    checked = 0
    for path in sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/*.json"),
                        *ROOT.glob("examples/studies/*/*.yaml")]):
        cfg = TrainConfig.from_dict(load_config_file(path))
        model_cfg = cfg.model_config().replace(vocab_size=cfg.data.tokenizer.vocab_size or 256)
        with torch.device("meta"):
            model = attnlab.build_model(model_cfg)
        shape = batch_shape(cfg.data)
        estimate = estimate_training_memory(model, rows=shape.rows, seq_len=shape.seq_len, tgt_len=shape.tgt_len,
                                            grad_accum=cfg.train.grad_accum)
        assert estimate.total < 6 * 2 ** 30, (path.name, estimate.describe())
        checked += 1
    assert checked >= 6
