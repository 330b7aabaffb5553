"""`train.precision: fp16`: fp16 autocast with a gradient scaler (attnlab.training.setup.precision).

On this CPU fp16 is emulated (slow, with a warning) but numerically what a GPU does: the tests
compare an fp16 run with the fp32 run of the same seed, check that the loss is scaled in backward
and the gradients unscaled before clipping, that an overflow skips its step without touching the
weights or the optimizer, and that the scaler's state makes a resume exact.
"""

import json

import pytest
import torch

from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup import precision
from attnlab.io.checkpoints import read_state, resolve_checkpoint
from attnlab.training.setup.precision import native_fp16, resolve_precision
from tests.training.setup.conftest import no_warnings
from tests.training.helpers import tiny_config

CPU = torch.device("cpu")

pytestmark = [pytest.mark.usefixtures("isolated_cache"),
              pytest.mark.filterwarnings("ignore:precision fp16 on a cpu without native fp16")]


def _trainer(tmp_path, device, log=None, **train):
    cfg = tiny_config(tmp_path, **{"eval_every": 100, "device": device.type, **train})
    cfg["schedule"]["warmup_steps"] = min(2, cfg["train"]["max_steps"] - 1)  # (a one-step run: no warm-up)
    return Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=log or (lambda _: None))


def _records(trainer):
    lines = (trainer.out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train_loss" in r]


def _overflow_at(trainer, step):
    """Make step `step`'s gradients overflow (one inf after the scaled backward, as a fp16 overflow leaves)."""
    accumulate = trainer.accumulate

    def overflowing(batches):
        out = accumulate(batches)
        if trainer.step + 1 == step:
            next(trainer.model.parameters()).grad.view(-1)[0] = float("inf")
        return out

    trainer.accumulate = overflowing


def test_fp16_losses_and_gradient_norms_are_close_to_fp32(tmp_path, device):
    fp32 = _trainer(tmp_path / "a", device, precision="fp32")
    fp32.fit()
    fp16 = _trainer(tmp_path / "b", device, precision="fp16")
    seen = []
    for module in fp16.model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, args, out: seen.append(out.dtype) if m.training else None)
    fp16.fit()
    assert fp16.precision == "fp16" and set(seen) == {torch.float16}
    assert all(p.dtype == torch.float32 for p in fp16.model.parameters())  # weights and optimizer stay fp32
    a, b = _records(fp32), _records(fp16)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 9))
    # fp16 rounds at 2^-11 relative: over 8 steps the losses (about 3) differ by at most 6e-4 here
    assert [r["train_loss"] for r in b] == pytest.approx([r["train_loss"] for r in a], abs=2e-3)
    assert [r["train_loss"] for r in b] != [r["train_loss"] for r in a]  # (and fp16 did compute something else)
    # the norm is of the unscaled gradients (65,536 times smaller than the scaled ones)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a], rel=1e-2)
    assert all(r["loss_scale"] == 65536.0 for r in b) and "loss_scale" not in a[0]


def test_the_loss_is_scaled_in_backward_and_the_gradients_unscaled_for_the_optimizer(tmp_path, device):
    trainer = _trainer(tmp_path, device, precision="fp16", max_steps=1)
    trainer.config.optim.grad_clip = None  # p.grad after the step: the unscaled gradient, unclipped
    weight = trainer.model.layers[0].ffn.w1.weight
    raw = []
    weight.register_hook(lambda grad: raw.append(grad.clone()))
    trainer.fit()
    (scaled,) = raw
    assert torch.equal(scaled, weight.grad * 65536.0)  # a power of two: exact


