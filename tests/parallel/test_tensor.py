"""Tensor parallel (tp = 2 over gloo): forward and every gradient equal the single-process
model's, 10 Adam steps end at the same parameters, and a checkpoint saved under tp = 2 resumes
exactly in one process. The ranks run every check in one process group (tests/parallel/workers.py)."""

import pytest
import torch

import attnlab
from attnlab.parallel import check_supported, tensor_parallel
from tests.parallel.helpers import resume_single
from tests.parallel.workers import tiny_config

VARIANTS = ["decoder", "encoder_decoder", "encoder_mlm", "alibi_gqa", "t5_bias_untied", "relative_general",
            "additive_eager", "padded_vocabulary"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_and_gradients_match_single_process(tp_run, variant):
    _, results = tp_run
    for rank, checks in enumerate(results):
        assert checks[f"equivalence/{variant}"] == "ok", f"rank {rank}: {checks[f'equivalence/{variant}']}"


def test_a_padded_vocabulary_takes_no_probability_and_is_dropped_on_gather(tp_run):
    _, results = tp_run
    for rank, checks in enumerate(results):
        assert checks["padded_loss"] == "ok", f"rank {rank}: {checks['padded_loss']}"


def test_ten_adam_steps_match_single_process(tp_run):
    _, results = tp_run
    for rank, checks in enumerate(results):
        assert checks["training"] == "ok", f"rank {rank}: {checks['training']}"


def test_tp_checkpoint_resumes_in_one_process(tp_run):
    out, results = tp_run
    assert results[0]["training"] == "ok"
    resumed = resume_single(out / "tp_step5", first_seed=100, rows=4, ignore_first=True)
    reference = attnlab.load(out / "full_step10").state_dict()
    assert resumed.keys() == reference.keys()
    for name, t in reference.items():
        torch.testing.assert_close(resumed[name], t, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("overrides, field", [
    ({"num_heads": 2, "attention": {"num_kv_heads": 1}}, "num_kv_heads"),
    ({"d_ff": 63}, "d_ff"),
    ({"attention": {"kernel": "sliding_window", "window": 4}}, "sliding_window"),
    ({"moe": {"num_experts": 2}}, "moe.num_experts"),
])
def test_unsupported_configs_are_refused_by_name(overrides, field):
    with pytest.raises(ValueError, match=field):
        check_supported(tiny_config("decoder", **overrides), 2)


def test_rnn_and_foreign_models_are_refused():
    with pytest.raises(ValueError, match="rnn_encoder_decoder"):
        check_supported(attnlab.ModelConfig.from_dict({"arch": "rnn_encoder_decoder", "vocab_size": 64}), 2)
    with pytest.raises(TypeError, match="build_model"):
        tensor_parallel(torch.nn.Linear(2, 2))


def test_one_rank_is_the_plain_model():
    model = attnlab.build_model(tiny_config("decoder"))
    ids = torch.randint(0, 64, (2, 5))
    before = model(ids)
    assert tensor_parallel(model) is model and model.tp_size == 1
    torch.testing.assert_close(model(ids), before)
