# joblease developer entry points. The README's two commands are `make demo` and `make test`;
# both set up everything they need on a fresh machine (venv, pinned deps, cluster binaries).
PY        ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

LC        := $(BIN)/joblease-localcluster
LINTED    := operator localcluster tests e2e bench

.PHONY: setup binaries control-plane demo test unit lint bench bench-scale soak pool-chaos clean-cache help sync-crds sim mutate \
        os-packages-demo os-packages-test e2e-kind

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# Two distributions from this repository, both editable: the product (`joblease`, source root
# operator/) and the local cluster the tests, demo and benchmarks run on (`joblease-localcluster`,
# localcluster/; never in the product's wheel or image).
$(STAMP): pyproject.toml constraints.txt localcluster/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==26.3
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]' -e ./localcluster
	touch $(STAMP)

setup: $(STAMP) ## create .venv with the pinned dependencies

# The OS packages each README command needs (one table: .ci/os-packages, also used by .ci/run).
# As root they are installed; otherwise one `sudo apt-get install …` line and a failure.
os-packages-demo:
	.ci/os-packages demo

os-packages-test:
	.ci/os-packages test

binaries: os-packages-test setup ## build (or reuse) the control plane, kwok, helm, promtool, and the real node's kubelet, containerd, buildkit
	$(LC) build etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm promtool \
	  kubelet containerd containerd-shim-runc-v2 ctr buildkitd buildctl

control-plane: os-packages-demo setup ## build (or reuse) only etcd and the control plane (demo, bench)
	$(LC) build etcd kube-apiserver kube-controller-manager kube-scheduler kubectl

demo: control-plane ## the A/B fencing demo on the embedded local control plane
	$(LC) demo

test: binaries ## lint, types, and every test (unit + real control plane + PostgreSQL)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -m 'not slow' --durations=25 --junitxml=artifacts/junit.xml

unit: setup ## pure unit tests only (seconds, no servers)
	$(BIN)/pytest -m unit

lint: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy
	$(BIN)/lint-imports

e2e-kind: setup ## kind offline (issue 32, docs/kind.md): the chart with its defaults on a pod network and the journeys; exit 0 only when all pass, else names the step
	.ci/os-packages kind
	$(BIN)/python -m joblease_localcluster.kindrun --pytest "$${E2E_KIND_PYTEST:-}"

soak: binaries ## long randomized fault soak (SOAK_RUNS=200 by default)
	$(BIN)/python -m tests.faults.soak --runs $${SOAK_RUNS:-200}

pool-chaos: binaries ## work-pool chaos: 200 jobs, 8 killed/paused `joblease work` processes (JOBLEASE_POOL_SEED replays)
	$(BIN)/python -m tests.faults.pool_chaos --jobs $${POOL_JOBS:-200}

bench: control-plane ## benchmarks; prints a table, writes bench/results/
	$(BIN)/pip install -q -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench

bench-scale: control-plane ## the scale section at 100,000 JobLeases (SCALE_LEASES=…): start, restart, relist, expiry, TTL, pool; over 30 minutes here
	$(BIN)/pip install -q -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench --only scale --leases $${SCALE_LEASES:-100000} --out bench/results/scale

mutate: setup ## mutation testing (mutmut) of domain, kube/transact.py, sdk; MODULES="domain transact" to narrow
	$(BIN)/pip install -q -c constraints.txt -e '.[mutate]'
	$(BIN)/python -m tests.mutation.mutate $(MODULES)

sync-crds: ## copy crds/*.yaml into the Helm chart and the local cluster's package data (tests/unit/test_crd_drift.py checks both)
	cp crds/*.yaml charts/joblease-operator/crds/
	cp crds/*.yaml localcluster/src/joblease_localcluster/data/

clean-cache: ## remove the cluster binaries cache (~/.cache/joblease)
	rm -rf $${JOBLEASE_CACHE_DIR:-$$HOME/.cache/joblease}

sim: setup ## deterministic simulation of the whole protocol (SIM_MINUTES=1 by default)
	$(BIN)/python -m tests.sim --minutes $${SIM_MINUTES:-1}
