import json
import subprocess
import sys

import pytest

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


def test_demo_learns(capsys):
    assert main(["demo", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    summary = [line for line in out.splitlines() if line.startswith("summary")][0]
    first, final = (float(x) for x in summary.split("loss ")[1].split(" in ")[0].split(" -> "))
    assert final < first - 1.0
