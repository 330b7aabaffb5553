"""`attnlab convert`: Hugging Face folder -> attnlab folder -> Hugging Face folder, same outputs."""

import json

import pytest
import torch
import transformers

from attnlab.cli.main import main
from attnlab.io.serialization import load
from tests.interop.helpers import TOL, real_max_diff, single_thread, tiny_gpt2_folder

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


@pytest.fixture
def hf_gpt2(tmp_path):
    return tiny_gpt2_folder(tmp_path / "hf"), tmp_path


def test_both_directions(hf_gpt2, capsys):
    hf, tmp = hf_gpt2
    ids = torch.randint(0, 40, (2, 9))
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0
    assert json.loads((tmp / "ours" / "config.json").read_text())["arch"] == "decoder"
    assert main(["convert", str(tmp / "ours"), str(tmp / "back"), "--to", "hf"]) == 0
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp / "back").eval()
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        assert real_max_diff(load(tmp / "ours")(ids), want) <= TOL
        assert real_max_diff(back(input_ids=ids).logits, want) <= TOL
    assert "converted hf" in capsys.readouterr().err


def test_tokenizer_is_carried_over(hf_gpt2):
    from attnlab.tokenizers import Tokenizer

    _, tmp = hf_gpt2
    tok = Tokenizer.train(["some text to learn"] * 3, kind="char", special_tokens=["<pad>", "<unk>"])
    tok.save(tmp / "hf")
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0
    model, back = load(tmp / "ours", with_tokenizer=True)
    assert back.encode("text") == tok.encode("text")
    assert main(["convert", str(tmp / "hf"), str(tmp / "plain"), "--no-tokenizer"]) == 0
    assert not (tmp / "plain" / "tokenizer.json").exists()


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama",
                                                                "architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "llama" / "model.safetensors").write_bytes(b"")
    assert main(["convert", str(tmp_path / "llama"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture 'LlamaForCausalLM'" in err
    assert not (tmp_path / "out").exists()
