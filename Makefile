# lumen — top-level commands. `make` builds build/lumen; `make test` runs every test
# (a normal build and an ASan+UBSan build of the unit tests); `make demo` runs lumen;
# `make install PREFIX=…` installs bin/lumen, lib/liblumen.{a,so}, include/lumen.h and
# lib/pkgconfig/lumen.pc (DESTDIR=… stages the tree elsewhere, as packagers do).
BUILD      ?= build
BUILD_ASAN ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
PREFIX     ?= /usr/local

.PHONY: all deps configure build install test test-fast test-asan format-check demo fuzz soak clean

all: build

deps:
	@bash scripts/bootstrap.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

$(BUILD_ASAN)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DLUMEN_SANITIZE=ON -DLUMEN_CUDA=OFF >/dev/null

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps $(BUILD_ASAN)/CMakeCache.txt
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L unit

format-check: deps
	bash scripts/check_format.sh

test: format-check test-fast test-asan

# Not part of `make test`: a server under mixed valid, malformed, abandoned and slow traffic for
# SOAK_MINUTES (2); RSS and descriptors must stay bounded and every valid request be answered.
SOAK_MINUTES ?= 2
soak: build
	python3 tests/soak/soak.py --lumen $(BUILD)/lumen --minutes $(SOAK_MINUTES)

demo: build
	bash scripts/demo.sh $(BUILD)/lumen

fuzz: deps
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLUMEN_FUZZ=ON -DLUMEN_CUDA=OFF >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all
	@echo "fuzz targets in build-fuzz/ (run e.g. build-fuzz/fuzz_safetensors -max_total_time=60;"
	@echo "  seeds: build-fuzz/fuzz_jinja -max_len=65536 CORPUS_DIR tests/fuzz/seeds/jinja)"

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) build-fuzz
