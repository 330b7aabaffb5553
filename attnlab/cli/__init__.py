"""The `attnlab` command line: one thin subcommand per job (see `main.py`)."""
