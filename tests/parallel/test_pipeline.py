"""Pipeline parallel (pp = 2 over gloo, torch.distributed.pipelining): the loss and every
gradient of a step equal the single-process run's -- decoders, encoders, prefix LMs and padded
rows (masks given to every stage), encoder-decoders with padded sources and targets (the memory
carried from the encoder's stage), GPipe and 1F1B -- Adam steps end at the same parameters (an
encoder-decoder's too, on batches whose widths change), evaluation through the stages gives the
model's logits, the stages send what `attnlab parallel plan` predicts; refused layouts name the
variant and the axis. The ranks run every check in one process group (tests/parallel/pipeline_workers.py)."""

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.parallel import spawn
from attnlab.parallel.pipeline import Pipeline
from attnlab.parallel.stages import StageModule, check_pipeline_supported, split_stages, stage_layers
from tests.parallel.pipeline_workers import VARIANTS, batch, full_loss, variant_batch
from tests.parallel.workers import tiny_config

STEPS = 3


@pytest.fixture(scope="module")
def pp_run():
    from tests.parallel.pipeline_workers import pp_suite

    return spawn(pp_suite, 2, args=(STEPS,), pp=2, timeout_s=150, collective_timeout_s=60)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loss_and_gradients_match_single_process(pp_run, variant):
    for rank, checks in enumerate(pp_run):
        assert checks[f"equivalence/{variant}"] == "ok", f"rank {rank}: {checks[f'equivalence/{variant}']}"


@pytest.mark.parametrize("check", ["training", "training/seq2seq"])
def test_adam_steps_match_single_process(pp_run, check):
    for rank, checks in enumerate(pp_run):
        assert checks[check] == "ok", f"rank {rank}: {checks[check]}"


def test_forward_only_through_the_stages_matches_the_model(pp_run):
    for rank, checks in enumerate(pp_run):
        assert checks["forward_only"] == "ok", f"rank {rank}: {checks['forward_only']}"


@pytest.mark.parametrize("axis", ["tp2", "dp2"])
def test_one_stage_over_tensor_or_data_parallel_matches_one_process(pp_run, axis):
    for rank, checks in enumerate(pp_run):
        assert checks[axis] == "ok", f"rank {rank}: {checks[axis]}"


def test_stages_send_and_hold_what_the_plan_predicts(pp_run):
    for rank, checks in enumerate(pp_run):
        measured = checks["measured"]
        assert isinstance(measured, dict), f"rank {rank}: {measured}"
        assert measured["sent"] == {"forward": measured["plan"]["forward"], "backward": measured["plan"]["backward"]}
        assert measured["params"] == measured["plan"]["params"]
    # stage 0 sends activations forward only, stage 1 their gradients backward only: 2 micro-batches of (2, 7, 32) fp32
    assert pp_run[0]["measured"]["sent"] == {"forward": 2 * 2 * 7 * 32 * 4, "backward": 0}
    assert pp_run[1]["measured"]["sent"] == {"forward": 0, "backward": 2 * 2 * 7 * 32 * 4}
    if not pp_run[1]["measured"]["can_drop_outputs"]:
        pytest.xfail("this torch's pipeline schedules have no return_outputs switch: the last stage keeps its "
                     "micro-batches' outputs until the next step")
    # the last stage holds no micro-batch's (b, T, V) output between steps (torch's default keeps all m)
    assert [run["measured"]["outputs_kept"] for run in pp_run] == [0, 0]


@pytest.mark.slow
def test_a_dead_stage_stops_the_other_with_a_clear_error_in_time():
    import time

    from attnlab.parallel import WorkerError
    from tests.parallel.pipeline_workers import die_mid_pipeline

    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(die_mid_pipeline, 2, pp=2, timeout_s=60, collective_timeout_s=5)
    reports = info.value.reports
    assert "exit code 3" in reports[1]
    assert "CollectiveError: pipeline stage 0 of 2" in reports[0] and "another rank probably died" in reports[0]
    assert "killed" not in reports[0]  # it stopped by itself, not by the deadline
    assert time.monotonic() - start < 45


def test_layers_split_evenly_earlier_stages_first():
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert stage_layers(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]


def test_stages_partition_the_model_under_its_own_names():
    model = attnlab.build_model(tiny_config("decoder", num_layers=3, tie_embeddings=False))
    stages = split_stages(model, 2)
    names = [set(s.state_dict()) for s in stages]
    assert names[0] & names[1] == set() and names[0] | names[1] == set(model.state_dict())
    assert any(n.startswith("embed.") for n in names[0]) and any(n.startswith("head.") for n in names[1])
    assert {n.split(".")[1] for n in names[0] if n.startswith("layers.")} == {"0", "1"}


