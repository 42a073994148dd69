# Two entry points: `make demo` runs the main job, `make test` the test suite.
# Both create (once) a virtual environment with the package installed in editable mode;
# the stamp file reinstalls it when setup.cfg or pyproject.toml change.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[test,calibration]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/simulator memory --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 \
		--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --sequence-parallel \
		--recompute-granularity selective --micro-batch-size 1 --global-batch-size 1536

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf build dist *.egg-info
