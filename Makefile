# yolo.c Makefile. Targets by intent: all, test, demo, bench, clean, asan, tsan, cross-arm64, test-arm64.
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
# Only the CUDA runtime (static) is linked, and libnccl when found (below); no cuDNN, no cuBLAS.
CUDA      ?= $(if $(NVCC),1,0)
# the toolkit's folder: CUDA_HOME if set, else where nvcc itself says it lives (its TOP; PATH's nvcc
# may be a wrapper script elsewhere, as /usr/local/bin/nvcc is on some machines), else nvcc's ../
NVCC_TOP  := $(if $(NVCC),$(shell $(NVCC) --dryrun -E -x cu /dev/null 2>&1 | sed -n 's|^\#\$$ TOP=\(.*\)/bin/\.\.$$|\1|p' | head -n 1))
CUDA_HOME ?= $(or $(NVCC_TOP),$(patsubst %/bin/nvcc,%,$(NVCC)))
CUDA_ARCH ?= $(if $(GPU_ARCH),$(GPU_ARCH),75 80 86 89 90)
CUDA_GENCODE = $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
BANNER  := $(shell $(CC) --version | head -n 1); OpenMP on; $(if $(NVCC),nvcc $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')$(if $(GPU_ARCH),$(comma) GPU sm_$(GPU_ARCH),$(comma) no GPU on this machine),no nvcc)
# NCCL (training on several GPUs, device=0,1): nccl.h beside the toolkit's headers or the system's,
# and a libnccl.so the dynamic linker knows (ldconfig: the toolkit's or Debian's libnccl2). NCCL=0
# builds without it: then device=0,1 is refused with a message saying so.
NCCL_H   := $(firstword $(wildcard $(if $(NVCC),$(CUDA_HOME)/include/nccl.h) /usr/include/nccl.h))
# (ldconfig's cache first, else the toolkit's lib/ or lib64/ folder; the binary gets an rpath to it)
NCCL_LDC := $(shell ldconfig -p 2>/dev/null | sed -n 's|.*libnccl\.so (.*) => \(.*\)/libnccl\.so$$|\1|p' | head -n 1)
NCCL_TK  := $(if $(NVCC),$(wildcard $(CUDA_HOME)/lib/libnccl.so $(CUDA_HOME)/lib64/libnccl.so))
NCCL_LIB := $(or $(NCCL_LDC),$(patsubst %/libnccl.so,%,$(firstword $(NCCL_TK))))
NCCL     ?= $(if $(and $(NVCC),$(NCCL_H),$(NCCL_LIB)),1,0)
NCCL_FLAGS = $(if $(filter 1,$(NCCL)),-DYOLO_NCCL -I$(dir $(NCCL_H)) -L$(NCCL_LIB) -Wl$(comma)-rpath$(comma)$(NCCL_LIB) \
             -lnccl $(MPI_FLAGS))
# MPI (optional, with NCCL): ranks started by mpirun get the NCCL id over MPI, else over TCP at
# MASTER_ADDR:MASTER_PORT. Found through OpenMPI's mpicc (Debian's libopenmpi-dev); MPI=0 builds without.
MPI_CC   := $(shell mpicc --showme:compile >/dev/null 2>&1 && echo mpicc)
MPI      ?= $(if $(MPI_CC),1,0)
MPI_COMPILE = $(if $(filter 1,$(MPI)),-DYOLO_MPI $(shell mpicc --showme:compile 2>/dev/null))
MPI_FLAGS   = $(if $(filter 1,$(MPI)),$(MPI_COMPILE) $(shell mpicc --showme:link 2>/dev/null))
all: yolo

ifeq ($(CUDA),1)
yolo: $(SRC) yolo_kernels.o
	@echo "yolo.c: CUDA + CPU build, kernels for sm_$(CUDA_ARCH) ($(BANNER)); $(if $(filter 1,$(NCCL)),NCCL $(NCCL_LIB) (device=0$(comma)1 trains on several GPUs)$(if $(filter 1,$(MPI)), + MPI (mpirun),),no NCCL (one GPU per run)); without a GPU at run time it trains on the CPU"
	$(CC) $(CFLAGS) -DYOLO_CUDA -I$(CUDA_HOME)/include -o $@ yolo.c yolo_kernels.o $(NCCL_FLAGS) $(LDLIBS) -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -ldl -lpthread -lstdc++

yolo_kernels.o: yolo_kernels.cu yolo.h
	$(NVCC) -std=c++17 -O3 $(CUDA_GENCODE) -c -o $@ yolo_kernels.cu
else
yolo: $(SRC)
	@echo "yolo.c: CPU-only build ($(BANNER))"
	$(CC) $(CFLAGS) -o $@ yolo.c $(LDLIBS)
endif

test/bin/%: test/%.c test/test.h test/fixture.h test/yolo_test.h $(SRC)
	@mkdir -p test/bin
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

tests: yolo $(TESTS) emu-bins emu-count-test

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

# benchmarks, never part of make test. make bench: a whole training step of yolov8n in yolo.c and in
# PyTorch (when python3-torch is installed) in the same run, at 320 and 640, and the ratio; then one
# epoch of the shapes set (test/bench.sh). The other test/bench_X.c print their own figures.
bench: yolo $(BENCHES) test/bin/bench_step_avx2
	bash test/bench.sh
# the step built for AVX2 without AVX-512 (BENCH_ISA=avx2 make bench, on an x86-64 machine)
test/bin/bench_step_avx2: test/bench_step.c test/test.h test/fixture.h test/yolo_test.h $(SRC)
	@mkdir -p test/bin
	$(if $(filter x86_64%,$(shell $(CC) -dumpmachine)),$(CC) -O3 -march=haswell -std=c11 -fopenmp -Wall -Wextra -o $@ $< $(LDLIBS),@echo "$@: x86-64 only")

test: tests
	bash test/run.sh

# --- sanitizers (none of this is part of make test) -----------------------------------------
# make asan: every test (test_*, the fuzzers, ./yolo check-ref, the emulated CUDA suite) under
#   AddressSanitizer + UBSan; a UB report aborts (-fno-sanitize-recover), so it fails the test.
# make tsan: everything that starts threads (the loader: test_data; training processes:
#   test_train) under ThreadSanitizer. OpenMP runs one thread there (OMP_NUM_THREADS=1): libgomp
#   is not built with TSan, so its barriers are invisible to it and every parallel loop would be
#   reported as a race. The emulated CUDA suite is not run: its CUDA threads are fibers on one OS
#   thread, with nothing concurrent for TSan to check.
# Both build into their own folders (test/bin/asan, test/bin/tsan, with their own ./yolo), so
# the plain build stays. Any sanitizer report, from a test or from a ./yolo it started, is
# written to test/bin/<san>/report.<pid>; test/run.sh prints each one and counts it as a failure.
# Samples (whole, these two would take most of an hour on 2 cores): test_train runs parts 1 and 3
# under ASan (ASAN_TRAIN_SAMPLE; the resume and the non-finite early stop) and part 3 under TSan
# (TSAN_TRAIN_SAMPLE: a training run with 2 loader workers stopped mid-epoch; one 2-epoch run
# alone takes minutes there); TEST_NET_SAMPLE=8 makes test_net's whole-YOLOv8n gradient check
# perturb every 8th parameter tensor. make test runs them whole; ASAN_TRAIN_SAMPLE= runs all.
SAN_FLAGS  = -std=c11 -O1 -g -fno-omit-frame-pointer -fopenmp -Wall -Wextra
ASAN_FLAGS = $(SAN_FLAGS) -fsanitize=address,undefined -fno-sanitize-recover=all
TSAN_FLAGS = $(SAN_FLAGS) -fsanitize=thread
ASAN_BINS  = $(patsubst test/%.c,test/bin/asan/%,$(wildcard test/fuzz_*.c) $(wildcard test/test_*.c)) test/bin/asan/yolo
TSAN_BINS  = test/bin/tsan/test_data test/bin/tsan/test_train test/bin/tsan/yolo
FUZZ_BINS  = $(patsubst test/%.c,test/bin/asan/%,$(wildcard test/fuzz_*.c)) test/bin/asan/test_data test/bin/asan/test_weights test/bin/asan/test_pt
ASAN_ENV   = ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$(CURDIR)/test/bin/asan/report \
             UBSAN_OPTIONS=print_stacktrace=1:abort_on_error=1:log_path=$(CURDIR)/test/bin/asan/report
TSAN_ENV   = TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:log_path=$(CURDIR)/test/bin/tsan/report \
             OMP_NUM_THREADS=1
# the sanitizers' runs without address-space randomisation where setarch allows it: GCC 12's TSan
# and ASan runtimes abort at start on kernels that randomise mmap with more bits than they expect
NO_ASLR := $(shell setarch $$(uname -m) -R true >/dev/null 2>&1 && echo "setarch $$(uname -m) -R")
ASAN_TRAIN_SAMPLE ?= 1,3
TSAN_TRAIN_SAMPLE ?= 3
TEST_NET_SAMPLE   ?= 8

test/bin/asan/%: test/%.c test/test.h test/fixture.h test/yolo_test.h $(SRC)
	@mkdir -p test/bin/asan
	$(CC) $(ASAN_FLAGS) -o $@ $< $(LDLIBS)
test/bin/asan/yolo: $(SRC)
	@mkdir -p test/bin/asan
	$(CC) $(ASAN_FLAGS) -o $@ yolo.c $(LDLIBS)
test/bin/tsan/%: test/%.c test/test.h test/fixture.h test/yolo_test.h $(SRC)
	@mkdir -p test/bin/tsan
	$(CC) $(TSAN_FLAGS) -o $@ $< $(LDLIBS)
test/bin/tsan/yolo: $(SRC)
	@mkdir -p test/bin/tsan
	$(CC) $(TSAN_FLAGS) -o $@ yolo.c $(LDLIBS)

# the input parsers alone under ASan + UBSan (fuzz targets: deterministic mutation runs), quick
fuzz-asan: $(FUZZ_BINS)
	rm -f test/bin/asan/report.*
	$(ASAN_ENV) TEST_BIN=test/bin/asan TEST_GLOB='fuzz_* test_data test_weights' SKIP_EMU=1 SKIP_CHECK_REF=1 \
	    SAN_REPORTS=test/bin/asan/report bash test/run.sh

asan: $(ASAN_BINS) emu-asan-bins
	rm -f test/bin/asan/report.*
	$(ASAN_ENV) TEST_BIN=test/bin/asan TEST_GLOB='fuzz_* test_*' YOLO_BIN=test/bin/asan/yolo EMU_BIN=$(EMU_ASAN_DIR) \
	    TEST_TRAIN_SAMPLE=$(ASAN_TRAIN_SAMPLE) TEST_NET_SAMPLE=$(TEST_NET_SAMPLE) SAN_REPORTS=test/bin/asan/report $(NO_ASLR) bash test/run.sh

tsan: $(TSAN_BINS)
	rm -f test/bin/tsan/report.*
	$(TSAN_ENV) TEST_BIN=test/bin/tsan TEST_GLOB='test_*' YOLO_BIN=test/bin/tsan/yolo SKIP_EMU=1 SKIP_CHECK_REF=1 \
	    TEST_TRAIN_SAMPLE=$(TSAN_TRAIN_SAMPLE) SAN_REPORTS=test/bin/tsan/report $(NO_ASLR) bash test/run.sh

# --- GPU efficiency without a GPU (issue 14; none of this is part of make test) ------------------
# make kernel-report: registers, spills, shared memory, occupancy of every kernel for sm_80/86/89/90
#   and the conv kernels' main-loop instruction mix (test/kernel_report.py; needs nvcc and python3),
#   checked against test/kernel_report.baseline (fails on a spill or a kernel worse than the baseline)
# make kernel-report-baseline: rewrites the baseline from the kernels as they are now
# make emu-count / make gpu-model: see test/emu.mk
KREPORT = NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) python3 test/kernel_report.py
KREPORT_NEED = @command -v python3 >/dev/null || { echo "$@ needs python3"; exit 1; }; \
	test -n "$(NVCC)" || { echo "$@ needs nvcc (none found in PATH or /usr/local/cuda/bin)"; exit 1; }