def test_an_encoder_decoder_is_cut_as_one_stack_encoder_first():
    model = attnlab.build_model(tiny_config("encoder_decoder", num_layers=2, num_decoder_layers=3,
                                            tie_embeddings=False, share_embeddings=False))
    stages = split_stages(model, 3)  # layers 0-1 of the encoder | decoder 0-1 | decoder 2
    names = [set(s.state_dict()) for s in stages]
    assert set().union(*names) == set(model.state_dict()) and sum(map(len, names)) == len(model.state_dict())
    prefixes = [{".".join(n.split(".")[:2]) for n in part} for part in names]
    assert prefixes[0] == {"encoder.embed", "encoder.layers", "encoder.final_norm"}  # ends with the memory
    assert prefixes[1] == {"decoder.embed", "decoder.layers"}
    assert prefixes[2] == {"decoder.layers", "decoder.final_norm", "decoder.head"}
    # what each receives: nothing (the source ids are its argument), the memory, the decoder's states and the memory
    assert [s.receives for s in stages] == [(), ("input",), ("target", "input")]


def test_one_stage_is_gradient_accumulation_over_micro_batches():
    torch.manual_seed(0)
    full = attnlab.build_model(tiny_config("decoder"))
    torch.manual_seed(0)
    pipe = Pipeline(attnlab.build_model(tiny_config("decoder")), micro_batches=2)
    ids, labels = batch(5)
    reference = full_loss(full, ids, labels)
    reference.backward()
    assert pipe.step(ids, labels) == pytest.approx(float(reference.detach()), abs=1e-6)
    grads = dict(full.named_parameters())
    for name, p in pipe.stage.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    with pytest.raises(ValueError, match="not divisible by micro_batches=3"):
        Pipeline(attnlab.build_model(tiny_config("decoder")), micro_batches=3).step(ids, labels)


def test_one_stage_of_an_encoder_decoder_takes_its_masks_and_target_ids():
    torch.manual_seed(0)
    full = attnlab.build_model(tiny_config("encoder_decoder"))
    torch.manual_seed(0)
    pipe = Pipeline(attnlab.build_model(tiny_config("encoder_decoder")), micro_batches=2)
    src, labels, inputs = variant_batch("seq2seq", 2)
    reference = full_loss(full, src, labels, **inputs)
    reference.backward()
    assert pipe.step(src, labels, **inputs) == pytest.approx(float(reference.detach()), abs=1e-6)
    grads = dict(full.named_parameters())
    for name, p in pipe.stage.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    with pytest.raises(ValueError, match="needs tgt_ids"):
        pipe.step(src, labels, src_mask=inputs["src_mask"])
    with pytest.raises(ValueError, match="takes the inputs src_mask, tgt_ids, tgt_mask; got attention_mask"):
        pipe.step(src, labels, attention_mask=inputs["src_mask"], tgt_ids=inputs["tgt_ids"])
    with pytest.raises(ValueError, match=r"targets must be \(B, Tt\) = \(4, 5\), got \(4, 6\)"):
        pipe.step(src, src, **inputs)


@pytest.mark.parametrize("arch, overrides, pp, message", [
    ("decoder", {"num_layers": 2}, 3, "pp=3 stages is deeper than the model's num_layers=2"),
    ("rnn_encoder_decoder", {}, 2, "not arch='rnn_encoder_decoder'"),
    ("encoder_decoder", {"num_layers": 1, "num_decoder_layers": 2}, 4,
     "pp=4 stages is deeper than the model's 3 layers (num_layers=1 encoder + 2 decoder)"),
    ("encoder", {"head": "classification", "num_labels": 2}, 2, "head='classification'"),
    ("decoder", {"moe": {"num_experts": 2}}, 2, "moe.num_experts=2"),
    ("decoder", {"memory_len": 4, "position": {"scheme": "rotary"}}, 2, "memory_len=4"),
    ("encoder", {"attention": {"kernel": "longformer", "kernel_options": {"window": 2, "global_token_id": 3}}}, 2,
     "attention.kernel='longformer'"),
])
def test_unsupported_layouts_are_refused_by_name_and_axis(arch, overrides, pp, message):
    with pytest.raises(ValueError, match="pipeline parallel") as info:
        check_pipeline_supported(tiny_config(arch, **overrides), pp)
    assert message in str(info.value)


