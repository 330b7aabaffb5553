"""The Trainer on a tensor x pipeline x data mesh (attnlab.parallel.mesh), as `attnlab train --nproc N`
runs it with a `parallel` section: the losses, gradient norms and validation losses of every step
equal a one-process run of the same config; the checkpoints (gathered on rank 0) resume in one
process, and a one-process checkpoint resumes on tp 2, each continuing equal; a rank that dies
mid-step stops the other with a clear error and leaves no half-written checkpoint. The default
suite trains the 2-process layouts once (a module fixture, ~13 s) and a seq2seq encoder-decoder
on pp 2 (~10 s); the failures, the 4-process layouts (tp 2 x dp 2, pp 2 x dp 2, seq2seq on tp 2 x
pp 2 and pp 2 x dp 2), the command line under torchrun and the other objectives are slow on a
2-core machine: `make test-slow`."""

import copy
import json
import time

import pytest
import torch
from safetensors.torch import load_file

from attnlab.parallel import WorkerError, spawn
from attnlab.training import TrainConfig, Trainer
from attnlab.io.checkpoints import checkpoint_name, read_index
from tests.parallel.mesh_workers import LAYOUTS, die_mid_step, fit_on_rank, layout_config, mesh_suite
from tests.parallel.workers import mesh_suite as ddp_mesh_suite
from tests.training.helpers import tiny_config

STEPS = 4
SEQ2SEQ_PP2 = {"pp": 2, "micro_batches": 2, "schedule": "1f1b"}


def _base(folder, **train) -> dict:
    """A 2-layer decoder whose heads, d_ff and vocabulary (26 characters) split over 2 ranks; clipping
    and label smoothing on, so the global gradient norm and the smoothed vocabulary-parallel loss count."""
    cfg = tiny_config(folder, **{"max_steps": STEPS, "eval_every": 2, "checkpoint_every": 2, "grad_accum": 2, **train})
    cfg["model"].update(dropout=0.0, num_layers=2)  # ranks draw dropout masks from their own generators
    cfg["optim"].update(grad_clip=1.0, label_smoothing=0.1)
    return cfg


def _fit(config: dict, resume_from=None) -> Trainer:
    trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False)
    if resume_from is not None:
        assert trainer.resume(resume_from)
    trainer.fit()
    return trainer


def _records(out) -> dict[tuple[int, str], float]:
    """(step, metric) -> value of a run's metrics.jsonl (losses, gradient norm, validation)."""
    out_records = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key in ("train_loss", "grad_norm", "val_loss", "val_mlm_accuracy"):
            if key in record:
                out_records[(record["step"], key)] = record[key]
    return out_records


