"""`attnlab parallel plan`: each number of a small layout against a hand formula, the weights,
gradients and Adam states against the parameters a model really holds once tensor parallel has
split it (attnlab.parallel.tensor, on one process) and the pipeline has cut it, and the errors."""

import json
import math

import pytest

import attnlab
import attnlab.parallel.tensor as tensor_module
from attnlab.cli.main import main
from attnlab.parallel.plan import plan_layout
from tests.parallel.workers import tiny_config

# V 64, D 32, 4 heads of 8, d_ff 64, pre-norm, tied LM head; the eager kernel holds the H T T weights
EAGER = {"attention": {"kernel": "eager"}}


def _sharded_by_tensor_py(model, tp: int, rank: int, monkeypatch):
    """Split `model` in place exactly as tensor_parallel does on rank `rank` of `tp`, without a
    process group (only the group's size and rank are read while splitting)."""
    with monkeypatch.context() as patch:
        patch.setattr(tensor_module, "group_size", lambda group: tp)
        patch.setattr(tensor_module, "group_rank", lambda group: rank)
        tensor_module.tensor_parallel(model, None, gather_output=False)
    return model


def _held(model, prefixes: tuple[str, ...]) -> int:
    """Elements of the distinct tensors under names starting with one of `prefixes`."""
    held = {id(p): p for name, p in model.named_parameters(remove_duplicate=False) if name.startswith(prefixes)}
    return sum(p.numel() for p in held.values())


