# Two entry points for a new user: `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
REBOUND := target/release/rebound
AGENT := guest/agent/rebound-agent

.PHONY: deps build agent image demo test lint unit clean

deps:
	@scripts/install-deps.sh

agent: deps
	$(MAKE) -C guest/agent

build: deps agent
	$(CARGO) build --release --workspace --bins --lib

image: build
	$(REBOUND) image build default

demo: image
	scripts/demo.sh

lint: deps
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# Every test: lint, unit tests, and integration tests that boot real guests under QEMU.
# Each test's daemon reports the counters it moved; a counter no test moves fails the run.
METRICS_MOVED := $(CURDIR)/target/metrics-moved
test: image lint
	rm -rf $(METRICS_MOVED)
	REBOUND_METRICS_MOVED=$(METRICS_MOVED) $(CARGO) test --release --workspace -- --test-threads=2
	scripts/check-metrics-moved.sh $(METRICS_MOVED)

# The exclusive host cache's correctness checks turned off one at a time in a test build
# of the backend: the stress test must catch the wrong data (about 2 minutes).
.PHONY: test-faults
test-faults: image
	$(CARGO) build --release -p rebound-blk --features check-faults --bin rebound-blk-faulty
	$(CARGO) test --release -p rebound --test integration hcache_stress:: -- --ignored --nocapture --test-threads=1

# The panic backtrace in `crash` with the guest kernel's debug symbols (fetches ~860 MB once).
.PHONY: test-debug-kernel
test-debug-kernel: image
	scripts/debug-kernel.sh
	$(CARGO) test --release -p rebound-dump --test integration backtrace:: -- --ignored --test-threads=1

# Every parser of untrusted bytes under cargo-fuzz on nightly, FUZZ_SECONDS (20) each:
# a few minutes after the first build. `make test` runs the corpus on stable.
.PHONY: fuzz
fuzz:
	scripts/fuzz.sh

clean:
	$(CARGO) clean
	$(MAKE) -C guest/agent clean