def _assert_same_run(out, reference, atol=1e-5, weights_atol=1e-4):
    """The same metrics at every step (within atol) and the same final weights: within
    weights_atol, as Adam divides each gradient by its own RMS, so a rounding-level difference in
    an almost-zero gradient moves that weight more than it moves any loss."""
    got, want = _records(out), _records(reference)
    first = min(step for step, _ in got)  # a resumed run logs from the step after its checkpoint
    assert set(got) == {key for key in want if key[0] >= first}, (sorted(got), sorted(want))
    for key, value in got.items():
        assert value == pytest.approx(want[key], abs=atol), f"{out.name} {key}: {value} vs {want[key]}"
    final = checkpoint_name(STEPS)
    weights = load_file(str(out / "checkpoints" / final / "model.safetensors"))
    for name, t in load_file(str(reference / "checkpoints" / final / "model.safetensors")).items():
        torch.testing.assert_close(weights[name], t, atol=weights_atol, rtol=0, msg=lambda m: f"{out.name} {name}: {m}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mesh")
    base = _base(folder / "data")
    _fit(layout_config(base, str(folder / "one"), {}))
    results = spawn(mesh_suite, 2, args=(base, str(folder), str(folder / "one" / "checkpoints" / checkpoint_name(2))),
                    timeout_s=150, collective_timeout_s=60)
    return folder, base, results


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_step_equals_one_process(runs, layout):
    folder, _, results = runs
    for rank, report in enumerate(results):
        assert report[layout] == "ok", f"rank {rank}: {report[layout]}"
    _assert_same_run(folder / layout, folder / "one")
    lines = (folder / layout / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len((folder / "one" / "metrics.jsonl").read_text().splitlines())  # written once


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_checkpoint_resumes_in_one_process_and_continues_equal(runs, layout, tmp_path):
    folder, base, _ = runs
    resumed = tmp_path / f"{layout}-in-one"
    _fit(layout_config(base, str(resumed), {}), resume_from=folder / layout / "checkpoints" / checkpoint_name(2))
    _assert_same_run(resumed, folder / "one")


def _seq2seq_base(folder) -> dict:
    """`_base` as a seq2seq encoder-decoder (2 + 2 layers, padding masks, cross-attention) on
    sentence pairs of 1 to 5 words: the widths of its batches change from one batch to the next."""
    from tests.training.helpers import WORDS

    pairs = [(" ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 5)),
              " ".join(WORDS[(3 * i + k) % len(WORDS)] for k in range(1 + (i * 7) % 5))) for i in range(40)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    base = _base(folder / "data", bleu_samples=0)  # BLEU is not computed on a split model
    base["data"].update(objective="seq2seq", source=str(folder / "pairs.tsv"), valid=str(folder / "pairs.tsv"),
                        max_pair_len=40)
    base["model"].update(preset="tiny-encoder-decoder", d_model=32, num_heads=2, d_ff=64)
    return base


@pytest.fixture(scope="module")
def seq2seq_runs(tmp_path_factory):
    """A seq2seq run in one process and on pp 2 (2 micro-batches, 1F1B)."""
    folder = tmp_path_factory.mktemp("seq2seq")
    base = _seq2seq_base(folder)
    _fit(layout_config(base, str(folder / "one"), {}))
    spawn(fit_on_rank, 2, args=(layout_config(base, str(folder / "pp2"), SEQ2SEQ_PP2),), timeout_s=150,
          collective_timeout_s=60)
    return folder, base


def test_seq2seq_on_a_pipeline_equals_one_process(seq2seq_runs):
    """The encoder's layers on stage 0, the decoder's on stage 1 (the memory and the source mask
    carried to it); padded batches of changing widths: every step equals one process, and so does
    its checkpoint resumed in one process."""
    folder, base = seq2seq_runs
    _assert_same_run(folder / "pp2", folder / "one")
    resumed = folder / "pp2-in-one"
    _fit(layout_config(base, str(resumed), {}), resume_from=folder / "pp2" / "checkpoints" / checkpoint_name(2))
    _assert_same_run(resumed, folder / "one")


def test_one_process_checkpoint_resumes_on_tp_2_and_continues_equal(runs):
    folder, _, results = runs
    assert all(report["tp2-resumed"] == "ok" for report in results), results
    _assert_same_run(folder / "tp2-resumed", folder / "one")


def test_one_process_checkpoint_resumes_on_pp_2_and_continues_equal(runs):
    """Each stage reads its own tensors of the one-process checkpoint (weights, Adam moments)."""
    folder, _, results = runs
    assert all(report["pp2-resumed"] == "ok" for report in results), results
    _assert_same_run(folder / "pp2-resumed", folder / "one")


def test_a_pipeline_rank_holds_its_stage_alone(runs):
    """On pp 2 each rank's model holds the parameters of its stage (the plan's count) and the
    optimizer their two moments; the other stage's parameters hold no data (the meta device)."""
    from attnlab import ModelConfig
    from attnlab.parallel import plan_layout

    _, _, results = runs
    plan = plan_layout(ModelConfig.from_dict(results[0]["pp2-held"]["model"]), nproc=2, pp=2)
    for rank, report in enumerate(results):
        held = report["pp2-held"]
        assert held["params"] == plan["stages"][rank]["params_per_rank"] < plan["params_total"], (rank, held)
        assert held["moments"] == 2 * held["params"]
        assert held["params"] + held["meta"] == held["whole"] == plan["params_total"]


def test_a_pipeline_checkpoint_has_the_files_of_a_one_process_checkpoint(runs):
    """The stages stream their tensors to rank 0: the same names, shapes and dtypes in both files,
    the same optimizer groups and hyper-parameters in state.json as a one-process run writes."""
    folder, _, _ = runs
    got, want = (folder / name / "checkpoints" / checkpoint_name(STEPS) for name in ("pp2", "one"))
    for file in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(got / file)), load_file(str(want / file))
        assert {k: (v.shape, v.dtype) for k, v in a.items()} == {k: (v.shape, v.dtype) for k, v in b.items()}, file
    a, b = (json.loads((path / "state.json").read_text()) for path in (got, want))
    assert a["optimizer"] == b["optimizer"]
    assert a["step"] == b["step"] and a["schedule"] == b["schedule"]


@pytest.mark.slow
def test_a_rank_dying_mid_step_stops_the_other_in_time_and_leaves_whole_checkpoints(tmp_path):
    config = layout_config(_base(tmp_path / "data", checkpoint_every=1), str(tmp_path / "run"), LAYOUTS["pp2"])
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(die_mid_step, 2, args=(config, 1, 3), timeout_s=90, collective_timeout_s=10)
    reports = info.value.reports
    assert "exit code 3" in reports[1]
    assert "CollectiveError" in reports[0] and "another rank probably died" in reports[0], reports[0]
    assert "killed" not in reports[0]  # it stopped by itself, not by the deadline
    assert time.monotonic() - start < 60
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not list((tmp_path / "run").rglob(".tmp-*"))  # nothing half-written
    assert read_index(checkpoints)["latest"] == checkpoint_name(2)
    resumed = Trainer(TrainConfig.from_dict(layout_config(config, str(tmp_path / "run"), {})), log=lambda text: None,
                      show_progress=False)
    assert resumed.resume() and resumed.step == 2  # the last checkpoint is whole (sha256 checked on load)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [{"tp": 2}, {"pp": 2, "micro_batches": 2}], ids=["tp2_dp2", "pp2_dp2"])
def test_four_processes_with_data_parallel_equal_one_process(tmp_path, parallel):
    """tp 2 x dp 2 and pp 2 x dp 2 take the batches of one process with twice the accumulation."""
    base = _base(tmp_path / "data")
    one = copy.deepcopy(base)
    one["train"]["grad_accum"] *= 2
    _fit(layout_config(one, str(tmp_path / "one"), {}))
    spawn(fit_on_rank, 4, args=(layout_config(base, str(tmp_path / "four"), parallel),), timeout_s=400,
          collective_timeout_s=120)
    _assert_same_run(tmp_path / "four", tmp_path / "one")
    resumed = tmp_path / "four-in-one"
    _fit(layout_config(one, str(resumed), {}), resume_from=tmp_path / "four" / "checkpoints" / checkpoint_name(2))
    _assert_same_run(resumed, tmp_path / "one")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [{"tp": 2, "pp": 2, "micro_batches": 2}, {"pp": 2, "micro_batches": 4}],
                         ids=["tp2_pp2", "pp2_dp2"])