def test_every_number_of_a_tp2_pp2_dp2_layout_matches_the_hand_formula():
    cfg = tiny_config("decoder", num_layers=3, **EAGER)
    plan = plan_layout(cfg, nproc=8, tp=2, pp=2, dp=2, micro_batches=2, seq_len=8, batch=4)
    first, last = plan["stages"]
    b, S, D, V, s, m = 2, 8, 32, 64, 4, 2
    assert plan["bubble_fraction"] == pytest.approx(1 / 3)  # (P-1)/(m+P-1)
    assert (first["layers"], last["layers"]) == ([0, 2], [2, 3])
    # parameters on one tp rank: qkv (32x96 + 96)/2, out_proj 32x32/2 + bias 32, w1 (32x64 + 64)/2,
    # w2 64x32/2 + bias 32, two norms 2x2x32; embedding 64x32/2; final norm 2x32; the tied head is the embedding
    layer = (32 * 96 + 96) // 2 + 32 * 32 // 2 + 32 + (32 * 64 + 64) // 2 + 64 * 32 // 2 + 32 + 4 * 32
    assert first["params_per_rank"] == 2 * layer + 64 * 32 // 2
    assert last["params_per_rank"] == layer + 2 * 32 + 64 * 32 // 2
    for row in (first, last):
        p = row["params_per_rank"]
        assert (row["weights_bytes"], row["gradients_bytes"], row["optimizer_bytes"]) == (4 * p, 4 * p, 8 * p)
    # activations of a layer, one row: q, k, v and the out_proj output (S H Dh + 2 S G Dh + S D), the
    # H S S weights and the mixed values (H S S + S H Dh), the ffn hidden and output (S F + S D); the
    # per-head and hidden parts split over tp, the (S, D) outputs not
    per_layer = (S * D + 3 * S * D // 2) + (4 * S * S + S * D) // 2 + (S * D + S * 64 // 2)
    assert first["activation_bytes_per_micro_batch"] == b * s * (2 * per_layer + S * D)  # + embeddings
    assert last["activation_bytes_per_micro_batch"] == b * s * (per_layer + S * V // 2)  # + logits, V/tp
    assert first["activation_bytes_gpipe"] == m * first["activation_bytes_per_micro_batch"]
    assert first["activation_bytes_1f1b"] == 2 * first["activation_bytes_per_micro_batch"]  # min(m, P - 0)
    assert last["activation_bytes_1f1b"] == 1 * last["activation_bytes_per_micro_batch"]  # min(m, P - 1)
    assert last["total_bytes"] == 16 * last["params_per_rank"] + last["activation_bytes_gpipe"]
    # tp per micro-batch: embedding g (b S D); per layer f and g of attention and ffn (b S D each way);
    # head: 3 all-reduces of b S numbers forward, b S D backward
    msg = b * S * D * s
    assert (first["tp_forward_bytes"], first["tp_backward_bytes"]) == (m * (msg + 2 * 2 * msg), m * 2 * 2 * msg)
    assert (last["tp_forward_bytes"], last["tp_backward_bytes"]) == (m * (2 * msg + 3 * b * S * s), m * 3 * msg)
    assert first["tp_ring_bytes"] == first["tp_forward_bytes"] + first["tp_backward_bytes"]  # 2 (k-1)/k = 1
    # pp: b S D activations forward, their gradients backward, per micro-batch; the tied embedding's gradient
    assert (first["pp_send_forward_bytes"], first["pp_send_backward_bytes"]) == (m * msg, 0)
    assert (last["pp_send_forward_bytes"], last["pp_send_backward_bytes"]) == (0, m * msg)
    assert first["pp_shared_gradient_bytes"] == last["pp_shared_gradient_bytes"] == 4 * V * D // 2
    assert plan["shared_across_stages"] == ["embed.token.weight"]
    # dp: one all-reduce of this rank's fp32 gradients
    for row in (first, last):
        assert row["dp_bytes"] == row["dp_ring_bytes"] == 4 * row["params_per_rank"]


@pytest.mark.parametrize("arch, overrides", [
    ("decoder", {}),
    ("decoder", {"tie_embeddings": False, "activation": "swiglu", "attention": {"num_kv_heads": 2}}),
    ("decoder", {"position": {"scheme": "t5_bias"}, "num_layers": 3}),
    ("decoder", {"position": {"scheme": "relative"}, "attention": {"score": "general"}}),
    ("encoder", {"embedding_norm": True, "position": {"scheme": "learned"}}),
    ("decoder", {"vocab_size": 63, "tie_embeddings": False}),  # padded to 64 rows: 32 on each rank
])
def test_weights_match_the_parameters_of_a_sharded_and_cut_model(arch, overrides, monkeypatch):
    cfg = tiny_config(arch, **overrides)
    plan = plan_layout(cfg, nproc=4, tp=2, pp=2, seq_len=8, batch=2)
    L = cfg.num_layers
    split = [range(0, (L + 1) // 2), range((L + 1) // 2, L)]
    for rank in (0, 1):  # both tensor-parallel ranks hold the same amount
        model = _sharded_by_tensor_py(attnlab.build_model(cfg), 2, rank, monkeypatch)
        for stage, layers in enumerate(split):
            names = tuple(f"layers.{i}." for i in layers) + (("embed.",) if stage == 0 else ("final_norm.", "head."))
            names += ("position_bias.",)  # every stage computes the position bias
            held = _held(model, names)
            row = plan["stages"][stage]
            assert row["params_per_rank"] == held, (stage, rank)
            assert row["weights_bytes"] + row["gradients_bytes"] + row["optimizer_bytes"] == 16 * held


def test_without_pipeline_one_stage_holds_the_sharded_model(monkeypatch):
    cfg = tiny_config("encoder_decoder", activation="swiglu")
    plan = plan_layout(cfg, nproc=2, tp=2, seq_len=8, tgt_len=6, batch=2)
    model = _sharded_by_tensor_py(attnlab.build_model(cfg), 2, 0, monkeypatch)
    assert [r["params_per_rank"] for r in plan["stages"]] == [_held(model, ("",))]
    assert plan["stages"][0]["layers"] == [0, cfg.num_layers + cfg.resolved_decoder_layers]
    assert plan["bubble_fraction"] == 0 and plan["stages"][0]["pp_send_forward_bytes"] == 0


@pytest.mark.parametrize("encoder_layers, decoder_layers", [(2, 2), (1, 3)], ids=["cut_between", "cut_in_decoder"])
def test_an_encoder_decoder_pipeline_holds_and_sends_what_its_stages_do(encoder_layers, decoder_layers, monkeypatch):
    """Its layers cut as one stack, the encoder's first: each stage's parameters are those of the
    stage split_stages gives the tensor-parallel model; a stage inside the decoder sends the
    memory beside the decoder's states, and the decoder's embedding sits where its layer 0 is."""
    from attnlab.parallel.stages import split_stages

    cfg = tiny_config("encoder_decoder", num_layers=encoder_layers, num_decoder_layers=decoder_layers,
                      position={"scheme": "t5_bias"}, **EAGER)
    b, S, Tt, D, m, s = 2, 8, 6, 32, 2, 4
    plan = plan_layout(cfg, nproc=4, tp=2, pp=2, micro_batches=m, seq_len=S, tgt_len=Tt, batch=b * m)
    model = _sharded_by_tensor_py(attnlab.build_model(cfg), 2, 0, monkeypatch)
    for row, stage in zip(plan["stages"], split_stages(model, 2)):
        assert row["params_per_rank"] == sum({id(p): p.numel() for p in stage.parameters()}.values())
    first, last = plan["stages"]
    assert (first["layers"], last["layers"]) == ([0, 2], [2, 4])
    sent = m * b * D * s * (S if encoder_layers == 2 else S + Tt)  # the memory; (decoder states, memory)
    assert (first["pp_send_forward_bytes"], first["pp_send_backward_bytes"]) == (sent, 0)
    assert (last["pp_send_forward_bytes"], last["pp_send_backward_bytes"]) == (0, sent)
    # activations: the layers' (as the one-stage plan counts them), the encoder's embeddings b S D on the first
    # stage, the decoder's b Tt D where its layer 0 is, the logits b Tt V/tp on the last
    from attnlab.training.setup.memory import layer_activations  # the one cost model, which training reads too

    per_layer = layer_activations(cfg, S, Tt, 2)
    stack = [("encoder.", i) for i in range(encoder_layers)] + [("decoder.", i) for i in range(decoder_layers)]
    spans = [stack[:2], stack[2:]]
    for index, (row, span) in enumerate(zip(plan["stages"], spans)):
        want = sum(per_layer[key] for key in span) + S * D * (index == 0) + Tt * D * (("decoder.", 0) in span)
        want += Tt * 64 // 2 * (index == 1)
        assert row["activation_bytes_per_micro_batch"] == s * b * want, index
    assert plan["shared_across_stages"][0] == "encoder.embed.token.weight"  # shared and tied: on both stages
    # the stages share out the tensor-parallel all-reduces of the whole model: each stack's layers and embedding
    whole = plan_layout(cfg, nproc=2, tp=2, micro_batches=m, seq_len=S, tgt_len=Tt, batch=b * m)["stages"][0]
    for key in ("tp_forward_bytes", "tp_backward_bytes"):
        assert first[key] + last[key] == whole[key] and first[key] > 0 and last[key] > 0


def test_fsdp_shards_weights_gradients_and_adam_over_the_data_axis():
    cfg = tiny_config("decoder", vocab_size=66)  # 66 rows: padded to 3 x 22
    ddp = plan_layout(cfg, nproc=3, seq_len=8, batch=2)["stages"][0]
    fsdp = plan_layout(cfg, nproc=3, seq_len=8, batch=2, micro_batches=2, fsdp=True)["stages"][0]
    model = attnlab.build_model(cfg)
    total = sum(p.numel() for p in model.parameters())
    shard = sum(math.ceil(p.shape[0] / 3) * p[0].numel() if p.dim() > 1 else math.ceil(p.numel() / 3)
                for p in model.parameters())
    assert ddp["params_per_rank"] == total and ddp["dp_bytes"] == 4 * total
    assert ddp["dp_ring_bytes"] == pytest.approx(4 * total * 2 * 2 / 3)
    assert fsdp["params_per_rank"] == shard and fsdp["optimizer_bytes"] == 8 * shard
    # per micro-batch: all-gather forward, all-gather backward, reduce-scatter; (k-1)/k of each sent
    assert fsdp["dp_bytes"] == 2 * 3 * 4 * total
    assert fsdp["dp_ring_bytes"] == pytest.approx(2 * 3 * 4 * total * 2 / 3)


@pytest.mark.parametrize("arch, overrides, layout, message", [
    ("decoder", {}, dict(nproc=4, tp=2, pp=2, dp=2), "tp=2 x pp=2 x dp=2 = 8 processes does not match nproc=4"),
    ("decoder", {}, dict(nproc=6, tp=4), "tp=4 x pp=1 = 4 does not divide nproc=6"),
    ("decoder", {"num_heads": 2, "attention": {"num_kv_heads": 2}}, dict(nproc=4, tp=4),
     "num_heads=2 is not divisible by the tensor-parallel size 4"),
    ("decoder", {"d_ff": 66}, dict(nproc=4, tp=4), "d_ff=66 is not divisible by the tensor-parallel size 4"),
    ("decoder", {}, dict(nproc=3, pp=3), "pp=3 stages is deeper than the model's num_layers=2"),
    ("decoder", {"attention": {"kernel": "sliding_window", "window": 4}}, dict(nproc=2, tp=2),
     "tensor parallel does not support attention.kernel='sliding_window'"),
    ("encoder_decoder", {"num_layers": 1, "num_decoder_layers": 1}, dict(nproc=3, pp=3),
     "pp=3 stages is deeper than the model's 2 layers (num_layers=1 encoder + 1 decoder)"),
    ("decoder", {}, dict(nproc=4, tp=2, fsdp=True), "fsdp with tp=2 is not supported"),
    ("decoder", {}, dict(nproc=4, pp=2, fsdp=True), "fsdp with pp=2 is not supported"),
    ("decoder", {}, dict(nproc=1, micro_batches=3),
     "batch=8 (rows per data-parallel rank) is not divisible by micro_batches=3"),
    ("decoder", {}, dict(nproc=0), "nproc must be a positive integer, got 0"),
])
def test_layouts_that_do_not_fit_are_refused_in_one_line(arch, overrides, layout, message):
    with pytest.raises(ValueError) as info:
        plan_layout(tiny_config(arch, **overrides), **layout)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_plan_command_prints_a_table_json_and_errors(capsys):
    assert main(["parallel", "plan", "tiny-decoder", "--nproc", "4", "--pp", "2", "--micro-batches", "4",
                 "--seq-len", "32", "--batch", "8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["layout"]["dp"] == 2 and plan["bubble_fraction"] == pytest.approx(1 / 5) and len(plan["stages"]) == 2
    assert main(["parallel", "plan", "tiny-decoder", "--set", "vocab_size=96", "--nproc", "2", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "memory per rank" in out and "pipeline bubble" in out and "largest rank" in out
    assert main(["parallel", "plan", "tiny-decoder", "--nproc", "3", "--tp", "2"]) == 2
    assert "does not divide nproc=3" in capsys.readouterr().err
