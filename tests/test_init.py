"""`import attnlab` loads the configs only (no torch); every public name resolves on first use."""

import json
import subprocess
import sys

HEAVY = ["torch", "matplotlib", "sacrebleu", "transformers", "attnlab.models", "attnlab.decoding", "attnlab.training", "attnlab.data", "attnlab.finetune",
         "attnlab.inspect", "attnlab.parallel", "attnlab.interop", "attnlab.tokenizers"]


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_attnlab_loads_the_configs_only():
    loaded = _fresh("import json, sys, attnlab; print(json.dumps(sorted(sys.modules)))")
    assert [name for name in HEAVY if name in loaded] == []
    assert "attnlab.config" in loaded and "attnlab.presets" in loaded


def test_every_public_name_resolves():
    code = ("import json, attnlab\n"
            "missing = [n for n in attnlab.__all__ if getattr(attnlab, n, None) is None]\n"
            "print(json.dumps({'missing': missing, 'dir': sorted(set(attnlab.__all__) - set(dir(attnlab)))}))")
    result = _fresh(code)
    assert result == {"missing": [], "dir": []}


def test_lazy_names_are_the_real_objects():
    import attnlab
    from attnlab.decoding.fill_mask import fill_mask
    from attnlab.interop.sentence import embed
    from attnlab.training import Trainer

    assert attnlab.Trainer is Trainer and attnlab.embed is embed and attnlab.fill_mask is fill_mask
    from attnlab.interop.serialization import load, save

    assert attnlab.load is load and attnlab.save is save
