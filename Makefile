# tierfs: two commands from a fresh Debian machine (as root) to a running mount
# or a green test suite. Everything below installs only what is missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
SYSPKGS := fuse3 libfuse3-dev pkg-config patch
STAMP := $(VENV)/.installed
TORCH_STAMP := $(VENV)/.torch-tried

.PHONY: run test lint docs sysdeps venv clean csi-proto

run: $(STAMP)
	$(VENV)/bin/tierfs demo

test: $(STAMP) $(TORCH_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

# The optional torch extra for the checkpoint tests: tried once; where it cannot be
# installed those tests skip and say why.
$(TORCH_STAMP): $(STAMP)
	@if $(PY) -m pip install -q -e '.[torch]' > $(VENV)/torch-install.log 2>&1; then \
	  echo "torch installed: the torch checkpoint tests run"; \
	else \
	  echo "torch could not be installed ($(VENV)/torch-install.log): those tests will skip"; \
	fi
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Regenerate the options table in docs/options.md from the schema.
docs: $(STAMP)
	$(PY) -m mount_options.docs > docs/options.md

# Regenerate the CSI gRPC stubs (committed; tests/test_csi_proto.py checks they match the .proto).
csi-proto: $(STAMP)
	$(PY) -m tierfs.csi.proto.generate tierfs/csi/proto

sysdeps:
	@missing=""; \
	for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v python3 >/dev/null || missing="$$missing python3"; \
	python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	python3 -c 'import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml deploy/pyfuse3/build.sh deploy/pyfuse3/tierfs.patch | sysdeps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	deploy/pyfuse3/build.sh $(PY)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# Install /sbin/mount.tierfs (mount -t tierfs, fstab lines) pointing at this venv's helper.
# Another directory: make install-helper HELPER_PREFIX=/usr/local/sbin
HELPER_PREFIX ?= /sbin
.PHONY: install-helper
install-helper: $(STAMP)
	$(VENV)/bin/tierfs install-helper --prefix $(HELPER_PREFIX)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis

# Benchmarks (README, "Benchmarks"; code in benchmarks/): tierfs against
# rclone, the GCS client used directly, local disk and tmpfs, on the embedded emulator,
# plain and through a GCS-shaped link. bench-quick: small sizes, under 3 minutes.
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_PKGS := fio
.PHONY: bench bench-quick bench-deps bench-shared

bench-deps: $(STAMP)
	@missing=""; \
	for p in $(BENCH_PKGS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@test -f $(BENCH_STAMP) -a $(BENCH_STAMP) -nt pyproject.toml || \
	  { $(PY) -m pip install -q -e '.[test,bench]' && touch $(BENCH_STAMP); }

bench: bench-deps
	$(PY) -m benchmarks

bench-quick: bench-deps
	$(PY) -m benchmarks --quick

# The shared tier (docs/shared-tier.md): 4 mounts restoring one 1 GiB checkpoint at once.
bench-shared: bench-deps
	$(PY) -m benchmarks.shared_restore --repeat 2
