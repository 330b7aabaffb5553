import errno
import importlib.metadata
import json
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch

import attnlab
from attnlab.cli import main as cli_main
from attnlab.cli.main import SUBCOMMANDS, SUMMARIES, build_parser, describe_error, main
from attnlab.cli.model import resolve_config


def test_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_help_with_an_example(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert "example" in capsys.readouterr().out


def test_the_summaries_agree_with_the_subcommands_parsers():
    # `attnlab --help` shows SUMMARIES without importing the modules: they must say what the modules do
    assert list(SUMMARIES) == SUBCOMMANDS
    actions = [a for a in build_parser()._actions if a.dest == "command"][0]
    assert {c.dest: c.help for c in actions._choices_actions} == SUMMARIES


def test_version_is_the_installed_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"attnlab {importlib.metadata.version('attnlab')}\n"
    assert attnlab.__version__ == importlib.metadata.version("attnlab")  # pyproject and the package agree


# attnlab/__init__.py (the library API) imports torch; these checks load the command line without it,
# as an `attnlab` package whose __init__ did not run, to see what the command line itself imports
_WITHOUT_PACKAGE_INIT = """
import importlib.util, sys, types
spec = importlib.util.find_spec("attnlab")
stub = types.ModuleType("attnlab")
stub.__path__ = list(spec.submodule_search_locations)
sys.modules["attnlab"] = stub
from attnlab.cli.main import build_parser
build_parser(sys.argv[1:])
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "matplotlib", "transformers"}))
"""

@pytest.mark.parametrize("commands", [[]] + [[name] for name in SUBCOMMANDS])
def test_building_the_parser_imports_no_torch(commands):
    out = subprocess.run([sys.executable, "-c", _WITHOUT_PACKAGE_INIT, *commands], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    assert out.strip() == "[]"


def test_attnlab_help_imports_no_torch():
    code = ("import sys\nfrom attnlab.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err.strip() == "False"


# ---------------------------------------------------------------- errors: one line, no traceback

@pytest.mark.parametrize("err,expected", [
    (IsADirectoryError(errno.EISDIR, "Is a directory", "runs/x"), "runs/x: is a folder, expected a file"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "a.txt/config.json"),
     "a.txt/config.json: is not a folder (a file stands where a folder was expected)"),
    (FileExistsError(errno.EEXIST, "File exists", "out"), "out: already exists"),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x"), "/root/x: permission denied"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "m/config.json"),
     "m/config.json: no such file or folder"),
    (OSError(errno.ENOSPC, "No space left on device", "big.bin"), "big.bin: no space left on device"),
    (OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b"), "a -> b: invalid cross-device link"),
    (FileNotFoundError("--file x.txt does not exist"), "--file x.txt does not exist"),
    (ValueError("optim.lr: must be > 0,\n  got -1"), "optim.lr: must be > 0, got -1"),
    (pickle.UnpicklingError("invalid load key, 'x'."), "invalid load key, 'x'."),
    (EOFError("Ran out of input"), "Ran out of input"),
    (MemoryError(), "out of memory (MemoryError); ask for less"),
    (RuntimeError("std::bad_alloc"), "out of memory (std::bad_alloc); ask for less"),  # issue 32, under ulimit -v
])
def test_user_errors_are_one_line_naming_the_file(err, expected):
    assert describe_error(err) == (f"error: {expected}", 2)


def test_yaml_and_safetensors_errors_are_users_errors():
    import yaml
    from safetensors import SafetensorError

    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load("a: [1, 2\nb: 3")
    message, code = describe_error(info.value)
    assert code == 2 and "\n" not in message and "line" in message
    assert describe_error(SafetensorError("HeaderTooLarge")) == ("error: HeaderTooLarge", 2)


def test_running_out_of_memory_is_a_users_error():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2 ** 62, dtype=torch.uint8)  # more than any machine: refused at once, nothing allocated
    message, code = describe_error(info.value)
    assert code == 2 and message.startswith("error: out of memory (")


def test_a_bug_is_an_internal_error_with_a_hint():
    message, code = describe_error(KeyError("config"))
    assert code == 1 and message.startswith("internal error: KeyError: 'config'") and "ATTNLAB_DEBUG=1" in message


def test_a_decode_error_names_the_file_that_was_being_read(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9")
    with pytest.raises(UnicodeDecodeError) as info:
        with open(path, encoding="utf-8") as f:  # a reader that does not name its file
            f.read()
    assert describe_error(info.value) == (f"error: {path}: expected UTF-8 text (byte 0xe9 at offset 3 is not utf-8)",
                                          2)


@pytest.fixture
def failing_command(monkeypatch):
    """`attnlab model presets` made to raise `error` (the parser binds the function when built)."""
    def make(error: BaseException) -> None:
        def fail(args):
            raise error
        monkeypatch.setattr("attnlab.cli.model._presets", fail)
    return make


def test_main_prints_one_line_and_exits_2(failing_command, capsys):
    failing_command(IsADirectoryError(errno.EISDIR, "Is a directory", "somewhere"))
    assert main(["model", "presets"]) == 2
    assert capsys.readouterr().err == "attnlab model: error: somewhere: is a folder, expected a file\n"


def test_ctrl_c_exits_130_with_one_line(failing_command, capsys):
    failing_command(KeyboardInterrupt())
    assert main(["model", "presets"]) == 130
    assert capsys.readouterr().err == "attnlab model: interrupted\n"


@pytest.mark.parametrize("how", ["env", "flag"])
def test_the_debug_escape_hatch_lets_the_exception_through(failing_command, monkeypatch, how):
    failing_command(KeyError("config"))
    argv = ["model", "presets"]
    if how == "env":
        monkeypatch.setenv("ATTNLAB_DEBUG", "1")
    else:
        argv = ["--traceback", *argv]
    with pytest.raises(KeyError):
        main(argv)


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "m", "--prompt", "x", "--max-new-tokens", "many"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("attnlab generate: error: argument --max-new-tokens: invalid int value: "
                                       "'many' (see attnlab generate --help)\n")


def test_warnings_are_one_line(monkeypatch, capsys):
    def warn(args):
        warnings.warn("threads: 0 means all cores", stacklevel=2)
        return 0

    monkeypatch.setattr("attnlab.cli.model._presets", warn)
    assert main(["model", "presets"]) == 0
    assert capsys.readouterr().err == "attnlab model: warning: threads: 0 means all cores\n"


def test_an_unreadable_model_config_is_named(tmp_path, capsys):
    (tmp_path / "m" / "config.json").mkdir(parents=True)
    assert main(["model", "info", str(tmp_path / "m")]) == 2
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe{}")
    assert main(["model", "info", str(tmp_path / "bad.json")]) == 2
    (tmp_path / "hf.json").write_text('{"model_type": "gpt2"}')
    assert main(["model", "info", str(tmp_path / "hf.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"attnlab model: error: {tmp_path / 'm' / 'config.json'}: is a folder, expected a JSON file"
    assert err[1].startswith(f"attnlab model: error: {tmp_path / 'bad.json'}: expected a JSON object (byte 0xff")
    assert err[2].startswith(f"attnlab model: error: {tmp_path / 'hf.json'}: not an attnlab model config")


def test_model_info_applies_overrides(capsys):
    assert main(["model", "info", "tiny-decoder", "--set", "position.scheme=rotary", "--set", "d_model=64"]) == 0
    out = capsys.readouterr().out
    config = json.loads(out[: out.rindex("}") + 1])
    assert config["position"]["scheme"] == "rotary" and config["d_model"] == 64
    total = int(out.strip().splitlines()[-1].split()[-1].replace(",", ""))
    assert total > 22_304  # wider than the preset


def test_model_info_bad_override_is_a_clear_error(capsys):
    assert main(["model", "info", "tiny-decoder", "--set", "position.scheme=fourier"]) == 2
    assert "position.scheme" in capsys.readouterr().err
    with pytest.raises(ValueError, match="key=value"):
        resolve_config("tiny-decoder", ["d_model"])


def test_model_info_reads_a_config_file(tmp_path):
    path = tmp_path / "config.json"
    resolve_config("tiny-encoder", []).to_json(str(path))
    assert resolve_config(str(path), ["num_layers=3"]).num_layers == 3


def test_demo_learns(capsys, tmp_path, monkeypatch):
    # the demo fetches Shakespeare into the cache; here the cache already holds a small
    # stand-in corpus (sonnet lines), so the test needs no network
    from attnlab.cli.demo import RECIPE
    import random

    lines = [line for line in SONNET.splitlines() if line]
    rng = random.Random(0)
    folder = tmp_path / "cache" / "corpora" / "shakespeare"
    folder.mkdir(parents=True)
    (folder / "train.txt").write_text("\n".join(rng.choice(lines) for _ in range(400)))
    (folder / "valid.txt").write_text("\n".join(rng.choice(lines) for _ in range(40)))
    (folder / "meta.json").write_text("{}")
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    assert RECIPE["data"]["source"] == "shakespeare"
    threads = torch.get_num_threads()
    try:
        assert main(["demo", "--steps", "60", "--out", str(tmp_path / "demo"), "--threads", "1",
                     "--sample-chars", "80"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "validation" in out and (tmp_path / "demo" / "loss.png").exists()
    summary = [line for line in out.splitlines() if line.startswith("summary")][0]
    first, final = (float(x) for x in summary.split("loss ")[1].split(" in ")[0].split(" -> "))
    assert final < first - 1.0


SONNET = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
"""


def test_demo_recipe_is_the_example_file():
    from pathlib import Path

    from attnlab.cli.demo import RECIPE

    example = Path(__file__).resolve().parents[2] / "examples" / "shakespeare_char.json"
    assert json.loads(example.read_text()) == RECIPE


def test_demo_leaves_the_precision_to_the_trainer():
    # the machine-dependent choice (bf16 only where it is native) is precision `auto`, made by the
    # Trainer: the demo no longer rewrites it
    from attnlab.cli import demo

    assert demo.demo_config(10)["train"]["precision"] == demo.RECIPE["train"]["precision"] == "auto"


def test_inspect_refuses_a_target_for_a_decoder(tmp_path, capsys):
    from attnlab import ModelConfig, build_model, save
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(["the cat sat"], kind="char")
    cfg = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2, d_ff=32)
    save(build_model(cfg), tmp_path / "lm", tokenizer=tok)
    assert main(["inspect", "attention", str(tmp_path / "lm"), "--text", "the", "--target", "cat",
                 "--out", str(tmp_path / "maps")]) == 2
    assert "--target is for encoder-decoders" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists()


@pytest.mark.parametrize("head", [None, "none", "mlm"])
def test_predict_says_when_the_model_has_no_fine_tuned_head(tmp_path, capsys, head):
    from attnlab import ModelConfig, build_model, save
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(["the cat sat"], kind="char")
    cfg = ModelConfig(arch="encoder", vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                      head=head)
    save(build_model(cfg), tmp_path / "enc", tokenizer=tok)
    (tmp_path / "in.csv").write_text("text\nthe cat\n")
    assert main(["predict", str(tmp_path / "enc"), "--input", str(tmp_path / "in.csv"),
                 "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab predict: error: {tmp_path / 'enc'} holds a model without a fine-tuned head")
    assert not (tmp_path / "out.jsonl").exists()