def test_seq2seq_on_four_processes_equals_one_process(tmp_path, parallel):
    """The encoder-decoder pipeline with each stage split over tp 2 (the vocabulary-parallel loss on
    the last), or two pipelines over dp 2 (the batches of one process with twice the accumulation)."""
    base = _seq2seq_base(tmp_path)
    one = copy.deepcopy(base)
    one["train"]["grad_accum"] *= 2 if "tp" not in parallel else 1
    _fit(layout_config(one, str(tmp_path / "one"), {}))
    spawn(fit_on_rank, 4, args=(layout_config(base, str(tmp_path / "four"), parallel),), timeout_s=400,
          collective_timeout_s=120)
    _assert_same_run(tmp_path / "four", tmp_path / "one")


@pytest.mark.slow
def test_tensor_parallel_under_ddp_matches_one_process():
    results = spawn(ddp_mesh_suite, 4, args=(2,), tp=2, timeout_s=240, collective_timeout_s=120)
    for rank, checks in enumerate(results):
        assert checks["mesh"] == "ok", f"rank {rank}: {checks['mesh']}"


@pytest.mark.slow
def test_attnlab_train_on_a_pipeline_then_resumed_in_one_process_equals_one_process(tmp_path, capsys):
    """`attnlab train CONFIG --nproc 2` (torchrun, pp 2) to step 2, then `attnlab train --resume RUN
    --parallel.pp 1` to step 4 in this process: the run folder holds the one-process run's steps.
    (Steps 1-2 are the warm-up, whose learning rate does not depend on train.max_steps.)"""
    from attnlab.cli.main import main

    base = _base(tmp_path / "data")
    _fit(layout_config(base, str(tmp_path / "one"), {}))
    cfg = layout_config(base, str(tmp_path / "run"), {"pp": 2, "micro_batches": 2})
    cfg["train"]["max_steps"] = 2
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    assert main(["train", str(tmp_path / "run.json"), "--nproc", "2"]) == 0
    assert "torch.distributed.run" in capsys.readouterr().out
    assert main(["train", "--resume", str(tmp_path / "run"), "--parallel.pp", "1", "--train.max_steps", "4"]) == 0
    _assert_same_run(tmp_path / "run", tmp_path / "one")


