"""A pipeline rank's own stage (attnlab.parallel.materialise, stage_checkpoint): built alone it
equals the whole model's stage bit for bit and leaves the generator where the whole build leaves
it, every other parameter on the meta device; read from a weights file, only its tensors are read;
its memory is checked before it is made; the streamed safetensors files read back in safetensors'
own reader."""

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.config.validate import ConfigError
from attnlab.models import build_model
from attnlab.parallel.materialise import build_stage, has_meta, materialise_stage, stage_estimate, to_device
from attnlab.parallel.stage_checkpoint import DTYPES, _stream_safetensors
from attnlab.parallel.stages import StageModule
from attnlab.training.setup.free_memory import Available
from attnlab.training.setup.memory import check_stage_memory
from attnlab.training.setup.start import StageSource

CONFIGS = {
    "decoder_tied_rotary": ("tiny-decoder", {"num_layers": 3}),
    "decoder_t5_bias_swiglu": ("tiny-decoder", {"num_layers": 3, "position": {"scheme": "t5_bias"},
                                                "activation": "swiglu"}),
    "encoder_mlm_learned": ("tiny-encoder", {"num_layers": 3, "head": "mlm", "position": {"scheme": "learned"}}),
    "encoder_linformer": ("tiny-encoder", {"num_layers": 3, "attention": {"kernel": "linformer",
                                                                          "kernel_options": {"k": 8, "max_len": 64}}}),
    "encoder_decoder_shared": ("tiny-encoder-decoder", {}),
}


def _config(name):
    preset, overrides = CONFIGS[name]
    return attnlab.ModelConfig.from_dict({**attnlab.presets.get(preset).to_dict(), **overrides})


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("num_stages", [2, 3])
def test_a_stage_built_alone_equals_the_whole_models_stage_bit_for_bit(name, num_stages):
    config = _config(name)
    torch.manual_seed(7)
    whole = dict(build_model(config).named_parameters(remove_duplicate=False))
    after_whole = torch.get_rng_state()
    for index in range(num_stages):
        torch.manual_seed(7)
        model = build_stage(config, index, num_stages)
        assert torch.equal(torch.get_rng_state(), after_whole)  # later draws (dropout) as in a whole build
        held = {id(p) for p in StageModule(model, index, num_stages).parameters()}
        assert held
        for key, p in model.named_parameters(remove_duplicate=False):
            if id(p) in held:
                assert not p.is_meta and torch.equal(p, whole[key]), f"stage {index}: {key}"
            else:
                assert p.is_meta, f"stage {index} holds {key}, another stage's"


def test_a_stage_read_from_a_weights_file_reads_its_own_tensors_only(tmp_path, monkeypatch):
    import attnlab.io.weights as weights

    config = _config("decoder_tied_rotary")
    torch.manual_seed(0)
    whole = build_model(config)
    attnlab.save(whole, tmp_path / "model")
    read = []
    real = weights.read_safetensors

    def spy(path, names=None):
        read.append(None if names is None else sorted(names))
        return real(path, names)

    monkeypatch.setattr(weights, "read_safetensors", spy)
    for index in range(2):
        with torch.device("meta"):
            model = build_model(config)
        materialise_stage(model, index, 2, StageSource(weights=tmp_path / "model" / "model.safetensors"), "cpu")
        stage = StageModule(model, index, 2)
        held = {id(p) for p in stage.parameters()}
        first_names = {}
        for key, p in whole.named_parameters(remove_duplicate=False):
            first_names.setdefault(id(p), key)
        want = sorted({first_names[id(dict(whole.named_parameters(remove_duplicate=False))[k])]
                       for k, _ in stage.named_parameters(remove_duplicate=False)})
        assert read[-1] == want  # by name: the stage's tensors, a tied one under its stored name
        for key, p in model.named_parameters(remove_duplicate=False):
            assert p.is_meta != (id(p) in held)
            if id(p) in held:
                assert torch.equal(p, dict(whole.named_parameters(remove_duplicate=False))[key])
        out = stage(torch.randint(0, config.vocab_size, (2, 5))) if index == 0 else None
        assert out is None or out.shape == (2, 5, config.d_model)


def test_to_device_moves_what_holds_data_and_leaves_the_meta_parameters():
    config = _config("decoder_tied_rotary")
    model = build_stage(config, 1, 2)
    assert has_meta(model)
    moved = to_device(model, "cpu")
    assert moved is model and has_meta(model)
    assert not has_meta(StageModule(model, 1, 2))


def test_stage_source_takes_exactly_one_origin():
    with pytest.raises(ValueError, match="exactly one of rng_state and weights"):
        StageSource()
    with pytest.raises(ValueError, match="exactly one of rng_state and weights"):
        StageSource(rng_state=torch.get_rng_state(), weights="x")


def _rank(pp_rank, pp=2):
    return SimpleNamespace(pp_rank=pp_rank, pp_size=pp, tp_size=1, dp_size=1, world_size=pp)


