# fraudlens: the two commands the README promises.
#   make demo   -> creates .venv, installs fraudlens, opens the dashboard on the bundled demo
#   make test   -> creates .venv if needed, installs test extras, runs the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8501

$(BIN)/fraudlens: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/fraudlens

install: $(BIN)/fraudlens

# demo mode: a demo user is signed in automatically, on 127.0.0.1 only (a banner on every page says so)
demo: install
	$(BIN)/fraudlens dashboard --demo --port $(PORT)

test: install
	$(BIN)/python -m pytest -n 2 -q

.PHONY: install demo test
