# fraudlens: the two commands the README promises.
#   make demo   -> creates .venv, installs fraudlens, opens the dashboard on the bundled demo
#   make test   -> creates .venv if needed, installs test extras, runs the whole test suite
#   make lock   -> re-resolves requirements.lock from pyproject.toml (then run make test and commit both)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8501

# Every package at the exact version CI tested (requirements.lock, made by uv from pyproject.toml);
# fraudlens itself is installed editable on top, without re-resolving anything.
$(BIN)/fraudlens: pyproject.toml requirements.lock
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $(BIN)/fraudlens

install: $(BIN)/fraudlens

# demo mode: a demo user is signed in automatically, on 127.0.0.1 only (a banner on every page says so)
demo: install
	$(BIN)/fraudlens dashboard --demo --port $(PORT)

test: install
	$(BIN)/python -m pytest -n 2 -q

lock:
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --extra test --extra ray --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 $(if $(wildcard /opt/wheels),--find-links /opt/wheels) --annotation-style line \
	  -o requirements.lock

.PHONY: install demo test lock
