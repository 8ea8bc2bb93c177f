# The two commands: `make demo` and `make test`. Both run `make setup` first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: setup demo test lint clean

setup: $(STAMP)
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (apt)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server; }

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/vcrawl demo

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) crawl-data .pytest_cache
