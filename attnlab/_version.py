"""attnlab's version, in one place below every layer: `attnlab.__version__`, the versions a run
records beside its config (`attnlab.training.run.folder.versions`) and `attnlab --version` read it
here (tests/cli/test_main.py checks that it agrees with pyproject.toml)."""

__version__ = "0.1.0"
