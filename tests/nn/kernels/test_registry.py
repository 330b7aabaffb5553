"""The kernel seam: one registry, names that agree with the config, and a kernel added in one place."""

import dataclasses
import inspect
import pathlib
import re
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

import attnlab
from attnlab import ModelConfig, build_model
from attnlab.nn.kernels import KERNELS, Kernel, Supports, eager_attention
from attnlab.nn.kernels.base import repeat_kv
from tests.models.helpers import assert_cached_steps_equal_full

ROOT = pathlib.Path(attnlab.__file__).parent


@pytest.mark.parametrize("name", KERNELS)
def test_each_kernel_is_its_own_file_and_declares_itself(name):
    cls = KERNELS[name]
    assert cls.name == name
    assert pathlib.Path(inspect.getfile(cls)).name == f"{name}.py"
    assert isinstance(cls.supports, Supports)
    assert dataclasses.is_dataclass(cls.Options)
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    assert set(cls.Options.legacy.values()) <= fields  # older configs' flat fields land on real options


def test_config_allows_exactly_the_registered_kernels():
    with pytest.raises(ValueError, match="attention.kernel") as err:
        ModelConfig(attention={"kernel": "flash"})
    allowed = re.search(r"is not one of (.*)$", str(err.value)).group(1).split(", ")
    assert allowed == list(KERNELS)


def test_no_kernel_name_outside_its_file_the_registry_and_the_config_docs():
    # the default kernels' names (auto, eager, sdpa) are ordinary words of the docs and the CLI
    specific = [n for n in KERNELS if n not in ("auto", "eager", "sdpa")]
    # interop/llama.py maps Mistral's config onto a kernel, and Hugging Face names its own field sliding_window
    allowed = {ROOT / "nn/kernels/__init__.py", ROOT / "config/model.py", ROOT / "interop/llama.py"}
    found = []
    for path in ROOT.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in specific:
            if name in text and path not in allowed and path != ROOT / f"nn/kernels/{name}.py":
                found.append(f"{path.relative_to(ROOT)}: {name}")
    assert not found


# ---- a kernel added in one place ----------------------------------------------------------------


@dataclass
class TemperedOptions:
    temperature: float = field(default=1.0, metadata={"min": 0.01})

    legacy: ClassVar[dict[str, str]] = {}


class TemperedKernel(Kernel):
    """softmax(scale q k^T / temperature + bias, mask) v, dense: a whole new kernel in one class."""

    name = "tempered"
    supports = Supports(any_score=False, value_term=False)
    Options = TemperedOptions

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    @classmethod
    def build(cls, options, setup):
        return cls(options.temperature)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        k, v = repeat_kv(k, v, q.shape[1])
        scores = (q @ k.transpose(-2, -1)) * (scale / self.temperature)
        if bias is not None:
            scores = scores + bias
        return eager_attention(scores, v, mask=mask, dropout_p=dropout_p)


def config(kernel, **options):
    return ModelConfig(arch="decoder", vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                       norm_placement="pre", position={"scheme": "alibi"},
                       attention={"kernel": kernel, "kernel_options": options, "num_kv_heads": 2})


def test_a_kernel_registered_in_one_line_is_usable_end_to_end(monkeypatch):
    monkeypatch.setitem(KERNELS, "tempered", TemperedKernel)
    cfg = config("tempered", temperature=1.0)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="attention.kernel_options.temperature"):
        config("tempered", temperature=0.0)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    eager = build_model(config("eager")).eval()
    eager.load_state_dict(model.state_dict())
    x = torch.randint(1, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(x, mask), eager(x, mask), atol=1e-5, rtol=1e-5)  # temperature 1 = softmax
        hot = build_model(config("tempered", temperature=0.02)).eval()  # sharper than softmax
        hot.load_state_dict(model.state_dict())
        assert (hot(x, mask) - model(x, mask)).abs().max() > 1e-3
    assert_cached_steps_equal_full(hot, x, mask, steps=3)
