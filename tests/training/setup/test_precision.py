"""`precision: auto`: one decision (attnlab.training.setup.precision.resolve_precision) for every run.

The machine's bf16 capability is mocked (`native_bf16`), so each case runs the same on a CPU with
and without AVX512_BF16/AMX; the properties checked are what a run then computes in (the dtype
its layers see), what it records, and when it warns.
"""

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.finetune import Example, Finetuner, Recipe, with_head
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup import precision
from attnlab.training.config import RunConfig
from attnlab.training.setup.precision import PRECISIONS, native_bf16, resolve_precision
from attnlab.training.tasks.batch_loss import autocast
from tests.finetune.helpers import char_tokenizer, tiny
from tests.training.setup.conftest import no_warnings
from tests.training.helpers import tiny_config

CPU = torch.device("cpu")
EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"

pytestmark = pytest.mark.usefixtures("isolated_cache")


@pytest.fixture(params=[False, True], ids=["no-native-bf16", "native-bf16"])
def native(request, monkeypatch):
    """A machine without, then with, native bf16: the one capability probe, replaced."""
    monkeypatch.setattr(precision, "native_bf16", lambda device: request.param)
    return request.param


def _dtypes_seen(model: torch.nn.Module) -> list[torch.dtype]:
    """The output dtypes of every Linear of `model` from now on (autocast shows up there)."""
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    return seen


def _one_step_config(tmp_path, device, **train) -> dict:
    """A tiny run (one step, evaluated) on `device` whose `train` section names no precision unless given."""
    cfg = tiny_config(tmp_path, **{"max_steps": 1, "eval_every": 1, "checkpoint_every": 1, "device": device.type,
                                   **train})
    if "precision" not in train:
        del cfg["train"]["precision"]  # the helper pins fp32 for other tests
    cfg["schedule"]["warmup_steps"] = 0
    return cfg


# ---------------------------------------------------------------- the decision
def test_auto_is_the_default_and_a_known_precision():
    assert RunConfig().precision == Recipe().precision == "auto"
    assert set(PRECISIONS) == {"auto", "fp32", "bf16", "fp16"}


def test_auto_is_bf16_exactly_where_bf16_is_native(native):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto never warns
        assert resolve_precision("auto", CPU) == ("bf16" if native else "fp32")


def test_fp32_stays_fp32_silently(native):
    with no_warnings():
        assert resolve_precision("fp32", CPU) == "fp32"


def test_forced_bf16_is_kept_and_warns_only_where_emulated(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    with pytest.warns(UserWarning, match=r"bf16 on a cpu without native bf16.*10x slower.*auto.*fp32"):
        assert resolve_precision("bf16", CPU) == "bf16"
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    with no_warnings():
        assert resolve_precision("bf16", CPU) == "bf16"
        assert resolve_precision("bf16", CPU, warn=False) == "bf16"


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="auto, fp32, bf16, fp16.*'fp8'"):
        resolve_precision("fp8", CPU)


@pytest.mark.parametrize("features, expected", [
    ({"architecture": "x86_64", "avx2": True, "avx512_f": False}, False),        # AVX2 EPYC: bf16 emulated
    ({"architecture": "x86_64", "avx512_f": True, "avx512_bf16": False}, False),  # AVX512 without BF16
    ({"architecture": "x86_64", "avx512_f": True, "avx512_bf16": True}, True),
    ({"architecture": "x86_64", "amx_tile": True, "amx_bf16": True}, True),
    ({"architecture": "arm64", "neon": True, "bf16": True}, True),
    ({"architecture": "arm64", "neon": True}, False),
])
def test_a_cpu_is_native_by_its_bf16_instructions(cpu_features, features, expected):
    cpu_features(features)
    assert native_bf16(CPU) is expected


