"""`attnlab generate` and `attnlab translate` on tiny saved models with a character tokenizer:
the command line prints what the library's generate() gives."""

import io

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.decoding import generate
from attnlab.interop.serialization import save
from attnlab.tokenizers import Tokenizer

TEXT = ["the cat sat on the mat", "a dog ran in the park", "hello world, how are you?"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXT, kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>"])


def _model(arch: str, vocab: int, max_len: int = 128):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=vocab, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement="pre", position={"scheme": "rotary" if arch == "decoder" else "learned",
                                                      "max_len": max_len}, init_std=0.3)
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
        source = tok.encode(line) + [eos]  # as the seq2seq objective trains it (attnlab.data.objectives.seq2seq)
        out = generate(model, torch.tensor([source]), 12, num_beams=3, eos_token_id=eos, decoder_start_token_id=bos)
        expected.append(_new_text(tok, out[0, 1:], eos))
    args = ["translate", str(tmp_path / "mt"), "--num-beams", "3", "--max-new-tokens", "12", "--batch-size", "2"]
    assert main(args + ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert "summary: 4 sentences" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines)))
    assert main(args + ["--quiet"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == expected


def test_translate_scores_against_references_with_sacrebleu(tmp_path, tok, capsys):
    import json

    import sacrebleu

    save(_model("encoder_decoder", tok.vocab_size), tmp_path / "mt", tokenizer=tok)
    (tmp_path / "in.txt").write_text("the cat\na dog ran\nhello\n", encoding="utf-8")
    args = ["translate", str(tmp_path / "mt"), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt"),
            "--num-beams", "2", "--max-new-tokens", "8", "--quiet"]
    assert main(args) == 0
    hyps = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    refs = [hyps[0], "a dog ran", hyps[2] + " and more"]  # one exact, one likely wrong, one longer
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    assert main(args + ["--reference", str(tmp_path / "ref.txt")]) == 0
    scores = json.loads(capsys.readouterr().err.split("scores: ")[1])
    assert scores["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2) and scores["sentences"] == 3
    (tmp_path / "ref.txt").write_text("only one line\n", encoding="utf-8")
    assert main(args + ["--reference", str(tmp_path / "ref.txt")]) == 2
    assert "has 1 lines, the input 3" in capsys.readouterr().err


def test_translate_feeds_the_source_as_training_did(tmp_path, tok, capsys):
    """The trainer's batches end each source with EOS; translate must too (a model is otherwise
    asked about sentences unlike any it saw), and --no-special-tokens feeds the bare pieces."""
    model = _model("encoder_decoder", tok.vocab_size)
    save(model, tmp_path / "mt", tokenizer=tok)
    eos, bos = tok.token_to_id("</s>"), tok.token_to_id("<s>")
    from attnlab.data.objectives import encoder_source, seq2seq

    line = "the cat sat"
    batch = seq2seq([tok.encode(line)], [tok.encode("x")], pad_id=0, bos_id=bos, eos_id=eos)
    assert encoder_source(tok, line) == batch["src_ids"][0].tolist()
    (tmp_path / "in.txt").write_text(line + "\n", encoding="utf-8")
    for flags, source in (([], batch["src_ids"]), (["--no-special-tokens"], torch.tensor([tok.encode(line)]))):
        want = _new_text(tok, generate(model, source, 12, eos_token_id=eos, decoder_start_token_id=bos)[0, 1:], eos)
        assert main(["translate", str(tmp_path / "mt"), "--input", str(tmp_path / "in.txt"), "--num-beams", "1",
                     "--max-new-tokens", "12", "--quiet", *flags]) == 0
        assert capsys.readouterr().out == want + "\n"


def test_translate_refuses_a_decoder_only_checkpoint(tmp_path, tok, capsys):
    save(_model("decoder", tok.vocab_size), tmp_path / "lm", tokenizer=tok)
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    assert main(["translate", str(tmp_path / "lm"), "--input", str(tmp_path / "in.txt")]) == 2
    assert "encoder-decoder" in capsys.readouterr().err


# ---------------------------------------------------------------- what generate refuses or warns about

def _lm(tmp_path, tok, scheme="rotary", max_len=128):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                      dropout=0.0, position={"scheme": scheme, "max_len": max_len})
    model = build_model(cfg).eval()
    save(model, tmp_path / f"lm-{scheme}", tokenizer=tok)
    return model, str(tmp_path / f"lm-{scheme}")


def test_a_huge_max_new_tokens_is_refused_before_anything_is_allocated(tmp_path, tok, capsys, monkeypatch):
    from attnlab.cli import generate as cli

    model, folder = _lm(tmp_path, tok)
    monkeypatch.setattr(cli, "available_memory", lambda: 2 ** 30)
    assert main(["generate", folder, "--prompt", "the", "--max-new-tokens", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab generate: error: --max-new-tokens 1,000,000,000: decoding 1 row(s)")
    fits = int(err.split("at most about ")[1].split(" new tokens")[0].replace(",", ""))
    # the largest value it names fits (past the context: a warning), a little more does not
    with pytest.warns(UserWarning, match="runs past the model's context"):
        cli.check_length(model, rows=1, prompt_len=3, max_new_tokens=fits)
    with pytest.raises(ValueError, match="more than the 1.0 GiB"):
        cli.check_length(model, rows=1, prompt_len=3, max_new_tokens=int(fits * 1.01) + 1)
    # beams multiply the rows held at once
    with pytest.raises(ValueError, match="decoding 4 row"):
        cli.check_length(model, rows=4, prompt_len=3, max_new_tokens=fits // 3)


def test_past_the_context_learned_positions_refuse_rotary_ones_warn(tmp_path, tok, capsys):
    _, learned = _lm(tmp_path, tok, scheme="learned", max_len=16)
    assert main(["generate", learned, "--prompt", "the cat", "--max-new-tokens", "20"]) == 2
    assert "exceeds the model's context (position.max_len=16)" in capsys.readouterr().err
    model, rotary = _lm(tmp_path, tok, scheme="rotary", max_len=16)
    assert main(["generate", rotary, "--prompt", "the cat", "--max-new-tokens", "20", "--no-stream"]) == 0
    out = capsys.readouterr()
    assert out.err == ("attnlab generate: warning: the prompt (7 tokens) + --max-new-tokens 20 = 27 tokens runs past "
                       "the model's context of 16 tokens (position.max_len, rotary positions): it never saw positions "
                       "beyond it, and text past that point usually degrades\n")
    ids = torch.tensor([tok.encode("the cat")])
    eos = tok.token_to_id("</s>")
    assert out.out == "the cat" + _new_text(tok, generate(model, ids, 20, eos_token_id=eos)[0, 7:], eos) + "\n"


def test_the_default_length_follows_the_models_positions(tmp_path, tok, capsys):
    """--max-new-tokens left out: 128 for translate, 50 for generate, or what position.max_len
    leaves (learned positions refuse more, rotary ones were never trained past it); a value
    given beyond a table's end stays an error naming the limit."""
    model = _model("encoder_decoder", tok.vocab_size, max_len=16)  # learned positions: 16 slots
    save(model, tmp_path / "mt", tokenizer=tok)
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    eos, bos = tok.token_to_id("</s>"), tok.token_to_id("<s>")
    source = torch.tensor([tok.encode("the cat") + [eos]])
    want = _new_text(tok, generate(model, source, 15, eos_token_id=eos, decoder_start_token_id=bos)[0, 1:], eos)
    translate = ["translate", str(tmp_path / "mt"), "--input", str(tmp_path / "in.txt"), "--num-beams", "1", "--quiet"]
    assert main(translate) == 0
    assert capsys.readouterr() == (want + "\n", "")
    assert main(translate + ["--max-new-tokens", "16"]) == 2
    assert "exceeds the model's context (position.max_len=16); lower max_new_tokens to at most 15" in \
        capsys.readouterr().err
    lm, folder = _lm(tmp_path, tok, scheme="rotary", max_len=16)
    ids = torch.tensor([tok.encode("the cat")])  # 7 tokens: 9 positions left
    assert main(["generate", folder, "--prompt", "the cat", "--no-stream"]) == 0
    want = "the cat" + _new_text(tok, generate(lm, ids, 9, eos_token_id=eos)[0, 7:], eos) + "\n"
    assert capsys.readouterr() == (want, "")  # no warning: the default stays inside the context


def test_sampling_flags_without_sample_warn_and_decode_greedily(tmp_path, tok, capsys):
    _, folder = _lm(tmp_path, tok)
    assert main(["generate", folder, "--prompt", "the", "--max-new-tokens", "10", "--no-stream"]) == 0
    greedy = capsys.readouterr()
    assert greedy.err == ""
    assert main(["generate", folder, "--prompt", "the", "--max-new-tokens", "10", "--no-stream", "--temperature", "0.3",
                 "--top-p", "0.5"]) == 0
    warned = capsys.readouterr()
    assert warned.out == greedy.out
    assert warned.err == ("attnlab generate: warning: --temperature, --top-p only apply with --sample; without it "
                          "decoding is greedy and ignores them\n")


def test_a_run_and_its_checkpoint_folders_load_alike(tmp_path, tok, capsys):
    import hashlib
    import json

    from attnlab.io.weights import unique_state, write_safetensors

    model, _ = _lm(tmp_path, tok)
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    write_safetensors(unique_state(model), step / "model.safetensors")
    sha = hashlib.sha256((step / "model.safetensors").read_bytes()).hexdigest()
    (step / "state.json").write_text(json.dumps({"step": 4, "sha256": {"model.safetensors": sha}}))
    (run / "checkpoints" / "index.json").write_text(json.dumps({"latest": step.name, "best": step.name}))
    (run / "config.json").write_text(json.dumps({"config": {}, "model": model.config.to_dict()}))
    tok.save(run)
    outputs = []
    for folder in (run, run / "checkpoints", step):
        assert main(["generate", str(folder), "--prompt", "the ca", "--max-new-tokens", "8", "--no-stream"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) > len("the ca\n")
    (step / "state.json").write_text("[1]")
    assert main(["generate", str(step), "--prompt", "the"]) == 2
    assert capsys.readouterr().err == f"attnlab generate: error: {step}/state.json is corrupted (expected an object " \
                                      "with the files' sha256)\n"


def test_translate_names_an_input_that_is_not_utf8(tmp_path, tok, capsys, monkeypatch):
    save(_model("encoder_decoder", tok.vocab_size), tmp_path / "mt", tokenizer=tok)
    (tmp_path / "in.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    assert main(["translate", str(tmp_path / "mt"), "--input", str(tmp_path / "in.txt")]) == 2
    assert capsys.readouterr().err == (f"attnlab translate: error: {tmp_path / 'in.txt'}: expected UTF-8 text, one "
                                       "sentence per line (byte 0xe9 at offset 3 is not UTF-8)\n")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe"), encoding="utf-8"))
    assert main(["translate", str(tmp_path / "mt")]) == 2
    assert capsys.readouterr().err.startswith("attnlab translate: error: standard input: expected UTF-8 text")


def test_few_shot_prompts_are_built_from_a_jsonl_file(tmp_path, tok, capsys):
    from attnlab.decoding.prompts import FewShotPrompt

    model = _model("decoder", tok.vocab_size)
    save(model, tmp_path / "lm", tokenizer=tok)
    shots = tmp_path / "shots.jsonl"
    shots.write_text('{"input": "the cat", "output": "sat"}\n\n{"input": "a dog", "output": "ran"}\n')
    argv = ["generate", str(tmp_path / "lm"), "--prompt", "the mat", "--few-shot", str(shots),
            "--template", "Q: {input}\\nA: {output}", "--shots", "1", "--max-new-tokens", "5", "--no-stream"]
    assert main(argv) == 0
    expected = FewShotPrompt("Q: {input}\nA: {output}").build([{"input": "the cat", "output": "sat"}], "the mat", k=1)
    assert expected.endswith("Q: the mat\nA:") and "a dog" not in expected
    assert capsys.readouterr().out.startswith(expected)


@pytest.mark.parametrize("content, extra, message", [
    ('{"input": "a"}\n[1, 2]\n', [], "line 2 is a list"),
    ("not json\n", [], "line 1 is not JSON"),
    ("\n", [], "no examples"),
    ('{"input": "a", "output": "b"}\n', ["--shots", "3"], "k must be an integer"),
])
def test_bad_few_shot_files_name_the_file(tmp_path, tok, capsys, content, extra, message):
    save(_model("decoder", tok.vocab_size), tmp_path / "lm", tokenizer=tok)
    shots = tmp_path / "shots.jsonl"
    shots.write_text(content)
    assert main(["generate", str(tmp_path / "lm"), "--prompt", "x", "--few-shot", str(shots), *extra]) == 2
    err = capsys.readouterr().err
    assert str(shots) in err and message in err


def test_few_shot_flags_need_the_examples(tmp_path, tok, capsys):
    save(_model("decoder", tok.vocab_size), tmp_path / "lm", tokenizer=tok)
    assert main(["generate", str(tmp_path / "lm"), "--prompt", "x", "--shots", "2"]) == 2
    assert "--few-shot" in capsys.readouterr().err
