# Entry points: `make demo` runs the main job (the GPT-3 175B / 1,024 A100 plan and its report),
# `make test` the test suite (a few hundred fuzz cases included) but for the tests marked slow, which
# `make test-slow` runs, `make test-loaded` the tests that measure this machine with every core kept
# busy by another process (`.ci/run` runs all three), `make fuzz` 20,000 fuzz cases.
# Each creates (once) a virtual environment with the package installed in editable mode, at the
# versions of constraints.txt; the stamp file reinstalls it when setup.cfg, pyproject.toml or
# constraints.txt change.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
FUZZ_CASES ?= 20000

.PHONY: demo test test-slow test-loaded fuzz clean chromium

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,calibration]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/simulator search --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch-size 1536 \
		--tokens 300e9 --pareto out/pareto_gpt3_175b.png --trace out/best_plan_trace.json
	$(BIN)/simulator report --out out/report

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -m "not slow"

# the tests that run the reference loop, the whole report or a whole measuring session for real
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The tests that measure this machine (marker `measures`), each beside one spinning process per core
# (tests/load.py; SIMULATOR_TEST_HOG=N for another count): one that passes only on a quiet machine fails here.
test-loaded: $(STAMP)
	$(BIN)/python -m pytest -q -m measures -p tests.load

# The HTML report's test renders the page in headless Chromium. Install Debian's package where we
# can (root with apt-get); anywhere else, or if the install fails, that one test is skipped.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the HTML report's browser test"; \
		export DEBIAN_FRONTEND=noninteractive; \
		{ timeout 900 apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
		  { timeout 600 apt-get update >/dev/null 2>&1 && \
		    timeout 900 apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; } || \
		echo "could not install chromium: the HTML report's browser test will be skipped"; \
	else echo "no chromium (and no root apt-get to install it): the HTML report's browser test will be skipped"; fi

# random cases (new ones each run); the summary at the end says what they ended in
fuzz: $(STAMP)
	SIMULATOR_FUZZ_CASES=$(FUZZ_CASES) $(BIN)/python -m pytest -q -m fuzz tests/test_fuzz.py tests/test_fuzz_inputs.py \
		tests/test_fuzz_files.py tests/test_fuzz_outputs.py

clean:
	rm -rf build dist *.egg-info
