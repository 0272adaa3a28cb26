# yolo.c Makefile. Targets by intent: all, test, demo, bench, clean, asan.
CC      ?= gcc
CFLAGS  ?= -O3 -march=native
CFLAGS  += -std=c11 -fopenmp -Wall -Wextra
LDLIBS  += -ljpeg -lpng -lyaml -lm
SRC      = yolo.c $(wildcard yolo.h)
TESTS    = $(patsubst test/%.c,test/bin/%,$(wildcard test/test_*.c))
BENCHES  = $(patsubst test/%.c,test/bin/%,$(wildcard test/bench_*.c))

comma   := ,
# nvcc: the first of PATH's and /usr/local/cuda's that runs (a wrapper left behind by a removed toolkit does not count)
NVCC    := $(shell for n in "$$(command -v nvcc)" /usr/local/cuda/bin/nvcc; do \
             [ -n "$$n" ] && "$$n" --version >/dev/null 2>&1 && { echo "$$n"; break; }; done)
GPU_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
# CUDA: on when nvcc is found (CUDA=0 forces the CPU-only build). The kernels are compiled for the
# GPU nvidia-smi reports, else for every shipped architecture; CUDA_ARCH=86 (or "80 90") overrides.
# Only the CUDA runtime (static) is linked; no cuDNN, no cuBLAS.
CUDA      ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= $(if $(GPU_ARCH),$(GPU_ARCH),75 80 86 89 90)
CUDA_GENCODE = $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
BANNER  := $(shell $(CC) --version | head -n 1); OpenMP on; $(if $(NVCC),nvcc $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')$(if $(GPU_ARCH),$(comma) GPU sm_$(GPU_ARCH),$(comma) no GPU on this machine),no nvcc)
all: yolo

ifeq ($(CUDA),1)
yolo: $(SRC) yolo_kernels.o
	@echo "yolo.c: CUDA + CPU build, kernels for sm_$(CUDA_ARCH) ($(BANNER)); without a GPU at run time it trains on the CPU"
	$(CC) $(CFLAGS) -DYOLO_CUDA -I$(CUDA_HOME)/include -o $@ yolo.c yolo_kernels.o $(LDLIBS) -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -ldl -lpthread -lstdc++

yolo_kernels.o: yolo_kernels.cu yolo.h
	$(NVCC) -std=c++17 -O3 $(CUDA_GENCODE) -c -o $@ yolo_kernels.cu
else
yolo: $(SRC)
	@echo "yolo.c: CPU-only build ($(BANNER))"
	$(CC) $(CFLAGS) -o $@ yolo.c $(LDLIBS)
endif

test/bin/%: test/%.c test/test.h test/fixture.h $(SRC)
	@mkdir -p test/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

tests: yolo $(TESTS) emu-bins

# the main job on a fresh machine: build, make the synthetic dataset, train yolov8n, validate
# the best weights, and predict on the validation images (prints wall time and mAP)
DEMO_DATA ?= data/shapes
DEMO_ARGS ?= model=yolov8n epochs=40 imgsz=160 batch=16 workers=2
demo: yolo
	@test -f $(DEMO_DATA)/data.yaml || ./yolo shapes out=$(DEMO_DATA)
	@start=$$(date +%s); \
	./yolo train data=$(DEMO_DATA)/data.yaml $(DEMO_ARGS) name=demo exist_ok=1 && \
	./yolo val model=runs/detect/demo/weights/best.safetensors data=$(DEMO_DATA)/data.yaml imgsz=160 batch=16 exist_ok=1 && \
	./yolo predict model=runs/detect/demo/weights/best.safetensors source=$(DEMO_DATA)/images/val data=$(DEMO_DATA)/data.yaml imgsz=160 exist_ok=1 | tail -n 1 && \
	echo "demo: $$(( $$(date +%s) - start )) s wall time (train + val + predict)"

# benchmarks: each test/bench_X.c prints its own figures; never part of make test
bench: yolo $(BENCHES)
	for b in $(BENCHES); do echo "== $$b"; OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $$b || exit 1; done

test: tests
	bash test/run.sh

# the input parsers under AddressSanitizer + UBSan: fuzz targets (deterministic mutation runs)
# and the parser tests; CI runs this
ASAN_FLAGS = -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fopenmp -Wall -Wextra
ASAN_BINS  = $(patsubst test/%.c,test/bin/asan/%,$(wildcard test/fuzz_*.c)) test/bin/asan/test_data test/bin/asan/test_weights test/bin/asan/test_pt

test/bin/asan/%: test/%.c test/test.h test/fixture.h $(SRC)
	@mkdir -p test/bin/asan
	$(CC) $(ASAN_FLAGS) -o $@ $< $(LDLIBS)

fuzz-asan: $(ASAN_BINS)
	for f in $(ASAN_BINS); do echo "== $$f"; ASAN_OPTIONS=detect_leaks=0 $$f || exit 1; done

# every C test under AddressSanitizer + UBSan (slower; not part of make test)
asan: clean-tests
	$(MAKE) tests CFLAGS="$(ASAN_FLAGS)"
	ASAN_OPTIONS=detect_leaks=0 bash test/run.sh

clean-tests:
	rm -rf test/bin

clean: clean-tests
	rm -f yolo yolo_kernels.o

-include test/emu.mk

.PHONY: all test tests asan fuzz-asan clean clean-tests demo bench
