"""Transformer-XL's segment recurrence (Dai et al. 2019): the memory is attention over the
previous segment's layer inputs with a stop-gradient, causal over [memory; segment], with
positions consistent across segments; off, nothing changes. Plus the stream batcher, the
evaluation over a stream, generation with memory and the Trainer carrying the memory."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model
from attnlab.config.validate import ConfigError
from attnlab.models.recurrence import generate_with_memory
from attnlab.nn.kv_cache import SegmentMemory
from attnlab.nn.masks import causal_mask
from attnlab.training.tasks.recurrence import RecurrenceTask, batchify, segments, stream_loss

V = 40
RELATIVE = ["rotary", "alibi", "t5_bias", "relative", "none"]


def decoder(scheme: str = "rotary", *, layers: int = 2, memory_len: int = 0, seed: int = 0, **kw):
    torch.manual_seed(seed)
    position = {"scheme": scheme, "max_len": 64, "relative_max_distance": 6, "t5_num_buckets": 8,
                "t5_max_distance": 16}
    cfg = ModelConfig(arch="decoder", vocab_size=V, d_model=32, num_layers=layers, num_heads=4, d_ff=48,
                      dropout=0.0, norm_placement=kw.pop("norm_placement", "pre"), position=position,
                      memory_len=memory_len, **kw)
    return build_model(cfg).eval()


def tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def reference_second_segment(model, s1, s2, M):
    """Logits of s2 after s1, built explicitly from the layers: segment 1 runs alone; then for
    each layer, the layer runs over [its segment-1 inputs (last M, detached); segment 2's input]
    with a causal mask over the concatenation, and segment 2's rows are kept."""
    T = s1.shape[1]
    bias = lambda q, k: model.position_bias(q, k) if model.position_bias is not None else None
    pos1 = torch.arange(T)[None]
    h, inputs1 = model.embed(s1, pos1), []
    for layer in model.layers:
        inputs1.append(h.detach())
        h = layer(h, causal_mask(T)[None, None], bias=bias(pos1, pos1), positions=pos1, key_positions=pos1)
    pos = torch.arange(T - M, 2 * T)[None]  # the memory's positions, then segment 2's
    h = model.embed(s2, pos[:, M:])
    for layer, mem in zip(model.layers, inputs1):
        both = torch.cat([mem[:, T - M:], h], 1)
        h = layer(both, causal_mask(M + T)[None, None], bias=bias(pos, pos), positions=pos, key_positions=pos)[:, M:]
    return model.head(model.final_norm(h) if model.final_norm is not None else h)


# ---- the memory is attention over the detached previous segment ---------------------------------

@pytest.mark.parametrize("scheme", RELATIVE)
def test_one_layer_memory_of_T_equals_the_full_forward_over_both_segments(scheme):
    model = decoder(scheme, layers=1)
    x = tokens(2, 12)
    with torch.no_grad():
        full = model(x)
        _, mems = model.segment(x[:, :6], mem_len=6)
        second, _ = model.segment(x[:, 6:], mems, mem_len=6)
    torch.testing.assert_close(second, full[:, 6:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", RELATIVE)
@pytest.mark.parametrize("M", [6, 3])
@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_memory_equals_layers_over_the_concatenation_with_detached_inputs(scheme, M, norm_placement):
    model = decoder(scheme, layers=3, norm_placement=norm_placement)
    s1, s2 = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    with torch.no_grad():
        _, mems = model.segment(s1, mem_len=M)
        second, _ = model.segment(s2, mems, mem_len=M)
        ref = reference_second_segment(model, s1, s2, M)
        alone = model(s2)
    torch.testing.assert_close(second, ref, atol=1e-5, rtol=1e-5)
    assert (second - alone).abs().max() > 1e-3  # the memory is read: without it the logits differ


def test_memory_with_kv_heads_grouped_and_the_eager_kernel():
    model = decoder("rotary", layers=2, attention={"num_kv_heads": 2, "kernel": "eager"})
    s1, s2 = tokens(2, 5, seed=3), tokens(2, 5, seed=4)
    with torch.no_grad():
        _, mems = model.segment(s1, mem_len=5)
        second, _ = model.segment(s2, mems, mem_len=5)
        ref = reference_second_segment(model, s1, s2, 5)
    torch.testing.assert_close(second, ref, atol=1e-5, rtol=1e-5)


def test_no_gradient_reaches_the_previous_segment():
    model = decoder("rotary", layers=2)
    s1, s2 = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    reached = []

    def watch(module, inputs, out):  # segment 1's embeddings report any gradient that reaches them
        out.register_hook(lambda grad: reached.append(1))

    hook = model.embed.register_forward_hook(watch)
    first, mems = model.segment(s1, mem_len=6)
    hook.remove()
    assert all(not m.requires_grad for m in mems)
    second, _ = model.segment(s2, mems, mem_len=6)
    second.square().sum().backward()
    assert not reached  # nothing flowed into segment 1's computation
    assert model.layers[0].self_attn.qkv_proj.weight.grad is not None
    first.square().sum().backward()  # the control: segment 1's own loss does reach it
    assert reached


def test_memory_given_with_a_graph_is_detached_on_the_way_in():
    model = decoder("rotary", layers=1)
    mem = torch.randn(2, 4, 32, requires_grad=True)
    second, states = model.segment(tokens(2, 5), [mem], mem_len=4)
    second.sum().backward()
    assert mem.grad is None and not states[0].requires_grad


# ---- causality, positions, clipping ---------------------------------------------------------------

@pytest.mark.parametrize("scheme", RELATIVE)
def test_causal_over_memory_and_segment(scheme):
    model = decoder(scheme, layers=2)
    s1, s2 = tokens(2, 6, seed=1), tokens(2, 8, seed=2)
    changed = s2.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % V
    with torch.no_grad():
        _, mems = model.segment(s1, mem_len=6)
        a, _ = model.segment(s2, mems, mem_len=6)
        b, _ = model.segment(changed, mems, mem_len=6)
    torch.testing.assert_close(a[:, :5], b[:, :5], atol=0, rtol=0)
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-4


@pytest.mark.parametrize("scheme", ["rotary", "alibi", "t5_bias", "relative"])
def test_shifting_every_position_changes_nothing(scheme):
    model = decoder(scheme, layers=2)
    s1, s2 = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    out = {}
    with torch.no_grad():
        for shift in (0, 37):
            _, mems = model.segment(s1, mem_len=6, position_ids=shift + torch.arange(6)[None])
            out[shift], _ = model.segment(s2, mems, mem_len=6, position_ids=shift + 6 + torch.arange(6)[None])
    torch.testing.assert_close(out[37], out[0], atol=1e-5, rtol=1e-5)


def test_memory_positions_sit_just_before_the_segment():
    """Numbering the memory's keys as if it were the segment's first positions (a bug the shift
    test cannot see) would break the equality with the reference: this pins the offsets."""
    memory = SegmentMemory(8, [torch.zeros(1, 3, 4)])
    assert memory.key_positions(torch.tensor([[10, 11]])).tolist() == [[7, 8, 9, 10, 11]]


def test_memory_keeps_the_last_M_layer_inputs():
    model = decoder("rotary", layers=2)
    x = tokens(2, 15)
    embed = lambda ids: model.embed(ids, torch.zeros_like(ids))  # rotary: the layer-0 input has no positions
    with torch.no_grad():
        mems = None
        for s in range(3):
            _, mems = model.segment(x[:, 5 * s:5 * s + 5], mems, mem_len=8)
            seen = x[:, :5 * s + 5]
            assert [m.shape for m in mems] == [torch.Size([2, min(8, seen.shape[1]), 32])] * 2
            torch.testing.assert_close(mems[0], embed(seen)[:, -8:], atol=0, rtol=0)
        _, short = model.segment(x[:, :5], mem_len=3)
    assert short[0].shape[1] == 3  # M < T: the last 3 positions only


def test_a_memory_shorter_than_the_segment_equals_the_full_forward_over_what_it_keeps():
    model = decoder("rotary", layers=1)
    s1, s2 = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    with torch.no_grad():
        _, mems = model.segment(s1, mem_len=2)
        second, _ = model.segment(s2, mems, mem_len=2)
        full = model(torch.cat([s1[:, -2:], s2], 1))
    torch.testing.assert_close(second, full[:, 2:], atol=1e-5, rtol=1e-5)


# ---- off: nothing changes ------------------------------------------------------------------------

def test_memory_off_is_the_plain_forward_bitwise():
    on, off = decoder("rotary", memory_len=16), decoder("rotary", memory_len=0)
    off.load_state_dict(on.state_dict())
    x = tokens(3, 9)
    with torch.no_grad():
        plain = off(x)
        assert torch.equal(on(x), plain)  # memory_len changes nothing unless a memory is passed
        first, _ = on.segment(x)  # the first segment: an empty memory
    assert torch.equal(first, plain)


# ---- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "binary"])
def test_absolute_positions_are_refused_naming_the_field(scheme):
    with pytest.raises(ConfigError) as err:
        ModelConfig(arch="decoder", vocab_size=V, d_model=32, num_heads=4, memory_len=8, position={"scheme": scheme})
    assert err.value.path == "memory_len" and "position.scheme" in str(err.value) and scheme in str(err.value)


@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder", "rnn_encoder_decoder"])
def test_other_archs_are_refused_naming_the_field(arch):
    with pytest.raises(ConfigError) as err:
        ModelConfig(arch=arch, vocab_size=V, d_model=32, num_heads=4, memory_len=8, position={"scheme": "rotary"})
    assert err.value.path == "memory_len" and "arch" in str(err.value)


def test_negative_memory_len_is_refused():
    with pytest.raises(ConfigError, match="memory_len"):
        ModelConfig(arch="decoder", vocab_size=V, memory_len=-1, position={"scheme": "rotary"})


def test_runtime_refusals():
    absolute = decoder("learned")
    with pytest.raises(ValueError, match="relative positions"):
        absolute.segment(tokens(1, 4), mem_len=4)
    with pytest.raises(ValueError, match="memory_len=0"):
        decoder("rotary").segment(tokens(1, 4))
    model = decoder("rotary", layers=2)
    with pytest.raises(ValueError, match="2 layers"):
        model.segment(tokens(1, 4), [torch.zeros(1, 3, 32)], mem_len=4)
    with pytest.raises(ValueError, match="attention_mask"):
        model(tokens(1, 4), torch.ones(1, 4), mems=SegmentMemory(4))


# ---- streams, evaluation, generation, training -----------------------------------------------------

def test_stream_batcher_yields_consecutive_segments_per_row():
    streams = batchify(torch.arange(103), 4)  # L = 25, 3 tokens dropped
    assert streams.shape == (4, 25) and streams[:, 0].tolist() == [0, 25, 50, 75]
    pieces = list(segments(streams, 7))
    assert [x.shape[1] for x, _ in pieces] == [7, 7, 7, 3]  # 24 input columns: the last piece is short
    for (x, y), (nx, _) in zip(pieces, pieces[1:]):
        assert torch.equal(nx[:, 0], x[:, -1] + 1)  # row b of step s + 1 continues row b of step s
    for x, y in pieces:
        assert torch.equal(y, x + 1)
    assert torch.equal(torch.cat([x for x, _ in pieces], 1), streams[:, :-1])
    assert len(list(segments(streams, 7, drop_last=True))) == 3


def test_task_batches_are_consecutive_and_reset_at_a_new_epoch():
    task = RecurrenceTask(torch.arange(64), torch.arange(40), batch_size=2, seq_len=10, mem_len=10)
    batches = [task.train_batch(torch.Generator()) for _ in range(4)]  # streams of 32: 3 whole segments
    assert [bool(b["reset"]) for b in batches] == [True, False, False, True]
    assert torch.equal(batches[1]["input_ids"][:, 0], batches[0]["input_ids"][:, -1] + 1)
    assert torch.equal(batches[3]["input_ids"], batches[0]["input_ids"])


def test_stream_loss_with_a_memory_holding_everything_is_the_full_forward():
    model = decoder("rotary", layers=1)
    streams = tokens(2, 21)
    with torch.no_grad():
        logits = model(streams[:, :-1])
    full = F.cross_entropy(logits.transpose(1, 2), streams[:, 1:])
    read = stream_loss(model, streams, 6, mem_len=32)
    assert read["tokens"] == 40
    assert abs(read["loss"] - float(full)) < 1e-5
    alone = stream_loss(model, streams, 6, mem_len=0)
    with torch.no_grad():
        by_segment = sum(F.cross_entropy(model(x).transpose(1, 2), y, reduction="sum")
                         for x, y in segments(streams, 6)) / 40
    assert abs(alone["loss"] - float(by_segment)) < 1e-5
    assert abs(alone["by_position"][0] - read["by_position"][0]) > 1e-4  # only the first segment agrees


def test_generation_with_memory_equals_segment_by_segment_full_forwards():
    model = decoder("rotary", layers=2)
    prompt, T, M, n = tokens(2, 7), 4, 6, 10
    out = generate_with_memory(model, prompt, n, seg_len=T, mem_len=M)
    ref = prompt
    with torch.no_grad():
        for _ in range(n):
            whole, mems = (ref.shape[1] - 1) // T, None  # segments before the one the last token is in
            for s in range(whole):
                _, mems = model.segment(ref[:, s * T:(s + 1) * T], mems, mem_len=M)
            logits, _ = model.segment(ref[:, whole * T:], mems, mem_len=M)
            ref = torch.cat([ref, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ref)


def test_trainer_carries_the_memory_between_steps(tmp_path):
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import Trainer

    model_section = {"arch": "decoder", "vocab_size": V, "d_model": 32, "num_layers": 1, "num_heads": 4, "d_ff": 48,
                     "dropout": 0.0, "norm_placement": "pre", "position": {"scheme": "rotary"}, "memory_len": 8}
    config = TrainConfig.from_dict({
        "model": model_section, "optim": {"lr": 0.01}, "schedule": {"name": "constant", "warmup_steps": 0},
        "train": {"out_dir": str(tmp_path / "run"), "max_steps": 3, "grad_accum": 2, "eval_every": 3,
                  "log_every": 1, "checkpoint_every": 3, "threads": 1, "device": "cpu", "precision": "fp32"}})
    torch.manual_seed(0)
    model = build_model(config.model_config())
    stream = torch.arange(400) % V
    task = RecurrenceTask(stream, stream[:100], batch_size=2, seq_len=8, eval_segments=2)
    seen = []
    loss = task.loss

    def watched(model, batch, **kwargs):  # the memory each micro-batch's loss reads
        seen.append(None if task.mems is None else task.mems[0].shape)
        return loss(model, batch, **kwargs)

    task.loss = watched
    summary = Trainer(config, task=task, model=model, show_progress=False, log=lambda s: None).fit()
    assert summary["steps"] == 3 and task.position == 6 * 8
    assert seen == [None] + [torch.Size([2, 8, 32])] * 5  # every micro-batch after the first reads a memory
    assert torch.isfinite(torch.tensor([summary["val_loss"], summary["val_loss_no_memory"]])).all()
    assert summary["val_loss"] != summary["val_loss_no_memory"]  # validation read the memory, and read without it


def test_a_run_config_with_memory_trains_in_consecutive_segments(tmp_path):
    from attnlab.training.config import TrainConfig
    from attnlab.training.tasks.recurrence import RecurrenceTask
    from attnlab.training.trainer import Trainer
    from tests.training.helpers import tiny_config

    cfg = tiny_config(tmp_path, max_steps=2, eval_every=2, checkpoint_every=2)
    cfg["model"]["memory_len"] = 16
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    assert isinstance(trainer.task, RecurrenceTask)
    summary = trainer.fit()
    assert "val_loss_no_memory" in summary and trainer.task.position == 2 * cfg["data"]["seq_len"]
    cfg["data"]["objective"] = "masked_lm"
    cfg["model"].update(arch="encoder", head="mlm")
    with pytest.raises(ValueError, match="memory_len"):
        Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
