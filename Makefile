# make test   installs what the tests need (into .venv) and runs them
# make demo   installs, fetches a real draft/target pair, exports it, generates with stats
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the CPU build of torch; an unpinned torch pulls a multi-GB CUDA build
TORCH ?= torch==2.13.0

.PHONY: install test demo clean

install: $(VENV)/.installed

# the ray extra runs tests/test_serve_ray.py (two replicas on Ray Serve, ~25 s) instead of skipping it; it is
# ~80 MB to fetch and ~360 MB installed (26 s here)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[export,test,serve,ray,structured]'
	touch $@

test: install
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/python -m specedge.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
