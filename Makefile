# The two commands of the README: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-all browser clean

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

demo: $(STAMP)
	$(VENV)/bin/attnlab demo

clean:
	rm -rf $(VENV)
