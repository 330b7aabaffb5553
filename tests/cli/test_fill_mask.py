"""`attnlab fill-mask`: the table and the JSON print what the library's fill_mask gives, for a
saved folder and for an `attnlab train` masked_lm run folder; bad input is one error line."""

import json

import pytest
import torch

import attnlab
from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.tokenizers import Tokenizer
from tests.training.helpers import tiny_config

LINES = ["the cat sat on the mat", "import a module with the import statement", "the dog ran far away"] * 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill-mask")
    with pytest.warns(UserWarning, match="reached"):  # the tiny corpus has fewer pieces than asked for
        tok = Tokenizer.train(LINES, kind="wordpiece", vocab_size=80, special_tokens=SPECIALS)
    torch.manual_seed(0)
    common = dict(vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2, d_ff=32, init_std=0.3,
                  position={"scheme": "learned", "max_len": 32})
    attnlab.save(build_model(ModelConfig(arch="encoder", head="mlm", **common)), root / "mlm", tokenizer=tok)
    attnlab.save(build_model(ModelConfig(arch="decoder", **common)), root / "lm", tokenizer=tok)
    attnlab.save(build_model(ModelConfig(arch="encoder", **common)), root / "enc", tokenizer=tok)
    return root


def test_the_table_prints_the_library_predictions(folders, capsys):
    text = "the [MASK] sat on the [MASK] ."
    want = attnlab.fill_mask(folders / "mlm", text, top_k=3)
    assert main(["fill-mask", str(folders / "mlm"), text, "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mask 1 of 2" and lines[1].split() == ["rank", "prob", "id", "token"]
    rows = [line.split() for line in lines if line.strip() and line.split()[0].isdigit()]
    assert rows == [[str(r), f"{p['probability']:.4f}", str(p["id"]), p["token"]]
                    for m in want for r, p in enumerate(m, 1)]
    assert len({line.index(" id") for line in lines if line.strip().startswith("rank")}) == 1  # aligned


def test_json_one_object_per_text(folders, capsys):
    texts = ["a [MASK] ran far", "[MASK] a module"]
    assert main(["fill-mask", str(folders / "mlm"), *texts, "--json", "--top-k", "2"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got == [{"text": t, "masks": attnlab.fill_mask(folders / "mlm", t, top_k=2)} for t in texts]


def test_a_masked_lm_run_folder(tmp_path, capsys):
    cfg = tiny_config(tmp_path, max_steps=1, eval_every=1, eval_batches=1, checkpoint_every=1)
    cfg["data"].update(objective="masked_lm", tokenizer={"kind": "wordpiece", "vocab_size": 60})
    cfg["model"]["preset"] = "tiny-encoder"
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    assert main(["train", str(tmp_path / "run.json")]) == 0
    capsys.readouterr()
    run = cfg["train"]["out_dir"]
    assert main(["fill-mask", run, "the king [MASK] thou", "--json"]) == 0
    (got,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model, tok = attnlab.load(run, with_tokenizer=True)
    ids = tok.encode("the king [MASK] thou", add_special_tokens=True)
    with torch.no_grad():
        want = model(torch.tensor([ids]))[0, ids.index(tok.mask_token_id)].softmax(-1)
    assert [p["id"] for p in got["masks"][0]] == want.topk(5).indices.tolist()
    assert [p["probability"] for p in got["masks"][0]] == pytest.approx(want.topk(5).values.tolist(), abs=1e-6)


@pytest.mark.parametrize("folder,args,message", [
    ("mlm", ["the cat sat"], "no mask token: write '[MASK]'"),
    ("mlm", ["a [MASK]", "--top-k", "0"], "--top-k must be at least 1, got 0"),
    ("lm", ["a [MASK]"], "got a decoder-only model"),
    ("enc", ["a [MASK]"], "no MLM head"),
    ("missing", ["a [MASK]"], "missing does not exist"),
])
def test_errors_are_one_line(folders, capsys, folder, args, message):
    assert main(["fill-mask", str(folders / folder), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab fill-mask: error: ") and message in err and "\n" not in err
