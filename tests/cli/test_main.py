import json
import subprocess
import sys

import pytest
import torch

from attnlab.cli.main import SUBCOMMANDS, main
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


def test_demo_falls_back_to_fp32_without_native_bf16(monkeypatch):
    from attnlab.cli import demo

    monkeypatch.setattr(demo, "bf16_is_fast", lambda: False)
    assert demo.demo_config(10)["train"]["precision"] == "fp32"
    monkeypatch.setattr(demo, "bf16_is_fast", lambda: True)
    assert demo.demo_config(10)["train"]["precision"] == demo.RECIPE["train"]["precision"] == "bf16"
