"""attnlab.save / attnlab.load: identical outputs, ties kept, no pickle, atomic writes."""

import json

import pytest
import torch
from safetensors import safe_open

from attnlab import ModelConfig, build_model
from attnlab.interop import serialization
from attnlab.interop.serialization import load, save
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

ARCHS = {
    "decoder-tied": dict(arch="decoder", position={"scheme": "rotary"}),
    "encoder-mlm": dict(arch="encoder", head="mlm", type_vocab_size=2, embedding_norm=True, norm_placement="post"),
    "encoder-decoder-shared": dict(arch="encoder_decoder", position={"scheme": "t5_bias"}, norm="rmsnorm",
                                   lm_head_scale=0.25, attention={"score": "dot", "bias": False}),
    "encoder-decoder-separate": dict(arch="encoder_decoder", share_embeddings=False, src_vocab_size=31,
                                     tie_embeddings=False, position={"scheme": "sinusoidal",
                                                                     "sinusoidal_layout": "halves"}),
}


def _model(name: str) -> torch.nn.Module:
    kw = dict(vocab_size=37, d_model=24, num_layers=2, num_heads=3, d_ff=40, dropout=0.0, norm_placement="pre")
    kw.update(ARCHS[name])
    return build_model(ModelConfig(**kw))


def _outputs(model, name):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 30, (2, 7), generator=g)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        return model(ids, ids[:, :5], mask, mask[:, :5]) if name.startswith("encoder-decoder") else model(ids, mask)


def _tokenizer():
    from attnlab.tokenizers import Tokenizer

    return Tokenizer.train(["the cat sat on the mat", "a dog"] * 5, kind="char", special_tokens=["[PAD]", "[UNK]"])


@pytest.mark.parametrize("name", ARCHS)
def test_round_trip_gives_identical_outputs_and_keeps_ties(name, tmp_path):
    model = _model(name).train()
    save(model, tmp_path / "m")
    back = load(tmp_path / "m")
    assert not back.training and back.config == model.config
    model.eval()
    assert torch.equal(_outputs(model, name), _outputs(back, name))
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    ties = {n for n, _ in model.named_parameters()}, {n for n, _ in back.named_parameters()}
    assert ties[0] == ties[1]  # the same names are deduplicated, i.e. the same tensors are tied
    if name == "decoder-tied":
        assert back.head.proj.weight is back.embed.token.weight


def test_tied_tensors_are_stored_once(tmp_path):
    model = _model("encoder-decoder-shared")
    save(model, tmp_path / "m")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["format"] == "attnlab"
    assert "decoder.embed.token.weight" not in keys or "encoder.embed.token.weight" not in keys
    assert len(keys) == len({id(p) for p in model.parameters()})
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert ModelConfig.from_json(str(tmp_path / "m" / "config.json")) == model.config


def test_tokenizer_travels_with_the_model(tmp_path):
    tok = _tokenizer()
    save(_model("decoder-tied"), tmp_path / "m", tokenizer=tok)
    model, back = load(tmp_path / "m", with_tokenizer=True)
    assert json.loads((tmp_path / "m" / "tokenizer.json").read_text())
    assert back.encode("the cat") == tok.encode("the cat")
    assert load(tmp_path / "m").config == model.config  # without with_tokenizer: the model alone
    save(model, tmp_path / "bare")
    assert load(tmp_path / "bare", with_tokenizer=True)[1] is None


def test_dtype_is_kept(tmp_path):
    model = _model("decoder-tied").to(torch.bfloat16)
    save(model, tmp_path / "m")
    assert next(load(tmp_path / "m").parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("stage", ["weights", "tokenizer"])
def test_a_crash_mid_save_leaves_no_partial_folder(tmp_path, monkeypatch, stage):
    def crash(*args, **kwargs):
        raise OSError("disk full")

    tok = _tokenizer()
    if stage == "weights":
        monkeypatch.setattr(serialization, "write_safetensors", crash)
    else:
        monkeypatch.setattr(tok, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save(_model("decoder-tied"), tmp_path / "new", tokenizer=tok)
    assert list(tmp_path.iterdir()) == []


def test_a_crash_while_replacing_keeps_the_old_folder(tmp_path, monkeypatch):
    old = _model("decoder-tied")
    save(old, tmp_path / "m")
    monkeypatch.setattr(serialization, "write_safetensors", lambda *a, **k: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        save(_model("encoder-mlm"), tmp_path / "m")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert load(tmp_path / "m").config == old.config


def test_replacing_an_existing_model_folder(tmp_path):
    save(_model("decoder-tied"), tmp_path / "m")
    new = _model("encoder-mlm")
    save(new, tmp_path / "m")
    assert load(tmp_path / "m").config == new.config
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_bad_targets_and_inputs(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        save(_model("decoder-tied"), tmp_path / "file")
    with pytest.raises(TypeError, match="ModelConfig"):
        save(torch.nn.Linear(2, 2), tmp_path / "lin")
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nothing")


def test_missing_tensor_and_truncated_file_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    save(_model("decoder-tied"), tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(path)
    tensors.pop("layers.1.ffn.w2.weight")
    save_file(tensors, path)
    with pytest.raises(ValueError, match=r"missing tensor.*layers\.1\.ffn\.w2\.weight"):
        load(tmp_path / "m")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="cannot read .*model.safetensors"):
        load(tmp_path / "m")


def test_a_run_folder_loads_its_best_checkpoint_verified(tmp_path):
    from attnlab.io import CheckpointError
    from attnlab.io.checkpoints import save_checkpoint

    model = _model("decoder-tied")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": json.loads(model.config.to_json())}))

    def checkpoint(step, metric):
        save_checkpoint(run / "checkpoints", step=step, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1),
                        schedule_state={}, data_generator=torch.Generator(), metric=metric)

    checkpoint(1, metric=1.0)
    best = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.embed.token.weight.add_(1.0)
    checkpoint(2, metric=2.0)  # the latest, not the best
    back = load(run)
    assert not back.training
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in best.items())
    weights = run / "checkpoints" / "step-00000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load(run)
