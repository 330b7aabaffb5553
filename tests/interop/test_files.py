"""Bad input when converting: unsupported architectures, missing/unexpected/mis-shaped weights,
truncated files, and pickles that would run code."""

import json
import os
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file
import transformers

from attnlab.interop import from_hf, supported_architectures
from attnlab.interop.files import read_torch_bin
from tests.interop.helpers import single_thread, tiny_gpt2_folder

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


@pytest.fixture
def gpt2_folder(tmp_path):
    return tmp_path / "gpt2", tiny_gpt2_folder(tmp_path / "gpt2")


def _edit_weights(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_the_folder_converts(gpt2_folder):
    folder, hf = gpt2_folder
    ids = torch.randint(0, 40, (1, 6))
    with torch.no_grad():
        assert torch.allclose(from_hf(folder)(ids), hf(input_ids=ids).logits, atol=1e-5)


def test_unsupported_architecture_is_named(tmp_path):
    cfg = transformers.RobertaConfig(vocab_size=40, hidden_size=24, num_attention_heads=3, num_hidden_layers=1,
                                     intermediate_size=32)
    with pytest.raises(ValueError, match="unsupported architecture 'RobertaModel'"):
        from_hf(transformers.RobertaModel(cfg))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        from_hf(tmp_path / "m")
    assert "T5ForConditionalGeneration" in supported_architectures()


def test_missing_weight_is_named(gpt2_folder):
    folder, _ = gpt2_folder
    _edit_weights(folder, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(ValueError, match=r"missing weight.*transformer\.h\.1\.mlp\.c_fc\.weight"):
        from_hf(folder)


def test_unexpected_weight_is_named(gpt2_folder):
    folder, _ = gpt2_folder
    _edit_weights(folder, lambda t: t.__setitem__("transformer.h.2.ln_1.weight", torch.ones(24)))
    with pytest.raises(ValueError, match=r"unexpected weight.*transformer\.h\.2\.ln_1\.weight"):
        from_hf(folder)


def test_shape_mismatch_is_named(gpt2_folder):
    folder, _ = gpt2_folder
    config = json.loads((folder / "config.json").read_text())
    config["n_positions"] = 20
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"shape mismatch for transformer\.wpe\.weight.*\(20, 24\).*\(16, 24\)"):
        from_hf(folder)


def test_untied_output_that_should_be_tied_is_an_error(gpt2_folder):
    folder, _ = gpt2_folder
    _edit_weights(folder, lambda t: t.__setitem__("lm_head.weight", torch.zeros(40, 24)))
    with pytest.raises(ValueError, match="lm_head.weight should be tied to transformer.wte.weight"):
        from_hf(folder)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_truncated_weights_file_is_named(gpt2_folder, name):
    folder, hf = gpt2_folder
    if name == "pytorch_model.bin":
        os.remove(folder / "model.safetensors")
        torch.save(hf.state_dict(), folder / name)
        assert from_hf(folder) is not None  # the intact .bin loads
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"cannot read .*{name}"):
        from_hf(folder)


class _RunsCode:
    """Unpickling this would call os.system: the classic malicious-pickle payload."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "raw pickle"])
def test_a_pickle_that_runs_code_is_refused(gpt2_folder, tmp_path, writer):
    folder, hf = gpt2_folder
    os.remove(folder / "model.safetensors")
    marker = tmp_path / "pwned"
    with open(folder / "pytorch_model.bin", "wb") as f:
        if writer == "torch.save":
            torch.save({**hf.state_dict(), "evil": _RunsCode(marker)}, f)
        else:  # a plain pickle (no tensors: those pickle through torch's own globals)
            pickle.dump({"evil": _RunsCode(marker)}, f, protocol=2)
    with pytest.raises(ValueError, match=r"refusing to load .*pytorch_model\.bin.*system"):
        from_hf(folder)
    with pytest.raises(ValueError, match="refusing"):
        read_torch_bin(folder / "pytorch_model.bin")
    assert not marker.exists()