@pytest.mark.slow
def test_the_writer_dying_mid_step_stops_the_other_with_a_clear_error(tmp_path):
    """Rank 0 (which writes) dies in the forward pass of a tensor-parallel step: rank 1 names the problem."""
    config = layout_config(_base(tmp_path / "data", checkpoint_every=1), str(tmp_path / "run"), LAYOUTS["tp2"])
    with pytest.raises(WorkerError) as info:
        spawn(die_mid_step, 2, args=(config, 0, 3), timeout_s=90, collective_timeout_s=10)
    reports = info.value.reports
    assert "exit code 3" in reports[0]
    assert "CollectiveError: rank 1 of 2 (tp 1, pp 0, dp 0): a training step failed" in reports[1], reports[1]
    assert not list((tmp_path / "run").rglob(".tmp-*"))
    assert read_index(tmp_path / "run" / "checkpoints")["latest"] == checkpoint_name(2)


@pytest.mark.slow
def test_other_objectives_on_each_axis_equal_one_process(tmp_path):
    """A masked-LM encoder on pp 2 and tp 2 (its accuracy too), a prefix LM (prefix masks) on pp 2
    and tp 2, a causal LM packed one document per row (padding masks) and with document masks on
    pp 2 (GPipe), and a seq2seq encoder-decoder (padding masks, cross-attention) on tp 2."""
    pairs = [(f"the {w} is here .", f"der {w} ist hier .") for w in ("king", "queen", "lord", "sword", "crown")] * 8
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    runs = {
        "mlm-pp2": ({"objective": "masked_lm"}, {}, {"pp": 2, "micro_batches": 2}),
        "mlm-tp2": ({"objective": "masked_lm"}, {}, {"tp": 2}),
        "prefix-tp2": ({"objective": "prefix_lm"}, {}, {"tp": 2}),
        "prefix-pp2": ({"objective": "prefix_lm"}, {}, {"pp": 2, "micro_batches": 2, "schedule": "1f1b"}),
        "pad-pp2": ({"pack": "pad"}, {}, {"pp": 2, "micro_batches": 4}),
        "documents-pp2": ({"pack": "document_masked"}, {}, {"pp": 2, "micro_batches": 2}),
        "seq2seq-tp2": ({"objective": "seq2seq", "source": str(tmp_path / "pairs.tsv"),
                         "valid": str(tmp_path / "pairs.tsv"), "max_pair_len": 12},
                        {"preset": "tiny-encoder-decoder", "d_model": 32, "num_heads": 2, "d_ff": 64}, {"tp": 2}),
    }
    configs = []
    for name, (data, model, parallel) in runs.items():
        base = _base(tmp_path / "data", bleu_samples=0)
        base["data"].update(data)
        base["model"].update(model)
        _fit(layout_config(base, str(tmp_path / name / "one"), {}))
        configs.append(layout_config(base, str(tmp_path / name / "two"), parallel))
    spawn(fit_on_rank, 2, args=tuple(configs), timeout_s=400, collective_timeout_s=120)
    for name in runs:
        _assert_same_run(tmp_path / name / "two", tmp_path / name / "one")
    assert "val_mlm_accuracy" in (tmp_path / "mlm-pp2" / "two" / "metrics.jsonl").read_text()
