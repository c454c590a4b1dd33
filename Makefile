# Fresh-machine entry points: `make run` (the main job on this machine) and `make test`.
# Both install what they need: apt packages (openssh-server for the test hosts), the venv, pip packages.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
# The system interpreter, so the venv is usable by any user on the test hosts (pyenv lives under /root).
BASE_PY := $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
# The project in "compat" editable mode: a plain path in a .pth, where the default mode's import
# finder costs every Python start in this venv ~6 ms (the test hosts' checks, torchrun, tests).
EDITABLE := --config-settings editable_mode=compat
STAMP := $(VENV)/.installed-$(shell echo '$(EDITABLE)' | cat pyproject.toml - | md5sum | cut -c1-12)
APT_PKGS := openssh-server iproute2 util-linux git zstd podman runc docker-registry busybox-static
# the run report opened in a browser (a test skipped where the distribution cannot install it)
APT_OPTIONAL := chromium

# Packages that nothing on the test hosts imports, left to compile on first import (as root, who
# can write their caches): Pulumi's GCP provider (the program imports a fifth of it), the Vertex
# SDK's parts beside the aiplatform_v1 client the controller uses, the type checker, a debugger.
# Half of the venv's source (the fresh install's figures: benchmarks page).
NOT_PRECOMPILED := pulumi_gcp google/cloud/aiplatform google/cloud/aiplatform_v1beta1 google/genai \
	vertexai vertex_ray agentplatform debugpy mypy mypyc fontTools pygments pyasn1_modules
space := $() $()
NOT_PRECOMPILED_RE := /site-packages/($(subst $(space),|,$(strip $(NOT_PRECOMPILED))))/

# Bytecode caches are written (in gitignored __pycache__ folders) even where the environment sets
# PYTHONDONTWRITEBYTECODE, as some CI images do: without them every Python process of a test run
# compiles again what it imports (the modules left out above, the project's, each test file's
# rewritten asserts).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-node-torch lint typecheck apt venv bench docs clean

$(STAMP): pyproject.toml
	@[ -x $(PY) ] || $(BASE_PY) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	$(PY) -m pip install -q --no-compile -e '.[train,dev]' $(EDITABLE)
	@# pip byte-compiles one file at a time, compileall on every core. A file that does not
	@# compile (torch's py312-only test helpers) is skipped, as pip skips it; the test hosts'
	@# user cannot write these caches on import.
	@$(PY) -m compileall -qq -j 0 -x '$(NOT_PRECOMPILED_RE)' $(VENV)/lib || true
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# Missing packages only; nothing is started, and ssh.service is not left enabled at boot.
apt:
	@.ci/apt-install $(APT_PKGS) --optional $(APT_OPTIONAL)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy infra scripts trainer gputrain_node

# The test bed's tests in three parts, each on its own test bed slot (tests/support/testbed.py:
# three per machine), beside the rest: the first two lists are a third of the bed's time each
# (by each file's measured wall and CPU: waiting tests beside CPU-heavy ones; the files whose
# recovery tests compare with the `uninterrupted` session fixture share one part, which runs
# it once), the third part is every other file in tests/testbed (a new one lands there).
BED_A := $(addprefix tests/testbed/,test_autodown.py test_lifecycle.py test_fabric.py \
	test_environment.py test_user_packages.py test_nanogpt.py test_outputs.py test_not_distributed.py)
BED_B := $(addprefix tests/testbed/,test_spot_recovery.py test_capacity.py test_laptop_closed.py \
	test_verify_gpus.py test_connect.py test_fleet_scale.py test_cli_hosts.py test_hostile_bucket.py \
	test_results_dir.py test_lost_download.py test_data.py)

# The apt packages and the venv install side by side (neither needs the other): on a fresh machine
# both are mostly unpacking, on two cores.
test:
	@$(MAKE) --no-print-directory -j 2 apt venv
	@# Four pytest runs side by side (2 cores; the test bed's tests mostly wait on SSH and sleeps):
	@# the bed's three parts and the rest (itself in two processes, pytest-xdist), with lint and
	@# typecheck beside them (one core's work, not a wait before the tests). All must pass
	@# (5: PYTEST_ARGS, e.g. -k, selected none of one kind); lint's and the bed's output follow.
	@checks=$$(mktemp); $(MAKE) --no-print-directory lint typecheck > "$$checks" 2>&1 & pc=$$!; \
	bed1=$$(mktemp); bed2=$$(mktemp); bed3=$$(mktemp); \
	$(VENV)/bin/python -m pytest -q -ra $(BED_A) $(PYTEST_ARGS) > "$$bed1" 2>&1 & p1=$$!; \
	$(VENV)/bin/python -m pytest -q -ra $(BED_B) $(PYTEST_ARGS) > "$$bed2" 2>&1 & p2=$$!; \
	$(VENV)/bin/python -m pytest -q -ra tests/testbed $(addprefix --ignore=,$(BED_A) $(BED_B)) \
		$(PYTEST_ARGS) > "$$bed3" 2>&1 & p3=$$!; \
	GPUTRAIN_SKIP_TRACE_CHECK=1 $(VENV)/bin/python -m pytest -q -ra -n 2 tests --ignore=tests/testbed $(PYTEST_ARGS); \
	rest=$$?; wait $$p1; rc1=$$?; wait $$p2; rc2=$$?; wait $$p3; rc3=$$?; wait $$pc; rcc=$$?; \
	echo "--- lint and typecheck (run alongside the above) ---"; cat "$$checks"; \
	for part in 1 2 3; do eval f=\$$bed$$part; \
		echo "--- the SSH test bed's tests, part $$part of 3 (run alongside the above) ---"; cat "$$f"; \
	done; rm -f "$$checks" "$$bed1" "$$bed2" "$$bed3"; \
	ok=1; for rc in $$rest $$rc1 $$rc2 $$rc3; do [ $$rc = 0 ] || [ $$rc = 5 ] || ok=0; done; \
	[ "$$rest $$rc1 $$rc2 $$rc3" != "5 5 5 5" ] && [ $$ok = 1 ] && [ $$rcc = 0 ]

run: venv
	$(VENV)/bin/gputrain run --local --yes

# What runs on the nodes (the reference trainer, gputrain_node) on another torch than .venv's, in a
# venv of its own: `make test-node-torch TORCH=2.9.0` (the default node image's torch; CPU, gloo).
test-node-torch: venv
	@[ -n "$(TORCH)" ] || { echo "usage: make test-node-torch TORCH=VERSION, e.g. 2.9.0"; exit 2; }
	@v=.venv-torch-$(TORCH); [ -x $$v/bin/python ] || $(BASE_PY) -m venv $$v; \
	$(PY) -c 'import sys; t = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli"); \
	print("\n".join(d for d in t.load(open("pyproject.toml", "rb"))["project"] \
	["optional-dependencies"]["train"] if not d.startswith("torch")))' > $$v/train-deps.txt && \
	$$v/bin/pip install -q "torch==$(TORCH)" -r $$v/train-deps.txt -e '.[dev]' $(EDITABLE) && \
	$$v/bin/python -m pytest -q -n 2 -p no:cacheprovider tests/trainer tests/gputrain_node

# The manual (docs/, mkdocs.yml) built strictly into a temporary directory: a broken link or anchor,
# or a page missing from the nav, fails it. `make test` builds it too (tests/test_docs.py).
docs: venv
	@site=$$(mktemp -d); $(VENV)/bin/mkdocs build --strict -d "$$site"; rc=$$?; rm -rf "$$site"; exit $$rc

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .venv-torch-* .mypy_cache .ruff_cache .pytest_cache
