"""`train.activation_checkpointing: true`: each transformer layer keeps its input only and is run
again in backward (attnlab.models.transformer). The gradients equal the plain run's, dropout
masks included (the recomputation replays the saved RNG state); the layers really run twice and
hold less for backward; decoding and evaluation are untouched."""

import types

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config.validate import ConfigError
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.layers import TransformerLayer
from attnlab.training import TrainConfig, Trainer
from attnlab.training.tasks.batch_loss import batch_loss
from tests.training.helpers import tiny_config

V = 40
MODELS = {  # dropout everywhere, so equal gradients need the same masks in the recomputation
    "decoder": dict(arch="decoder", position={"scheme": "rotary"}),
    "encoder": dict(arch="encoder", head="mlm", position={"scheme": "learned"}, attention={"dropout": 0.2}),
    "encoder_decoder": dict(arch="encoder_decoder", position={"scheme": "t5_bias"}),
    "moe": dict(arch="decoder", moe={"num_experts": 4, "top_k": 2, "noisy": True}),
}


def _model(name: str, checkpointing: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"vocab_size": V, "d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64,
                                 "dropout": 0.2, **MODELS[name]})
    model = build_model(cfg).train()
    for module in model.modules():
        if hasattr(module, "activation_checkpointing"):
            module.activation_checkpointing = checkpointing
    return model


def _batch(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0  # padding too
    if name == "encoder_decoder":
        return {"src_ids": ids, "src_mask": mask, "tgt_ids": ids[:, :8], "labels": ids[:, 1:9]}
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _gradients(name: str, checkpointing: bool) -> tuple[float, dict[str, torch.Tensor], int, int]:
    """(loss, gradients, layer forward calls, bytes held for backward outside the checkpoints)."""
    model = _model(name, checkpointing)
    calls = []
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.register_forward_pre_hook(lambda m, args: calls.append(m))  # (a recomputation stops early)
    held = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: held.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        torch.manual_seed(2)  # the dropout masks
        loss = batch_loss(model, _batch(name))
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, len(calls), sum(held)


@pytest.mark.parametrize("name", MODELS)
def test_gradients_equal_the_plain_run_with_dropout(name):
    loss, grads, calls, held = _gradients(name, checkpointing=False)
    loss_ckpt, grads_ckpt, calls_ckpt, held_ckpt = _gradients(name, checkpointing=True)
    assert loss_ckpt == loss
    assert grads_ckpt.keys() == grads.keys() and len(grads) > 10
    for key, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[key], grad, atol=1e-6, rtol=0, msg=key)
    assert calls_ckpt == 2 * calls  # every layer ran again in backward
    assert held_ckpt < held / 2  # and held far less for it


def test_no_recomputation_without_gradients_or_with_a_cache():
    model = _model("decoder", checkpointing=True)
    calls = []
    model.layers[0].register_forward_pre_hook(lambda m, args: calls.append(1))
    ids = torch.randint(1, V, (2, 6))
    with torch.no_grad():
        model(ids)  # evaluation
    model(ids, cache=KVCache(max_len=8)).sum().backward()  # a cache fills once: never run again
    assert len(calls) == 2
    model(ids).sum().backward()
    assert len(calls) == 4


def test_a_trainer_run_with_checkpointing_equals_the_plain_run(tmp_path, isolated_cache):
    runs = {}
    for on in (False, True):
        cfg = tiny_config(tmp_path / str(on), max_steps=4, eval_every=4, activation_checkpointing=on)
        trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
        runs[on] = (trainer.fit(), trainer.model.state_dict())
    assert runs[True][1]["layers.0.ffn.w1.weight"] is not None
    for key, value in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][key], value, atol=1e-6, rtol=0, msg=key)
    assert runs[True][0]["val_loss"] == pytest.approx(runs[False][0]["val_loss"], abs=1e-6)


def test_a_model_without_a_layer_stack_is_refused_naming_the_field(tmp_path, isolated_cache):
    cfg = TrainConfig.from_dict(tiny_config(tmp_path, activation_checkpointing=True))
    rnn = build_model(ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16))
    with pytest.raises(ConfigError, match="^train.activation_checkpointing: true needs a transformer encoder or "
                                          "decoder; a RNNEncoderDecoder has no layer stack"):
        Trainer(cfg, task=types.SimpleNamespace(), model=rnn, show_progress=False, log=lambda _: None)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_value_names_the_field(tmp_path, value):
    with pytest.raises(ValueError, match="train.activation_checkpointing: expected true or false"):
        TrainConfig.from_dict(tiny_config(tmp_path, activation_checkpointing=value))
