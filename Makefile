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

apt:
	@missing=""; \
	for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy infra scripts trainer

test: apt venv lint typecheck
	$(VENV)/bin/python -m pytest -q -ra $(PYTEST_ARGS)

run: venv
	$(VENV)/bin/gputrain run --local --yes

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
