# Fresh-machine entry points: `make run` (the main job on this machine) and `make test`.
# Both install what they need: apt packages (openssh-server for the test hosts), the venv, pip packages.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
# The system interpreter, so the venv is usable by any user on the test hosts (pyenv lives under /root).
BASE_PY := $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)
APT_PKGS := openssh-server iproute2 util-linux git

.PHONY: run test lint typecheck apt venv bench clean

$(STAMP): pyproject.toml
	@[ -x $(PY) ] || $(BASE_PY) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	$(PY) -m pip install -q -e '.[train,dev]'
	@rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# Missing packages only; nothing is started, and ssh.service is not left enabled at boot.
apt:
	@.ci/apt-install $(APT_PKGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy infra scripts trainer

test: apt venv lint typecheck
	@# Two pytest runs side by side (2 cores; the test bed's tests mostly wait on SSH and sleeps):
	@# tests/testbed (everything that needs the sshd test bed) and the rest. Both must pass (5:
	@# PYTEST_ARGS, e.g. -k, selected none of one kind); the bed's output follows.
	@bed_log=$$(mktemp); \
	$(VENV)/bin/python -m pytest -q -ra tests/testbed $(PYTEST_ARGS) > "$$bed_log" 2>&1 & bed=$$!; \
	GPUTRAIN_SKIP_TRACE_CHECK=1 $(VENV)/bin/python -m pytest -q -ra tests --ignore=tests/testbed $(PYTEST_ARGS); \
	rest=$$?; wait $$bed; bed_rc=$$?; \
	echo "--- the SSH test bed's tests (run alongside the above) ---"; cat "$$bed_log"; rm -f "$$bed_log"; \
	case "$$rest $$bed_rc" in "0 0"|"0 5"|"5 0") ;; *) exit 1 ;; esac

run: venv
	$(VENV)/bin/gputrain run --local --yes

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