kernel-report:
	$(KREPORT_NEED)
	$(KREPORT) --check test/kernel_report.baseline
kernel-report-baseline:
	$(KREPORT_NEED)
	$(KREPORT) --out test/kernel_report.baseline >/dev/null
	@echo "wrote test/kernel_report.baseline"

# --- ARM64 (aarch64: Jetson, Graviton, Ampere, Apple silicon under Linux) --------------------
# A native build on an aarch64 machine is plain `make` / `make test` (-march=native picks NEON and
# whatever the core adds). The same flags as below are added there by the -dumpmachine check.
# Without an ARM machine, a cross build and the whole test suite under qemu-user:
#   make cross-arm64   ./yolo, every test_* and the emulated CUDA suite built for aarch64 into
#                      test/bin/arm64 (-march=armv8-a: any 64-bit ARM core; NEON is part of it)
#   make test-arm64    runs them under qemu-aarch64 through test/run.sh ("N passed, N failed")
# Debian needs: dpkg --add-architecture arm64; apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu
#   libjpeg62-turbo-dev:arm64 libpng-dev:arm64 libyaml-dev:arm64 qemu-user-static
# AARCH64_FLAGS: -ffp-contract=fast lets the GEMM's vector multiply-adds become NEON fmla (ISO C
# mode, -std=c11, otherwise forbids fusing a*b+c); -fno-schedule-insns: GCC's scheduling before
# register allocation (on by default for aarch64, off for x86-64) spills the 8 x 12 micro-kernel's
# 24 accumulators to the stack in the inner loop, without it the loop is 24 fmla and 7 loads;
# -fno-builtin-fmax/fmin works around an internal compiler error of GCC 12 (Debian 12's aarch64 gcc)
# in the vectorizer on fmax reduction loops over float values widened to double, a plain call there.
AARCH64_FLAGS  = -ffp-contract=fast -fno-schedule-insns -fno-builtin-fmax -fno-builtin-fmin
ifneq ($(filter aarch64%,$(shell $(CC) -dumpmachine 2>/dev/null)),)
CFLAGS        += $(AARCH64_FLAGS)
EMU_OPT       ?= -O2 -g $(AARCH64_FLAGS)
endif
ARM64_CC      ?= aarch64-linux-gnu-gcc
ARM64_CXX     ?= aarch64-linux-gnu-g++
ARM64_CFLAGS  ?= -O3 -march=armv8-a
ARM64_SYSROOT ?= /usr/aarch64-linux-gnu
QEMU_AARCH64  ?= $(firstword $(shell command -v qemu-aarch64-static qemu-aarch64 2>/dev/null))
ARM64_DIR      = test/bin/arm64
ARM64_FLAGS    = $(ARM64_CFLAGS) $(AARCH64_FLAGS) -std=c11 -fopenmp -Wall -Wextra
ARM64_BINS     = $(patsubst test/%.c,$(ARM64_DIR)/%,$(wildcard test/test_*.c)) $(ARM64_DIR)/yolo
# without binfmt_misc an aarch64 program runs as `qemu-aarch64 -L sysroot prog`; test/run.sh and
# test/run_emu.sh put TEST_EXEC in front of every test binary, and the yolo that tests start
# themselves (test_train's execv, test/emu_train.sh) is this wrapper script
ARM64_EXEC     = $(QEMU_AARCH64) -L $(ARM64_SYSROOT)
ARM64_NEED     = @command -v $(ARM64_CC) >/dev/null && command -v $(ARM64_CXX) >/dev/null || { echo "$@ needs \
	$(ARM64_CC) and $(ARM64_CXX) (Debian: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu, and libjpeg62-turbo-dev:arm64 \
	libpng-dev:arm64 libyaml-dev:arm64 after dpkg --add-architecture arm64)"; exit 1; }