def _run_config(micro_batches=2):
    from attnlab.training import TrainConfig

    return TrainConfig.from_dict({"data": {"batch_size": 4, "seq_len": 32},
                                  "parallel": {"pp": 2, "micro_batches": micro_batches}})


def test_the_memory_check_counts_the_stage_and_refuses_it_by_name():
    config = _config("decoder_tied_rotary")
    with torch.device("meta"):
        model = build_model(config)
    whole = sum(p.numel() for p in model.parameters())
    for index in range(2):
        estimate = stage_estimate(model, _rank(index), _run_config())
        mine = sum(p.numel() for p in {id(p): p for p in StageModule(model, index, 2).parameters()}.values())
        assert estimate.weights == 4 * mine < 4 * whole and estimate.optimizer == 8 * mine
        assert estimate.per_row > 0  # the micro-batches' activations
        assert check_stage_memory(estimate, torch.device("cpu"), stage="stage",
                                  available=Available(estimate.total, "test")) is estimate
        with pytest.raises(ConfigError, match=r"parallel\.pp: pipeline stage 1 of 2 needs about .* but .* is "
                                              r"available \(the test figure\)"):
            check_stage_memory(estimate, torch.device("cpu"), stage="pipeline stage 1 of 2",
                               available=Available(estimate.total - 1, "the test figure"))


def test_streamed_safetensors_read_back_in_safetensors_own_reader(tmp_path):
    tensors = {"b.weight": torch.randn(3, 5), "a.half": torch.randn(4).to(torch.bfloat16),
               "step": torch.tensor(7.0), "ids": torch.arange(6).reshape(2, 3), "empty": torch.zeros(0, 2),
               "mask": torch.tensor([True, False])}
    specs = [(n, tuple(t.shape), DTYPES[t.dtype]) for n, t in sorted(tensors.items())]
    asked = []
    _stream_safetensors(tmp_path / "x.safetensors", specs, lambda n: asked.append(n) or tensors[n], {"format": "pt"})
    assert asked == [n for n, _, _ in specs]  # each asked for once, in order, when written
    back = load_file(str(tmp_path / "x.safetensors"))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    with pytest.raises(RuntimeError, match="announced"):
        _stream_safetensors(tmp_path / "y.safetensors", [("w", (2,), "F32")], lambda n: torch.zeros(3))


def test_init_from_under_pp_builds_on_meta_and_each_stage_reads_the_runs_best_weights(tmp_path):
    """`pretrain_setup` of a pp 2 run with model.init_from = an `attnlab train` run folder: the model
    on the meta device, its stage_source the best checkpoint's weights file, the run's tokenizer;
    each stage made from it holds the run's trained weights."""
    from tests.training.helpers import tiny_config
    from attnlab.training import TrainConfig, Trainer
    from attnlab.training.setup.start import pretrain_setup

    first = tiny_config(tmp_path / "data", max_steps=2, eval_every=2, checkpoint_every=2)
    first["model"]["num_layers"] = 2
    first["schedule"]["warmup_steps"] = 1
    Trainer(TrainConfig.from_dict(first), log=lambda text: None, show_progress=False).fit()
    run = tmp_path / "data" / "run"
    trained = attnlab.load(run)
    second = tiny_config(tmp_path / "data2")
    second["model"] = {"init_from": str(run)}
    second["parallel"] = {"pp": 2}
    logged = []
    task, model = pretrain_setup(TrainConfig.from_dict(second), tmp_path / "out", show_progress=False,
                                 log=logged.append)
    assert all(p.is_meta for p in model.parameters())
    assert model.stage_source.weights.name == "model.safetensors" and model.stage_source.rng_state is None
    assert model.stage_source.weights.parent.parent.parent == run  # RUN/checkpoints/step-N/
    assert task.pipeline.tokenizer.vocab_size == trained.config.vocab_size
    assert "each pipeline stage reads its own tensors" in logged[0]
    whole = dict(trained.named_parameters(remove_duplicate=False))
    for index in range(2):
        with torch.device("meta"):
            stage_model = build_model(model.config)
        materialise_stage(stage_model, index, 2, model.stage_source, "cpu")
        held = {id(p) for p in StageModule(stage_model, index, 2).parameters()}
        for key, p in stage_model.named_parameters(remove_duplicate=False):
            assert (id(p) in held) != p.is_meta
            if id(p) in held:
                assert torch.equal(p, whole[key]), key


def test_a_model_given_whole_lets_the_other_stages_go():
    from attnlab.parallel.materialise import release_other_stages

    model = build_model(_config("decoder_tied_rotary"))
    stage = StageModule(model, 1, 2)
    before = {name: p.detach().clone() for name, p in stage.named_parameters(remove_duplicate=False)}
    release_other_stages(model, stage)
    held = {id(p) for p in stage.parameters()}
    assert all((id(p) in held) != p.is_meta for p in model.parameters())
    assert model.head.proj.weight is model.embed.token.weight  # the tie kept, on the stage that holds the head
    for name, p in stage.named_parameters(remove_duplicate=False):
        assert torch.equal(p, before[name]), name
