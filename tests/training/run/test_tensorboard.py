"""`train.tensorboard: true`: the event files, read back with TensorBoard's own reader, hold exactly
metrics.jsonl's numbers (also after a resume), the config, and greedy samples equal to what
`generate` gives on the trained model; a run that logs them trains bitwise like one that does not."""

import json
import shutil
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from attnlab.config.validate import ConfigError
from attnlab.decoding import generate
from attnlab.training import TrainConfig, Trainer
from attnlab.io.checkpoints import resolve_checkpoint
from attnlab.training.run.tensorboard import scalar_tag
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _trainer(tmp_path, cfg=None, **train):
    cfg = cfg or tiny_config(tmp_path, **train)
    return Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)


def _events(run):
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _scalars(events) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _texts(events, tag) -> list[tuple[int, str]]:
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()) for e in events.Tensors(tag)]


def _expected_scalars(run) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as the tags it documents: every number of every record at its step."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key != "step" and not isinstance(value, bool):
                expected.setdefault(scalar_tag(key, "val_loss" in record), []).append((record["step"], value))
    return expected


def _assert_same(scalars, expected):
    assert scalars.keys() == expected.keys()
    for tag, points in expected.items():
        assert [s for s, _ in scalars[tag]] == [s for s, _ in points], tag
        # event files store float32
        assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag


def _markdown_rows(table: str) -> list[str]:
    return table.splitlines()[2:]  # after the header and its rule


def _row(*cells: str) -> str:
    """A table row of cells without `|`, `<` or newlines (which the table escapes)."""
    return "| " + " | ".join(cells) + " |"


def test_the_events_hold_the_metrics_the_config_and_samples_and_change_nothing(tmp_path):
    logged = _trainer(tmp_path / "a", max_steps=8, eval_every=4, log_every=2, tensorboard=True)
    logged.fit()
    run = logged.out
    assert scalar_tag("train_loss", False) == "train/loss" and scalar_tag("val_ppl", True) == "valid/ppl"
    events = _events(run)
    scalars = _scalars(events)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "valid/loss", "valid/ppl"} <= set(scalars)
    _assert_same(scalars, _expected_scalars(run))

    (config_step, config_text), = _texts(events, "config/text_summary")
    assert config_step == 0 and json.loads(config_text.strip("`").removeprefix("json")) == logged.config.to_dict()

    samples = _texts(events, "samples/text_summary")
    assert [step for step, _ in samples] == [4, 8]
    rows = _markdown_rows(samples[-1][1])
    assert len(rows) == 3
    tok, model = logged.pipeline.tokenizer, logged.model.eval()  # the model the last evaluation sampled
    valid_text = (tmp_path / "a" / "valid.txt").read_text()
    prompt = torch.tensor([tok.encode(valid_text[:16])])
    continuation = tok.decode(generate(model, prompt, 16, eos_token_id=tok.eos_token_id)[0, 16:].tolist())
    assert rows[0] == _row(valid_text[:16], continuation)

    plain = _trainer(tmp_path / "b", max_steps=8, eval_every=4, log_every=2)
    plain.fit()  # greedy samples draw no random number: the same dropout masks, the same weights
    for (name, a), b in zip(logged.model.state_dict().items(), plain.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert not (plain.out / "tensorboard").exists()


def test_a_resumed_run_shows_each_step_once_with_the_resumed_values(tmp_path):
    first = _trainer(tmp_path, max_steps=8, checkpoint_every=3, eval_every=4, tensorboard=True)
    first.fit()  # then "crashed" after step 8; the resume goes on from step 6
    resumed = _trainer(tmp_path, max_steps=8, checkpoint_every=3, eval_every=4, tensorboard=True)
    resumed.resume(resolve_checkpoint(first.checkpoint_dir / "step-00000006"))
    resumed.fit()
    scalars = _scalars(_events(first.out))
    assert [step for step, _ in scalars["train/loss"]] == list(range(1, 9))
    _assert_same(scalars, _expected_scalars(first.out))  # metrics.jsonl: steps 7 and 8 of the resumed run


def test_a_fresh_run_in_the_folder_starts_a_fresh_log(tmp_path):
    _trainer(tmp_path, max_steps=4, checkpoint_every=100, tensorboard=True).fit()
    trainer = _trainer(tmp_path, max_steps=3, checkpoint_every=100, tensorboard=True)
    shutil.rmtree(trainer.checkpoint_dir)  # a folder whose checkpoints were cleared away: a fresh run may start
    trainer.fit()
    scalars = _scalars(_events(trainer.out))
    assert [step for step, _ in scalars["train/loss"]] == [1, 2, 3]


def test_translation_samples_show_source_greedy_translation_and_reference(tmp_path):
    pairs = [(f"the {w} is here .", f"der {w} ist hier .") for w in ("king", "queen", "lord", "sword", "crown")]
    (tmp_path / "p.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs * 20))
    cfg = tiny_config(tmp_path, max_steps=3, eval_every=3, bleu_samples=0, tensorboard=True)
    cfg["data"].update(objective="seq2seq", source=str(tmp_path / "p.tsv"), valid=str(tmp_path / "p.tsv"))
    cfg["model"] = {"preset": "tiny-encoder-decoder", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64}
    trainer = _trainer(tmp_path, cfg)
    trainer.fit()
    (_, table), = _texts(_events(trainer.out), "samples/text_summary")
    rows = _markdown_rows(table)
    assert [(row.split(" | ")[0], row.split(" | ")[-1]) for row in rows] == [(f"| {s}", f"{t} |") for s, t in pairs[:3]]
    tok, model = trainer.pipeline.tokenizer, trainer.model.eval()
    src = torch.tensor([tok.encode(pairs[0][0]) + [tok.eos_token_id]])  # as the pipeline's sources
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id
    new = min(trainer.config.data.max_pair_len + 1, model.config.position.max_len - 1)
    out = generate(model, src, new, decoder_start_token_id=bos, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)[0, 1:].tolist()
    out = out[: out.index(tok.eos_token_id)] if tok.eos_token_id in out else out
    assert rows[0] == _row(pairs[0][0], tok.decode(out, skip_special_tokens=True), pairs[0][1])


def test_without_the_package_the_option_is_a_one_line_error_and_runs_without_it_are_untouched(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: find_spec None, import fails
    with pytest.raises(ConfigError, match=r"^train\.tensorboard: .*pip install 'attnlab\[tensorboard\]'$"):
        _trainer(tmp_path / "a", tensorboard=True)
    assert not (tmp_path / "a" / "run").exists()  # refused before any data was prepared
    summary = _trainer(tmp_path / "b", max_steps=3).fit()  # tensorboard false: nothing imports it
    assert summary["steps"] == 3


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_value_names_the_field(tmp_path, value):
    with pytest.raises(ValueError, match="train.tensorboard: expected true or false"):
        TrainConfig.from_dict(tiny_config(tmp_path, tensorboard=value))
