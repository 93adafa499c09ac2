# Two commands for a newcomer on a fresh Debian 12 machine:
#   make train   installs what is missing, builds, trains the MoE default on the embedded corpus
#                (configs/tiny_moe.json) on 4 MPI ranks: data parallel 4, expert parallel 2
#   make test    installs what is missing, builds, runs the whole test suite
# Other targets: make build, make bench, make deps, make clean.

BUILD   ?= build
CONFIG  ?= configs/tiny_moe.json
RUN_DIR ?= runs/tiny_moe
# make train runs NP ranks under mpirun: data parallel over all of them, experts split over EP of them.
NP      ?= 4
EP      ?= 2
# Small machines: ranks may outnumber cores, so idle ranks yield and nothing is bound to a core.
MPIRUN  ?= mpirun -np $(NP) --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
           $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

# Debian packages the build needs (DESIGN.md "Dependencies"); libopenblas-openmp-dev gives OpenBLAS on
# the same OpenMP runtime as the rest of the code.
DEBIAN_PACKAGES := build-essential cmake libcli11-dev nlohmann-json3-dev libgtest-dev libopenblas-dev \
                   libopenblas-openmp-dev libxxhash-dev libopenmpi-dev openmpi-bin

.PHONY: all deps configure build train test bench clean

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

train: build
	@echo "make train: $(CONFIG) on $(NP) MPI ranks (data parallel $(NP), expert parallel $(EP)), run directory $(RUN_DIR)"
	$(MPIRUN) $(BUILD)/bin/moe train --config $(CONFIG) --set parallel.ep=$(EP) --run-dir $(RUN_DIR) --overwrite

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bin/bench_train

clean:
	rm -rf $(BUILD)
