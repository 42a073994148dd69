# Two entry points: `make demo` runs the main job (the GPT-3 175B / 1,024 A100 plan and its report),
# `make test` the test suite.
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
	mkdir -p out
	$(BIN)/simulator search --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch-size 1536 \
		--tokens 300e9 --pareto out/pareto_gpt3_175b.png --trace out/best_plan_trace.json
	$(BIN)/simulator report --out out/report

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf build dist *.egg-info
