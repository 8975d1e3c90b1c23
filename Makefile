# Two commands for a new user:
#   make demo   - runs the main job (CPU by default, the GPU when one is there)
#   make test   - runs the test suite (GPU tests are skipped without CUDA)
# Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(PY) $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pagedattn.cli demo $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench dev
	$(BIN)/ruff format --check src tests bench dev

bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(ARGS)

clean:
	rm -rf $(VENV)