@pytest.mark.parametrize("capability, expected", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_a_gpu_is_native_from_ampere_on(cuda_capability, capability, expected):
    # a T4 (7.5) makes bf16 tensors, emulated, without bf16 tensor cores; an A100 (8.0) and H100 (9.0) have them
    cuda_capability(capability)
    assert native_bf16(torch.device("cuda")) is expected


def test_no_gpu_and_other_devices_are_not_native(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert native_bf16(torch.device("cuda")) is False
    assert native_bf16(torch.device("meta")) is False


def test_autocast_follows_the_resolved_precision(native, device):
    layer = torch.nn.Linear(4, 4).to(device)
    x = torch.randn(2, 4).to(device)
    for name, want in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                       ("auto", torch.bfloat16 if native else torch.float32)):
        with autocast(name, device):
            assert layer(x).dtype == want, name


# ---------------------------------------------------------------- runs resolve it once
def test_a_default_run_computes_records_and_prints_the_mocked_choice(tmp_path, native, device):
    lines = []
    cfg = _one_step_config(tmp_path, device)
    assert "precision" not in cfg["train"]  # RunConfig's default decides
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lines.append)
    want = "bf16" if native else "fp32"
    assert trainer.config.train.precision == "auto" and trainer.precision == want
    seen = _dtypes_seen(trainer.model)
    trainer.fit()
    assert set(seen) == {torch.bfloat16 if native else torch.float32}  # training steps and evaluation
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    saved = json.loads((trainer.out / "config.json").read_text())
    assert saved["precision"] == want and saved["config"]["train"]["precision"] == "auto"
    assert sum(f"| precision: {want} (auto on {device.type}) |" in line for line in lines) == 1  # in the one setup line


def test_forced_bf16_without_native_warns_once_per_run(tmp_path, monkeypatch, device):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning counted, not only the first per line
        cfg = _one_step_config(tmp_path, device, precision="bf16", max_steps=2)
        trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
        seen = _dtypes_seen(trainer.model)
        trainer.fit()
    ours = [w for w in caught if "without native bf16" in str(w.message)]
    assert len(ours) == 1 and trainer.precision == "bf16" and set(seen) == {torch.bfloat16}


def test_a_fine_tuning_run_resolves_the_recipe_default_and_predicts_with_it(native):
    model = with_head(tiny("encoder", num_layers=1), "classification", 2, seed=0)
    examples = [Example("the cat"), Example("a dog")]
    run = Finetuner(model, char_tokenizer(), examples, [0, 1], Recipe(max_steps=1), seed=0)
    assert run.precision == run.trainer.precision == ("bf16" if native else "fp32")
    seen = _dtypes_seen(run.model)
    assert run.predict(examples).dtype == torch.float32
    assert set(seen) == {torch.bfloat16 if native else torch.float32}


# ---------------------------------------------------------------- recipes
def _precisions(value) -> list:
    """Every value of a `precision` key anywhere in a parsed recipe."""
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "precision"] + [p for v in value.values() for p in _precisions(v)]
    if isinstance(value, list):
        return [p for v in value for p in _precisions(v)]
    return []


def test_every_recipe_leaves_precision_to_the_machine():
    from attnlab.cli.demo import demo_config

    paths = sorted(p for ext in ("json", "yaml", "yml") for p in EXAMPLES_DIR.rglob(f"*.{ext}")
                   if not p.name.startswith("results"))  # a study's measured results record the precision it ran in
    parse = lambda p: json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    found = {str(p.relative_to(EXAMPLES_DIR)): _precisions(parse(p)) for p in paths}
    assert found["shakespeare_char.json"] == ["auto"]  # the demo's recipe: the walk does reach recipes
    # a study's recipe may pin fp32: its numbers are compared across machines (and bf16 is emulated
    # at a tenth of the speed on CPUs without it); every other recipe leaves it to the machine
    recipes = {name: values for name, values in found.items() if not name.startswith("studies/")}
    studies = {name: values for name, values in found.items() if name.startswith("studies/")}
    assert {p for values in recipes.values() for p in values} == {"auto"}, recipes
    assert {p for values in studies.values() for p in values} <= {"auto", "fp32"}, studies
    assert demo_config(10)["train"]["precision"] == "auto"
