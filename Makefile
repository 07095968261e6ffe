# joblease developer entry points. The README's two commands are `make demo` and `make test`;
# both set up everything they need on a fresh machine (venv, pinned deps, cluster binaries).
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

.PHONY: setup binaries control-plane demo test unit lint bench soak mutate clean-cache help sync-crds

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==26.3
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) ## create .venv with the pinned dependencies

binaries: setup ## build (or reuse) the control plane, kwok, helm, and the real node's kubelet, containerd, buildkit
	$(BIN)/joblease build etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm \
	  kubelet containerd containerd-shim-runc-v2 ctr buildkitd buildctl

control-plane: setup ## build (or reuse) only etcd and the control plane (demo, bench)
	$(BIN)/joblease build etcd kube-apiserver kube-controller-manager kube-scheduler kubectl

demo: control-plane ## the A/B fencing demo on the embedded local control plane
	$(BIN)/joblease demo

test: binaries ## lint, types, and every test (unit + real control plane + PostgreSQL)
	$(BIN)/ruff check operator tests e2e bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -m 'not slow' --junitxml=artifacts/junit.xml

unit: setup ## pure unit tests only (seconds, no servers)
	$(BIN)/pytest -m unit

lint: setup
	$(BIN)/ruff check operator tests e2e bench
	$(BIN)/mypy
	$(BIN)/lint-imports

soak: binaries ## long randomized fault soak (SOAK_RUNS=200 by default)
	$(BIN)/python -m tests.faults.soak --runs $${SOAK_RUNS:-200}

bench: control-plane ## benchmarks; prints a table, writes bench/results/
	$(BIN)/pip install -q -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench

mutate: setup ## mutation testing (mutmut) of domain, kube/transact.py, sdk; MODULES="domain transact" to narrow
	$(BIN)/pip install -q -c constraints.txt -e '.[mutate]'
	$(BIN)/python -m tests.mutation.mutate $(MODULES)

sync-crds: ## copy crds/*.yaml into the Helm chart (tests/unit/test_crd_drift.py checks it)
	cp crds/*.yaml charts/joblease-operator/crds/

clean-cache: ## remove the cluster binaries cache (~/.cache/joblease)
	rm -rf $${JOBLEASE_CACHE_DIR:-$$HOME/.cache/joblease}
