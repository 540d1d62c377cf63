# The README's quick start: `make run` (set up, then run the pipeline locally) and
# `make test` (set up, then lint and the fast tests). Both create .venv on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU wheel by default (CI, laptops); on a GPU host: make run TORCH=torch (a CUDA build).
TORCH  ?= torch==2.13.0
RUN_ARGS ?=
# torch's wheels (about 3 GB), downloaded once per machine and installed from here: pip's own
# cache keeps nothing where the index sends no cache headers. scripts/node/image.sh shares it.
WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/draslice/wheels

# The tests that `make test` leaves out: slow ones (the whole pipeline, wheels) run in
# `make test-slow`; kfp, cluster and node ones need Go and run in their own targets.
FAST   := not slow and not kfp and not cluster and not node

.PHONY: setup run test test-slow test-all lint compile manifests cli-docs bench clean \
	kfp-backend test-kfp test-cluster test-node image allocator dist FORCE

# The torch choice is part of the stamp: `make run TORCH=torch` on an existing .venv
# rewrites $(VENV)/.torch, which makes .installed stale, which reinstalls torch.
$(VENV)/.torch: FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH)' | cmp -s - $@ || echo '$(TORCH)' > $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip uninstall -q -y torch 2>/dev/null || true
	$(PY) -m pip download -q --dest $(WHEELS) "$(TORCH)"
	$(PY) -m pip install -q --no-index --find-links $(WHEELS) "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed allocator

# Preflight's DRA allocator (cluster/allocator, Go): one binary per Kubernetes minor release of
# cluster/allocator/releases.txt, built into ~/.cache/draslice/allocator (keyed by release,
# go.sum and sources), so it is a no-op once built; needs Go 1.26+ (docs/preflight.md).
allocator: $(VENV)/.installed
	$(PY) -m draslice.cluster.allocator build

# Wheels for pip users without Go: one per platform carrying the allocator binaries
# (CGO_ENABLED=0 cross-compilation), and a pure one with the Go sources for any other machine.
ALLOCATOR_PLATFORMS ?= linux-amd64 linux-arm64 darwin-arm64
dist: $(VENV)/.installed
	rm -rf build/allocator build/lib dist
	for p in $(ALLOCATOR_PLATFORMS); do \
	  $(PY) -m draslice.cluster.allocator build --platform $$p --out build/allocator/$$p \
	    && DRASLICE_WHEEL_PLATFORM=$$p $(PY) -m pip wheel --no-deps --no-build-isolation -q \
	         -w dist . || exit 1; \
	done
	$(PY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	ls -l dist

run: setup
	$(VENV)/bin/draslice run $(RUN_ARGS)

# ruff, then the architecture: import-linter's contracts in pyproject.toml (layers, the trainer
# without kfp or kubernetes, no cycles); a wrong arrow fails naming the importing line.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache --no-logo

# pytest exits 5 when it collected no test: that fails each test target, as it should.
# Each passes its own -m, which replaces the one in pyproject's addopts (the last -m wins).
test: lint allocator
	$(VENV)/bin/pytest -m "$(FAST)"

# The slow tier: the whole pipeline under kfp.local, wheels, torch.compile, the benchmark runs.
test-slow: setup
	$(VENV)/bin/pytest -m "slow and not kfp and not cluster and not node"

# Everything except the kfp and cluster tests, which keep their own targets.
test-all: lint allocator
	$(VENV)/bin/pytest -m "not kfp and not cluster and not node"

compile: setup
	$(VENV)/bin/draslice compile

manifests: setup
	$(VENV)/bin/draslice manifests all --out manifests

# docs/cli.md from every command's --help (a test fails when it is stale).
cli-docs: setup
	$(PY) -m draslice.cli.docs --out docs/cli.md

bench: setup
	$(PY) benchmarks/local_run.py

# KFP's own API server and driver from the Go module proxy (docs/kfp.md): exits 3, naming the
# module, while the proxy refuses github.com/kubeflow/pipelines, as it does on these machines.
kfp-backend:
	bash scripts/kfp_backend_build.sh

# The tests that link KFP's own Go code that the proxy does serve (its cron library); KFP's API
# server is not among them while kfp-backend cannot build it (docs/kfp.md).
test-kfp: setup
	$(VENV)/bin/pytest -m kfp tests/kfp

# A real control plane (kube-apiserver, controller-manager, scheduler, etcd built from upstream's
# Go modules, cached by version outside the repo) and the tests against it (docs/cluster-tests.md).
test-cluster: setup
	bash scripts/cluster/test.sh

# A real node on that control plane (kubelet, containerd, runc, CNI, Kubernetes' DRA test driver,
# the trainer image built from trainer/Dockerfile) and the pipeline's pods run on it
# (docs/cluster-tests.md). Needs root; everything it builds is cached by version outside the repo.
test-node: setup
	bash scripts/node/test.sh

# The trainer image from trainer/Dockerfile with buildah and local base images, no registry
# (as root; cached by content in ~/.cache/draslice/images): docs/kfp-commands.md.
image: setup
	bash scripts/node/image.sh

FORCE:

clean:
	rm -rf $(VENV) runs build dist *.egg-info