$(ARM64_DIR)/%: test/%.c test/test.h test/fixture.h test/yolo_test.h $(SRC)
	$(ARM64_NEED)
	@mkdir -p $(ARM64_DIR)
	$(ARM64_CC) $(ARM64_FLAGS) -o $@ $< $(LDLIBS)
$(ARM64_DIR)/yolo: $(SRC)
	$(ARM64_NEED)
	@mkdir -p $(ARM64_DIR)
	$(ARM64_CC) $(ARM64_FLAGS) -o $@ yolo.c $(LDLIBS)
cross-arm64: $(ARM64_BINS)
	$(MAKE) --no-print-directory EMU_DIR=$(ARM64_DIR)/emu CC=$(ARM64_CC) EMU_CXX=$(ARM64_CXX) MPI=0 emu-bins
test-arm64: cross-arm64
	@test -n "$(QEMU_AARCH64)" || { echo "$@ needs qemu-aarch64 (Debian: qemu-user-static)"; exit 1; }
	@for y in $(ARM64_DIR)/yolo $(ARM64_DIR)/emu/yolo; do \
	    printf '#!/bin/sh\nexec $(ARM64_EXEC) %s "$$@"\n' "$(CURDIR)/$$y" >$$y.qemu && chmod +x $$y.qemu; done
	# one OpenMP thread: under Debian 12's qemu-aarch64 (7.2) a second libgomp thread can stall, and
	# the first parallel loop spins forever (test_loss: hangs with 2 threads, 24 passed with 1)
	OMP_NUM_THREADS=1 TEST_MAX_THREADS=1 EMU_SELFTEST_NO_FORK=1 TEST_EXEC="$(ARM64_EXEC)" TEST_BIN=$(ARM64_DIR) YOLO_BIN=$(ARM64_DIR)/yolo.qemu \
	    EMU_BIN=$(ARM64_DIR)/emu EMU_YOLO=$(ARM64_DIR)/emu/yolo.qemu bash test/run.sh

clean-tests:
	rm -rf test/bin

clean: clean-tests
	rm -f yolo yolo_kernels.o

-include test/emu.mk

.PHONY: all test tests asan tsan fuzz-asan clean clean-tests demo bench kernel-report kernel-report-baseline cross-arm64 test-arm64
