# The two commands of the README: `make demo` and `make test`. Both build .venv from nothing.
# The documentation site: `make docs` (tutorials executed, then `mkdocs build --strict` into site/),
# `make docs-serve` (on localhost), `make docs-check` (the built site in headless Chromium).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# the docs tools (the `docs` extra and a Jupyter kernel in .venv); `make test` does not need them
DOCS_STAMP := $(VENV)/.docs-installed
TUTORIAL_SOURCES := $(sort $(wildcard docs/tutorials/[0-9][0-9]-*.py))
TUTORIALS := $(TUTORIAL_SOURCES:.py=.ipynb)
# the Jupyter kernel the tutorials run in (registered in .venv by the docs stamp)
KERNEL ?= attnlab

.PHONY: demo test test-slow test-all browser clean tutorials docs docs-serve docs-check gpu-check-dry

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned, so nothing later pulls a CUDA build
	$(PIP) install --quiet -c constraints.txt torch
	$(PIP) install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# the quick suite (long runs are marked slow, see pyproject.toml); the slowest ten are listed so
# that growth shows
test: $(STAMP) browser
	$(PY) -m pytest --durations=10

# headless Chromium + chromedriver for the attention viewer's browser test (apt-get, when missing)
browser:
	./.ci/install-browser

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: $(STAMP) browser
	$(PY) -m pytest -m ''

# the GPU check's dry run: every section of benchmarks/gpu_check.py at toy sizes on the CPU, what
# needs CUDA skipped with its reason (1-3 minutes on 2 busy cores; too long for `make test`), so that the
# script a GPU machine runs cannot rot; fails when a section does
gpu-check-dry: $(STAMP)
	$(PY) benchmarks/gpu_check.py --device cpu --quick --out $${TMPDIR:-/tmp}/attnlab-gpu-check-dry.json > /dev/null

$(DOCS_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(PIP) install --quiet -c constraints.txt -e '.[docs]'
	$(PY) -m ipykernel install --sys-prefix --name attnlab --display-name "attnlab (.venv)"
	touch $(DOCS_STAMP)

# each tutorial runs again only when its .py is newer than its executed notebook (order-only on
# the stamp: reinstalling the tools does not rerun them); wall times go to timings.json
docs/tutorials/%.ipynb: docs/tutorials/%.py | $(DOCS_STAMP)
	$(PY) docs/tools/run_tutorial.py $< $@ --kernel $(KERNEL) --timings docs/tutorials/timings.json

tutorials: $(TUTORIALS)

docs: $(DOCS_STAMP) $(TUTORIALS)
	$(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP) $(TUTORIALS)
	$(PY) -m mkdocs serve --strict --dev-addr 127.0.0.1:8000

# the site `make docs` built, in headless Chromium: pages render, navigation and search work,
# nothing is requested from outside localhost; screenshots in site-check/. (Not on `docs`: .ci/run
# builds the site once, then checks it.)
docs-check: $(STAMP) browser
	$(PY) docs/tools/check_site.py site --shots site-check

demo: $(STAMP)
	$(VENV)/bin/attnlab demo

clean:
	rm -rf $(VENV)
