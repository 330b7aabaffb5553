"""The cost note: its tensor-parallel bytes equal what a sharded step really all-reduces, its
data-parallel bytes equal the gradients a rank holds, and the command prints them."""

import json

import pytest

import attnlab
from attnlab.cli.main import main
from attnlab.parallel.cost import communication_cost
from tests.parallel.workers import tiny_config


def test_tensor_parallel_bytes_match_a_measured_step(tp_run):
    _, results = tp_run
    measured = results[0]["measured_bytes"]
    cfg = tiny_config("decoder", position={"scheme": "rotary"})
    cost = communication_cost(cfg, tp=2, dp=1, seq_len=7, batch=4)
    assert (cost["tp_forward_bytes"], cost["tp_backward_bytes"]) == (measured["forward"], measured["backward"])


def test_data_parallel_bytes_are_the_gradients_of_one_rank():
    cfg = tiny_config("decoder")
    n_params = sum(p.numel() for p in attnlab.build_model(cfg).parameters())
    alone = communication_cost(cfg, tp=1, dp=2, seq_len=8, batch=2)
    assert alone["dp_gradient_bytes"] == 4 * n_params and alone["tp_forward_bytes"] == 0
    split = communication_cost(cfg, tp=2, dp=2, seq_len=8, batch=2, bytes_per_value=2)
    # whole on every rank: the norms (2 per layer + final; weight and bias) and the biases of the
    # row-parallel out_proj and w2 (added after the all-reduce); everything else is halved
    replicated = (2 * cfg.num_layers + 1) * 2 * cfg.d_model + cfg.num_layers * 2 * cfg.d_model
    assert split["params_per_rank"] == (n_params - replicated) // 2 + replicated
    assert split["dp_ring_bytes_per_rank"] == pytest.approx(split["dp_gradient_bytes"])  # 2 (k-1)/k = 1 at k = 2


def test_cost_command_prints_json_and_refusal_note(capsys):
    assert main(["parallel", "cost", "gpt2-small", "--tp", "8", "--dp", "2", "--seq-len", "64", "--batch", "2",
                 "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["world_size"] == 16 and "num_heads=12 is not divisible" in cost["note"]
    assert [r["part"] for r in cost["rows"]][:3] == ["embedding", "self-attention", "feed-forward"]
    assert main(["parallel", "cost", "tiny-encoder-decoder", "--tp", "2"]) == 0
    assert "decoder cross-attention" in capsys.readouterr().out
    assert main(["parallel", "cost", "tiny-decoder", "--tp", "0"]) == 2


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder"])
@pytest.mark.parametrize("tgt_len", [0, -4])
def test_a_target_length_below_one_is_refused(arch, tgt_len):
    """-4 gave negative MiB for an encoder-decoder's decoder; 0 silently meant seq_len."""
    with pytest.raises(ValueError, match=rf"^tgt_len must be a positive integer, got {tgt_len}$"):
        communication_cost(tiny_config(arch), tp=2, dp=1, seq_len=8, batch=2, tgt_len=tgt_len)
