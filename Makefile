# clodex — build, test and run targets. `make help` lists them.

GO       ?= go
# The Go release the project is built and tested with is go.mod's toolchain
# line (it carries the standard-library security fixes govulncheck asks
# for). The go command fetches it from the module proxy once; machines
# default to GOTOOLCHAIN=local, which would ignore that line.
export GOTOOLCHAIN ?= $(shell sed -n 's/^toolchain //p' go.mod)
TOOL     := $(GO) tool -modfile=tools/go.mod
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE    ?= clodex
# The commit's time is the image's creation time (BuildKit reads the build
# argument), so two builds of one commit give one image.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: help build image demo demo-test test lint vet fmt generate check-generated bench bench-controlplane bench-pool bench-fleet turnpath mutation run claude clients console-shots clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build every binary into ./bin (static, reproducible; the image's build command)
	@GO=$(GO) ./scripts/build.sh bin $(VERSION)

image: ## build the container image $(IMAGE):$(VERSION) (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) --build-arg SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
		-t $(IMAGE):$(VERSION) .

test: ## the whole test suite (what CI runs): generated code, format, vet, race tests, real clients
	./scripts/test.sh

lint: check-generated ## gofmt, go vet, golangci-lint (.golangci.yml), govulncheck, buf lint
	./scripts/lint.sh

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt the tree
	gofmt -w $$(git ls-files '*.go')

generate: ## regenerate protobuf and gRPC code with the pinned buf and plugins
	$(TOOL) buf generate

check-generated: ## fail when committed generated code is stale
	./scripts/check-generated.sh

bench: ## microbenchmarks and the control-plane RPC benchmark, side by side
	$(GO) test -run='^$$' -bench=. -benchmem ./internal/pacing ./controlplane ./controlplane/store ./internal/codexsim ./dataplane/translate ./dataplane/retry ./dataplane/control
	$(GO) test -run='^$$' -bench='IdleHeadMemory|UpstreamBytes30Turns|SubagentFanOutSockets' -benchtime=1x -benchmem ./dataplane/pool
	./scripts/bench-controlplane.sh

bench-controlplane: ## Admit on the memory and Redis stores vs a no-op RPC floor over real loopback listeners
	./scripts/bench-controlplane.sh

bench-pool: ## memory per idle pooled conversation with real sockets to clodex-sim, bytes saved, fan-out sockets
	./scripts/bench-pool.sh

bench-fleet: ## 3 data planes against one account: central vs per-host pacing, a control-plane outage, a replica killed; 2x2 accuracy over Redis
	./scripts/bench-fleet.sh

turnpath: ## the data-plane files and packages a new-socket turn and a held-socket turn run through (coverage builds, clodex-sim)
	$(GO) run ./scripts/turnpath $(ARGS)

mutation: ## mutation testing of the pacing core (slow; not part of `make test`)
	$(TOOL) gremlins unleash --integration=false --workers 1 --threshold-efficacy 90 ./internal/pacing

demo: build ## the team set-up on loopback (Redis, two replicas with the broker, scoped agents, two data planes, clodex-sim), traced into Jaeger; a fan-out; a summary and one trace's URL
	@jaeger=$$(./scripts/build-jaeger.sh) && $(GO) run ./scripts/demo --bin bin --jaeger "$$jaeger" $(ARGS)

demo-test: build ## the demo's browser test: headless Chromium on the trace page (needs chromium and a built Jaeger UI in CLODEX_JAEGER_UI)
	@jaeger=$$(./scripts/build-jaeger.sh) && CLODEX_JAEGER="$$jaeger" CLODEX_BIN="$(CURDIR)/bin" \
		$(GO) test -tags demo -count=1 -v -timeout 10m ./scripts/demo

run: ## run clodex: the data plane, in front of the emulator when ~/.codex/auth.json is missing
	./scripts/run.sh

claude: build ## run your Claude Code on clodex (the running data plane, or one started for the session); ARGS="..." go to claude; CLODEX_MEMBER_KEY_FILE=FILE uses a team's data plane (CLODEX_LISTEN) with your member key
	./bin/clodex-dataplane claude $(ARGS)

console-shots: ## screenshots of the web console (headless Chromium) into ./console-shots, or DIR=...
	./scripts/console-shots.sh $(DIR)

clients: ## install the pinned Claude Code and Codex CLI (and tmux) used by the end-to-end tests
	./scripts/install-clients.sh

clean: ## remove build output
	rm -rf bin
