# Two commands do everything on a fresh machine with Python 3.11+:
#   make lab    set up, then open the course in JupyterLab
#   make test   set up, then run every test (unit tests + every notebook in smoke mode)
# Set-up is idempotent: a second run costs seconds unless pyproject.toml changed.

SHELL := /bin/bash
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do command -v $$p >/dev/null && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' && { echo $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
KERNEL := gpu-inference-course
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS := $(if $(HAS_GPU),gpu,cpu),dev
STAMP := $(VENV)/.setup-$(subst $(comma),-,$(EXTRAS))
comma := ,
JOBS ?= 2
TEST_RESULTS := build/test-results
NB_TIMEOUT ?= 900

.PHONY: setup lab test unit notebooks-test lint notebooks checksums gpu-test gpu-check course clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11 or newer is needed (python3.11 or python3.12 on PATH)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps tritonclient==2.73.0
	@if [ -n "$(HAS_GPU)" ]; then \
	  $(PY) -m pip install -q pycuda || echo "pycuda did not build here (it needs CUDA headers); the course runs without it"; \
	fi
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "GPU inference course" >/dev/null
	@rm -f $(VENV)/.setup-*; touch $@
	@echo "Set-up done ($(EXTRAS)); $(if $(HAS_GPU),NVIDIA GPU found: GPU extras installed,no NVIDIA GPU: CPU set-up)."

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 --LabApp.extension_manager=readonly \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

# ruff, then unit tests and every notebook at smoke sizes (results into build/test-results); then, alone,
# the checks on the whole run (section record, rows per lesson) and the timer-agreement test.
test: setup
	$(VENV)/bin/ruff check course_utils tests scripts
	$(VENV)/bin/ruff format --check course_utils tests scripts
	@rm -rf $(TEST_RESULTS); mkdir -p $(TEST_RESULTS)
	COURSE_SMOKE=1 COURSE_RESULTS_DIR=$(CURDIR)/$(TEST_RESULTS) MPLBACKEND=agg \
	  $(PY) -m pytest -q -n $(JOBS) --nbmake --nbmake-timeout=$(NB_TIMEOUT) tests notebooks; \
	  rc=$$?; [ $$rc -eq 5 ] && rc=0; [ $$rc -eq 0 ] || exit $$rc
	COURSE_SMOKE=1 COURSE_RESULTS_DIR=$(CURDIR)/$(TEST_RESULTS) COURSE_AFTER_RUN=1 \
	  $(PY) -m pytest -q tests/after_run

lint: setup
	$(VENV)/bin/ruff check course_utils tests scripts
	$(VENV)/bin/ruff format --check course_utils tests scripts

# Regenerate notebooks/*.ipynb from their text copies in lessons/*.py (the files you edit); ONLY="08 14" for some.
notebooks: setup
	$(PY) -m course_utils.nbcheck --build $(ONLY)

# CUDA machines: every lesson in strict GPU mode (a skipped GPU section fails), full sizes; writes data/reference/.
gpu-test: setup
	$(PY) -m scripts.gpu_check --size full --budget 3600

# The same in smoke sizes within a 10-minute budget (also works offline, with --wheels DIR for missing packages).
gpu-check: setup
	$(PY) -m scripts.gpu_check --size smoke --budget 540

# Run every notebook headless at full size into build/course/ (outputs kept) and render build/course/index.html
# (each notebook as HTML, what ran / was skipped and why, wall times, the leaderboard).
# COURSE_SMOKE=1 make course for a quick pass; ONLY="00 14" to run some notebooks.
course: setup
	MPLBACKEND=agg $(PY) -m scripts.run_course --out build/course $(if $(ONLY),--only $(ONLY))

checksums: setup
	$(PY) -m scripts.checksums

clean:
	rm -rf build .pytest_cache