def test_an_overflow_skips_its_step_halves_the_scale_and_leaves_the_weights_alone(tmp_path, device):
    logs = []
    trainer = _trainer(tmp_path, device, precision="fp16", max_steps=5, log=logs.append)
    _overflow_at(trainer, 3)
    states = {}

    def snapshot(record):
        params = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        adam = [dict(s) for s in trainer.optimizer.state.values()]
        states[record["step"]] = (params, [float(s["step"]) for s in adam], record["skipped"])

    trainer.fit(on_step=snapshot)
    before, after = states[2], states[3]
    for name, value in before[0].items():
        assert torch.equal(value, after[0][name]), name  # step 3 changed no weight ...
    assert after[1] == before[1] and after[2] is True  # ... nor the optimizer's step count
    assert all(torch.isfinite(v).all() for v in states[5][0].values())
    assert any(not torch.equal(states[3][0][k], states[5][0][k]) for k in states[3][0])  # and training went on
    assert any("overflowed at step 3" in line and "65536 -> 32768" in line for line in logs)
    records = {r["step"]: r for r in _records(trainer)}
    assert records[3]["skipped"] and records[2]["loss_scale"] == 65536.0 and records[3]["loss_scale"] == 32768.0
    assert trainer.scaler.get_scale() == 32768.0


def test_an_overflow_is_not_a_nan_stop_in_fp32_it_is(tmp_path, device):
    from attnlab.training import NonFiniteLossError

    trainer = _trainer(tmp_path, device, precision="fp32", max_steps=3)
    _overflow_at(trainer, 2)
    with pytest.raises(NonFiniteLossError, match="gradient norm is inf at step 2"):
        trainer.fit()


def test_the_scaler_state_is_checkpointed_and_a_resume_is_exact(tmp_path, device):
    full = _trainer(tmp_path / "a", device, precision="fp16", max_steps=8, checkpoint_every=100)
    _overflow_at(full, 3)
    full.fit()
    part = _trainer(tmp_path / "b", device, precision="fp16", max_steps=8, checkpoint_every=3)
    _overflow_at(part, 3)
    part.fit()
    ckpt = resolve_checkpoint(part.checkpoint_dir / "step-00000006")
    saved = read_state(ckpt)["extra"]["grad_scaler"]
    assert saved["scale"] == 32768.0 and saved["_growth_tracker"] == 3  # steps 4, 5, 6 since the overflow
    resumed = _trainer(tmp_path / "b", device, precision="fp16", max_steps=8)
    resumed.resume(ckpt)
    assert resumed.scaler.state_dict() == saved
    resumed.fit()
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.scaler.state_dict() == full.scaler.state_dict()


def test_fp16_is_asked_for_by_name_and_warns_where_emulated(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert resolve_precision("auto", CPU) == "fp32"  # auto never picks fp16
    monkeypatch.setattr(precision, "native_fp16", lambda device: False)
    with pytest.warns(UserWarning, match=r"fp16 on a cpu without native fp16.*35x slower.*V100, T4"):
        assert resolve_precision("fp16", CPU) == "fp16"
    monkeypatch.setattr(precision, "native_fp16", lambda device: True)
    with no_warnings():
        assert resolve_precision("fp16", CPU) == "fp16"


@pytest.mark.parametrize("features, expected", [
    ({"avx2": True, "avx512_bf16": True, "avx512_fp16": False, "amx_fp16": False}, False),  # this EPYC
    ({"avx512_fp16": True}, True),  # Sapphire Rapids on
    ({"amx_fp16": True}, True),
])
def test_a_cpu_is_native_by_its_fp16_instructions(monkeypatch, features, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: features)
    assert native_fp16(CPU) is expected


@pytest.mark.parametrize("capability, expected", [((6, 1), False), ((7, 0), True), ((7, 5), True), ((9, 0), True)])
def test_a_gpu_is_native_with_tensor_cores(cuda_capability, capability, expected):
    cuda_capability(capability)
    assert native_fp16(torch.device("cuda")) is expected


def test_the_config_accepts_fp16_and_names_the_field_otherwise(tmp_path):
    assert TrainConfig.from_dict(tiny_config(tmp_path, precision="fp16")).train.precision == "fp16"
    with pytest.raises(ValueError, match="train.precision: 'fp8' is not one of auto, fp32, bf16, fp16"):
        TrainConfig.from_dict(tiny_config(tmp_path, precision="fp8"))
