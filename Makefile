# Two commands for a newcomer on a fresh Debian 12 machine:
#   make train   installs what is missing, builds, trains the MoE default on the embedded corpus
#                (configs/tiny_moe.json) on 4 MPI ranks (data parallel 4, expert parallel 2) under the
#                fault-tolerant supervisor, `moe launch`
#   make test    installs what is missing, builds, runs the whole test suite
# Other targets: make build, make bench, make ablate (README "Ablations"), make deps, make clean, make
# test-sanitize (the tests without MPI under AddressSanitizer and UndefinedBehaviorSanitizer).

BUILD   ?= build
CONFIG  ?= configs/tiny_moe.json
RUN_DIR ?= runs/tiny_moe
# make train runs NP ranks under mpirun: data parallel over all of them, experts split over EP of them.
NP      ?= 4
EP      ?= 2
# Small machines: ranks may outnumber cores, so idle ranks yield and nothing is bound to a core.
MPI_ARGS ?= --mpirun-arg=--oversubscribe --mpirun-arg=--bind-to --mpirun-arg=none \
            --mpirun-arg=--mca --mpirun-arg=mpi_yield_when_idle --mpirun-arg=1
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

# Debian packages the build needs (docs/design.md); libopenblas-openmp-dev gives OpenBLAS on
# the same OpenMP runtime as the rest of the code; chromium (headless) is the browser the report's test opens
# `moe report`'s pages in; python3-h5py is what a test reads checkpoints with, as a user without this program
# would (docs/checkpoint.md); libprotobuf-dev, protobuf-compiler and libboost-dev (Boost.CRC) write TensorBoard's
# event files, and python3-venv makes the environment their test installs TensorBoard into; iproute2 makes the
# simulated hosts of tests/cluster (network namespaces, a bridge, tc), on which slurm-wlm and munge run the Slurm
# example for real (docs/design.md "Dependencies").
DEBIAN_PACKAGES := build-essential cmake libcli11-dev nlohmann-json3-dev libgtest-dev libopenblas-dev \
                   libopenblas-openmp-dev libxxhash-dev zlib1g-dev libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools \
                   clang-format chromium python3-h5py libprotobuf-dev protobuf-compiler libboost-dev python3-venv \
                   iproute2 slurm-wlm munge

.PHONY: all deps configure build train test test-sanitize bench ablate clean

all: build

deps:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make: installing Debian packages:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else \
	    echo "make: missing Debian packages. Install them with:"; \
	    echo "  sudo apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Through the supervisor (moe launch): mpirun on NP ranks, heartbeats, a checkpoint every 50 steps, and a
# restart from the newest one if a rank dies or hangs.
train: build
	@echo "make train: $(CONFIG) on $(NP) MPI ranks (data parallel $(NP), expert parallel $(EP)) under moe launch, run directory $(RUN_DIR)"
	$(BUILD)/bin/moe launch --np $(NP) $(MPI_ARGS) --config $(CONFIG) --set parallel.ep=$(EP) \
	  --set checkpoint.every=50 --run-dir $(RUN_DIR) --resume none --overwrite

# The seed articles' ablation (README "Ablations"): tau x capacity factor, 20 cells, two at a time, resumable;
# then its report, runs/ablate_tau_cf/report.html.
ABLATE_DIR ?= runs/ablate_tau_cf
ablate: build
	$(BUILD)/bin/moe sweep --config configs/ablate_tau_cf.json --grid moe.router.tau=0.3,0.5,0.7,1.0,1.5 \
	  --grid moe.capacity_factor=1.0,1.25,1.5,2.0 --concurrent 2 --out $(ABLATE_DIR)
	$(BUILD)/bin/moe report $(ABLATE_DIR)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The tests that use no MPI, built with AddressSanitizer and UndefinedBehaviorSanitizer in build-sanitize/.
# (OpenMPI's own allocations are not ours to fix, so the mpirun tests are left to `make test`.)
test-sanitize: deps
	cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_CUDA=OFF -DMOE_SANITIZE=address,undefined
	cmake --build build-sanitize -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-sanitize --output-on-failure -j $(JOBS) -LE mpi \
	  -E 'supervisor|run_integrity|format'

bench: build
	$(BUILD)/bin/bench_train
	$(BUILD)/bin/bench_moe

clean:
	rm -rf $(BUILD)