@pytest.mark.parametrize("arch, kind", [("decoder", "padded"), ("decoder", "prefix"), ("encoder", "lm"),
                                        ("encoder", "padded_mlm"), ("encoder_decoder", "seq2seq")])
def test_padding_and_joining_batches_keeps_the_loss_and_outputs(arch, kind):
    """What a pipeline does to batches of other widths (pad_batch, join_batches) changes no real
    position's output: right padding that a causal decoder never sees, or masked out (a mask made
    where the batch has none: the encoder's lm batch)."""
    from attnlab.parallel.stages import join_batches, pad_batch

    torch.manual_seed(0)
    model = attnlab.build_model(tiny_config(arch, num_decoder_layers=1) if arch == "encoder_decoder" else
                                tiny_config(arch))

    def logits(ids, inputs):
        if arch == "encoder_decoder":
            return model(ids, inputs["tgt_ids"], inputs.get("src_mask"), inputs.get("tgt_mask"))
        return model(ids, inputs.get("attention_mask"), **{k: v for k, v in inputs.items() if k != "attention_mask"})

    ids, labels, inputs = variant_batch(kind, 3)
    wider = (ids.shape[1] + 3, labels.shape[1] + (2 if arch == "encoder_decoder" else 3))
    padded = pad_batch(arch, ids, labels, inputs, wider)
    assert (padded[0].shape[1], padded[1].shape[1]) == wider
    assert int((padded[1] != -100).sum()) == int((labels != -100).sum())
    real = labels != -100
    torch.testing.assert_close(logits(padded[0], padded[2])[:, :labels.shape[1]][real], logits(ids, inputs)[real],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(full_loss(model, *padded[:2], **padded[2]), full_loss(model, ids, labels, **inputs),
                               atol=1e-6, rtol=0)
    if kind == "seq2seq":
        other = variant_batch(kind, 4, 4, 3)
    else:  # 5 columns of another batch
        o_ids, o_labels, o_inputs = variant_batch(kind, 4)
        other = (o_ids[:, :5], o_labels[:, :5], {k: v[:, :5] if v.dim() == 2 else v for k, v in o_inputs.items()})
    joined = join_batches(arch, [(ids, labels, inputs), other])
    want = torch.cat([F.cross_entropy(logits(i, x).flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")[None]
                      for i, y, x in ((ids, labels, inputs), other)]).sum() / (int(real.sum()) + int((other[1] != -100).sum()))
    torch.testing.assert_close(full_loss(model, *joined[:2], **joined[2]), want, atol=1e-6, rtol=0)


def test_mesh_coordinates_vary_tp_fastest_and_pp_slowest():
    from attnlab.parallel import ParallelContext

    coords = [(c.tp_rank, c.dp_rank, c.pp_rank) for c in
              (ParallelContext(rank=r, world_size=8, tp_size=2, dp_size=2, pp_size=2) for r in range(8))]
    assert coords == [(t, d, p) for p in range(2) for d in range(2) for t in range(2)]
    assert ParallelContext(rank=3, world_size=4, tp_size=2, dp_size=2).dp_rank == 1  # no pp: as before


def test_bad_arguments_are_refused():
    model = attnlab.build_model(tiny_config("decoder"))
    from attnlab.parallel.pipeline import SCHEDULES, _schedules

    assert set(SCHEDULES) == set(_schedules())  # the names the errors list are the ones torch runs
    with pytest.raises(ValueError, match="schedule='zigzag' is not one of gpipe, 1f1b"):
        Pipeline(model, schedule="zigzag")
    with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
        Pipeline(model, micro_batches=0)
    with pytest.raises(TypeError, match="build_model"):
        split_stages(torch.nn.Linear(2, 2), 2)
    with pytest.raises(ValueError, match="stage index 2 is outside"):
        StageModule(model, 2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("tp, pp", [(2, 2), (1, 2)], ids=["tp2_pp2", "pp2_dp2"])
def test_pipeline_on_a_4_process_mesh_matches_one_process(tp, pp):
    from tests.parallel.pipeline_workers import mesh_suite

    results = spawn(mesh_suite, 4, args=(STEPS,), tp=tp, pp=pp, timeout_s=300, collective_timeout_s=120)
    for rank, checks in enumerate(results):
        assert checks["mesh"] == "ok", f"rank {rank}: {checks['mesh']}"
    # (tp, pp, dp) coordinates: tp varies fastest, pp slowest
    expected = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)] if tp == 2 else [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert [tuple(r["coordinates"]) for r in results] == expected
