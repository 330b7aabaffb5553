"""`attnlab generate` and `attnlab translate` on tiny saved models with a character tokenizer:
the command line prints what the library's generate() gives."""

import io

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.decoding import generate
from attnlab.io.serialization import save
from attnlab.tokenizers import Tokenizer

TEXT = ["the cat sat on the mat", "a dog ran in the park", "hello world, how are you?"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()  # tiny models: one intra-op thread is far faster on a busy machine
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXT, kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>"])


def _model(arch: str, vocab: int):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=vocab, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement="pre", position={"scheme": "rotary" if arch == "decoder" else "learned",
                                                      "max_len": 128}, init_std=0.3)
    return build_model(cfg).eval()


def _new_text(tok, ids, eos):
    ids = ids.tolist()
    ids = ids[:ids.index(eos)] if eos in ids else ids
    return tok.decode(ids, skip_special_tokens=True)


def test_generate_streams_the_library_greedy_continuation(tmp_path, tok, capsys):
    model = _model("decoder", tok.vocab_size)
    save(model, tmp_path / "lm", tokenizer=tok)
    eos = tok.token_to_id("</s>")
    prompt = "the ca"
    ids = torch.tensor([tok.encode(prompt)])
    expected = prompt + _new_text(tok, generate(model, ids, 20, eos_token_id=eos)[0, ids.shape[1]:], eos)
    assert main(["generate", str(tmp_path / "lm"), "--prompt", prompt, "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    # a batch of prompts (no streaming), sampled with a seed, equals the library call
    prompts = ["a d", "hello wor"]
    rows = [tok.encode(p) for p in prompts]
    x = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for b, r in enumerate(rows):
        x[b, 9 - len(r):], mask[b, 9 - len(r):] = torch.tensor(r), 1
    out = generate(model, x, 15, attention_mask=mask, do_sample=True, top_k=5, eos_token_id=eos,
                   pad_token_id=tok.token_to_id("<pad>"), generator=torch.Generator().manual_seed(3))
    want = [p + _new_text(tok, out[b, 9:], eos) for b, p in enumerate(prompts)]
    assert main(["generate", str(tmp_path / "lm"), "--prompt", prompts[0], "--prompt", prompts[1],
                 "--max-new-tokens", "15", "--sample", "--top-k", "5", "--seed", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == want


def test_generate_stop_string_and_errors(tmp_path, tok, capsys):
    model = _model("decoder", tok.vocab_size)
    save(model, tmp_path / "lm", tokenizer=tok)
    main(["generate", str(tmp_path / "lm"), "--prompt", "the", "--max-new-tokens", "30", "--no-stream"])
    free = capsys.readouterr().out.rstrip("\n")[3:]
    stop = free[4:6]
    assert main(["generate", str(tmp_path / "lm"), "--prompt", "the", "--max-new-tokens", "30", "--stop", stop]) == 0
    assert capsys.readouterr().out == "the" + free[:free.index(stop) + 2] + "\n"
    assert main(["generate", str(tmp_path / "lm"), "--prompt", "the", "--sample", "--temperature", "0"]) == 2
    assert "temperature must be > 0" in capsys.readouterr().err
    save(model, tmp_path / "bare")
    assert main(["generate", str(tmp_path / "bare"), "--prompt", "the"]) == 2
    assert "no tokenizer.json" in capsys.readouterr().err


def test_translate_file_and_stdin_match_the_library(tmp_path, tok, capsys, monkeypatch):
    model = _model("encoder_decoder", tok.vocab_size)
    save(model, tmp_path / "mt", tokenizer=tok)
    lines = ["the cat", "", "a dog ran in the park", "hello", "on the mat"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    eos, bos = tok.token_to_id("</s>"), tok.token_to_id("<s>")
    expected = []
    for line in lines:
        if not line:
            expected.append("")
            continue
        out = generate(model, torch.tensor([tok.encode(line)]), 12, num_beams=3, eos_token_id=eos,
                       decoder_start_token_id=bos)
        expected.append(_new_text(tok, out[0, 1:], eos))
    args = ["translate", str(tmp_path / "mt"), "--num-beams", "3", "--max-new-tokens", "12", "--batch-size", "2"]
    assert main(args + ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert "summary: 4 sentences" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines)))
    assert main(args + ["--quiet"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == expected


def test_translate_refuses_a_decoder_only_checkpoint(tmp_path, tok, capsys):
    save(_model("decoder", tok.vocab_size), tmp_path / "lm", tokenizer=tok)
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    assert main(["translate", str(tmp_path / "lm"), "--input", str(tmp_path / "in.txt")]) == 2
    assert "encoder-decoder" in capsys.readouterr().err
