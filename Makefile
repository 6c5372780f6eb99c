# Two entry points do all set-up on a fresh Debian 12 machine (as root):
#   make demo   install what is missing, then profile a real QUIC transfer
#   make test   install what is missing, then run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# `go tool pprof` reads qprof's pprof export in the tests: Debian's Go only where no Go is installed
GO_PACKAGE := $(if $(shell command -v go || ls /usr/local/go/bin/go 2>/dev/null),,golang-go)
# qprof's native folder (collectors/perffold) needs Rust 1.88+: Debian 12's own (1.96, bookworm-security) where
# no cargo is installed
RUST_PACKAGES := $(if $(shell command -v cargo || ls $(HOME)/.cargo/bin/cargo 2>/dev/null),,rustc-web cargo-web)
APT_PACKAGES := linux-perf bpftrace bpftool ngtcp2-server ngtcp2-client openssl gcc libc6-dev libssl-dev iproute2 ethtool \
                libngtcp2-dev libngtcp2-crypto-gnutls-dev libnghttp3-dev libgnutls28-dev pkg-config \
                cmake libclang-dev util-linux clang libbpf-dev chromium curl binutils debuginfod $(GO_PACKAGE) \
                $(RUST_PACKAGES)

.PHONY: demo test setup system-deps venv folder clean

demo: setup
	$(BIN)/qprof demo

test: setup
	$(BIN)/python -m pytest -ra $(PYTEST_ARGS)

setup: system-deps venv folder

# the native folder, built once per source and toolchain (cached under ~/.cache/qprof/perffold)
folder: venv
	$(BIN)/python -m qprof.collectors.nativefold

# Installs only the Debian packages that are missing (apt needs root).
system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BIN)/qprof: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

venv: $(BIN)/qprof

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
