# emu.mk: the CUDA-on-CPU emulation, included by the Makefile. yolo_kernels.cu is compiled as C++17 by
# g++ with test/cuda_emu.h force-included and test/emu_include first on the include path (the emulator's
# own cuda_runtime_api.h, cuda_runtime.h, cuda_fp16.h, mma.h: no CUDA toolkit is read or needed), its
# launches rewritten by test/emu_rewrite.sh, and linked with test/cuda_emu.cpp, which runs every CUDA
# thread as a fiber on the CPU. The same kernels_test.c then checks each kernel against its CPU twin.
#   make emu-bins     emulated build of yolo_kernels.cu + test/kernels_test.c, and the emulator selftest
#   make test-emu     runs them (test/run_emu.sh: three thread and block orders, strict, async, host traps)
#   make emu-asan     the same under -fsanitize=address,undefined (make asan runs it too)
#   make cuda-check   nvcc device compile for every shipped arch, warnings as errors (needs nvcc)
#   make test-gpu     kernels_test.c, gpu_step_test.c and the gpu_bench benchmark against the nvcc-built
#                     kernels and the real cudart (needs nvcc; run them on a machine with a GPU)
# the toolkit, only for cuda-check and test-gpu: the Makefile's CUDA_HOME (where its nvcc lives), else /usr/local/cuda
EMU_CUDA     ?= $(if $(NVCC),$(CUDA_HOME),/usr/local/cuda)
EMU_NVCC     ?= $(EMU_CUDA)/bin/nvcc
EMU_NEED_NVCC = @test -x "$(EMU_NVCC)" || { echo "$@ needs nvcc ($(EMU_NVCC) not found; set EMU_CUDA=): \
	the emulated kernels (make test-emu, part of make test) need no CUDA toolkit"; exit 1; }
EMU_CXX      ?= g++
EMU_DIR      ?= test/bin/emu
EMU_OPT      ?= -O2 -g
EMU_SAN      ?=
EMU_INC       = -Itest/emu_include
# -fno-strict-aliasing: kernels move FP16 data as 16-byte uint4/float4 words (wide loads and
# stores), which CUDA allows and C++'s type-based aliasing rules do not
EMU_CXXFLAGS  = -std=c++17 $(EMU_OPT) $(EMU_SAN) -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas $(EMU_INC) -I. \
                -include test/cuda_emu.h
EMU_CFLAGS    = -std=c11 $(EMU_OPT) $(EMU_SAN) -fopenmp -Wall -Wextra $(EMU_INC)
EMU_LDLIBS    = -ljpeg -lpng -lyaml -lm -fopenmp
EMU_DEPS      = test/cuda_emu.h test/emu_rewrite.sh $(wildcard test/emu_include/*.h)
EMU_ARCHS    ?= 75 80 86 89 90
EMU_GENCODE   = $(foreach a,$(EMU_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
EMU_NVFLAGS   = -std=c++17 -O3 $(EMU_GENCODE) -Werror all-warnings -Xptxas -v,-warn-spills,-Werror

EMU_BINS = $(EMU_DIR)/kernels_test $(EMU_DIR)/emu_selftest $(EMU_DIR)/gpu_step_test $(EMU_DIR)/ddp_step_test $(EMU_DIR)/yolo

emu-bins: $(EMU_BINS)

$(EMU_DIR)/yolo_kernels.cpp: yolo_kernels.cu $(EMU_DEPS)
	@mkdir -p $(EMU_DIR)
	bash test/emu_rewrite.sh $< $@
$(EMU_DIR)/emu_selftest.cpp: test/emu_selftest.cu $(EMU_DEPS)
	@mkdir -p $(EMU_DIR)
	bash test/emu_rewrite.sh $< $@
$(EMU_DIR)/yolo_kernels.o: $(EMU_DIR)/yolo_kernels.cpp yolo.h $(EMU_DEPS)
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_KFLAGS) -c -o $@ $<
$(EMU_DIR)/emu_selftest.o: $(EMU_DIR)/emu_selftest.cpp test/test.h $(EMU_DEPS)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Itest -c -o $@ $<
$(EMU_DIR)/cuda_emu.o: test/cuda_emu.cpp $(EMU_DEPS)
	@mkdir -p $(EMU_DIR)
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_CDEFS) -c -o $@ $<
$(EMU_DIR)/kernels_test.o: test/kernels_test.c yolo.h test/test.h $(SRC)
	@mkdir -p $(EMU_DIR)
	$(CC) $(EMU_CFLAGS) -c -o $@ $<
$(EMU_DIR)/kernels_test: $(EMU_DIR)/kernels_test.o $(EMU_DIR)/yolo_kernels.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) $(EMU_SAN) -o $@ $^ $(EMU_LDLIBS)
$(EMU_DIR)/gpu_step_test.o: test/gpu_step_test.c yolo.h test/test.h $(SRC)
	@mkdir -p $(EMU_DIR)
	$(CC) $(EMU_CFLAGS) -I. -c -o $@ $<
$(EMU_DIR)/gpu_step_test: $(EMU_DIR)/gpu_step_test.o $(EMU_DIR)/yolo_kernels.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) $(EMU_SAN) -o $@ $^ $(EMU_LDLIBS)
# the data-parallel step over the emulated NCCL (processes, shared memory) against the single-process step
$(EMU_DIR)/ddp_step_test.o: test/ddp_step_test.c yolo.h test/test.h test/yolo_test.h $(SRC) test/emu_include/nccl.h
	@mkdir -p $(EMU_DIR)
	$(CC) $(EMU_CFLAGS) -I. -c -o $@ $<
$(EMU_DIR)/ddp_step_test: $(EMU_DIR)/ddp_step_test.o $(EMU_DIR)/yolo_kernels.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) $(EMU_SAN) -o $@ $^ $(EMU_LDLIBS)
# the CUDA build of ./yolo itself, on the emulated kernels (run_emu.sh trains a tiny dataset with device=0)
$(EMU_DIR)/yolo.o: yolo.c yolo.h test/emu_include/nccl.h
	@mkdir -p $(EMU_DIR)
	$(CC) $(EMU_CFLAGS) -DYOLO_CUDA -DYOLO_NCCL $(MPI_COMPILE) -c -o $@ yolo.c
$(EMU_DIR)/yolo: $(EMU_DIR)/yolo.o $(EMU_DIR)/yolo_kernels.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) $(EMU_SAN) -o $@ $^ $(EMU_LDLIBS) $(MPI_FLAGS)
$(EMU_DIR)/emu_selftest: $(EMU_DIR)/emu_selftest.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) $(EMU_SAN) -o $@ $^ $(EMU_LDLIBS)

test-emu: emu-bins
	EMU_BIN=$(EMU_DIR) bash test/run_emu.sh

EMU_ASAN_DIR = test/bin/emu-asan
emu-asan-bins:
	$(MAKE) --no-print-directory EMU_DIR=$(EMU_ASAN_DIR) EMU_OPT="-O1 -g -fno-omit-frame-pointer" \
	    EMU_SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" emu-bins
emu-asan: emu-asan-bins
	ASAN_OPTIONS=detect_leaks=0 EMU_BIN=$(EMU_ASAN_DIR) bash test/run_emu.sh

# cuda-check also builds yolo.c's CUDA path against the toolkit's own headers (cuda_runtime_api.h and,
# where NCCL is found, nccl.h: the data-parallel trainer), with warnings as errors, and links it as
# `make` links ./yolo (test/bin/gpu/yolo): what the emulated build checks against the emulator's
# headers, checked against NVIDIA's. Without NCCL the data-parallel path is compiled only by the
# emulated build (make test), and cuda-check says so. It first prints what it found.
# Its object is the one make would link ./yolo from where make uses the same nvcc and architectures
# (CUDA_ARCH is EMU_ARCHS: no GPU on the machine; the PTX of the last one added as make adds it): the
# warning flags change no code, only the options the fatbinary records. There it becomes yolo_kernels.o,
# so that a make test after it (CI's next stage) does not compile the kernels a second time.
EMU_PTX        = -gencode arch=compute_$(lastword $(EMU_ARCHS)),code=compute_$(lastword $(EMU_ARCHS))
EMU_SAME_BUILD = $(and $(filter 1,$(CUDA)),$(NVCC),$(filter $(realpath $(NVCC)),$(realpath $(EMU_NVCC))),\
                       $(findstring $(strip $(CUDA_ARCH)),$(strip $(EMU_ARCHS))),$(findstring $(strip $(EMU_ARCHS)),$(strip $(CUDA_ARCH))))
GPU_CHECK_CFLAGS = -std=c11 -O1 -fopenmp -Wall -Wextra -Werror -Wno-error=format-truncation -DYOLO_CUDA -I$(EMU_CUDA)/include
cuda-check:
	$(EMU_NEED_NVCC)
	@echo "cuda-check: nvcc $(EMU_NVCC); NCCL $(if $(filter 1,$(NCCL)),$(NCCL_LIB)/libnccl.so + $(NCCL_H),off (NCCL=$(NCCL); found nccl.h: '$(NCCL_H)', libnccl.so in: '$(NCCL_LIB)')); MPI $(if $(filter 1,$(MPI)),$(MPI_CC),no)"
	@mkdir -p test/bin/gpu
	$(EMU_NVCC) $(EMU_NVFLAGS) $(EMU_PTX) -c yolo_kernels.cu -o test/bin/gpu/check_kernels.o
	$(if $(EMU_SAME_BUILD),cp test/bin/gpu/check_kernels.o yolo_kernels.o)
	$(CC) $(GPU_CHECK_CFLAGS) -o test/bin/gpu/yolo yolo.c test/bin/gpu/check_kernels.o $(NCCL_FLAGS) $(EMU_LDLIBS) \
	    -L$(EMU_CUDA)/lib64 -lcudart_static -lrt -ldl -lpthread -lstdc++
	@echo "cuda-check: test/bin/gpu/yolo built against the real cuda_runtime_api.h$(if $(filter 1,$(NCCL)), and nccl.h$(comma) linked with libnccl,) and the static cudart, as make links ./yolo"
	@test "$(NCCL)" = 1 || echo "cuda-check: SKIP the data-parallel path against the real nccl.h: no NCCL found (it is compiled against the emulator's nccl.h by make test)"

test-gpu: test/bin/gpu/kernels_test test/bin/gpu/gpu_step_test test/bin/gpu/gpu_bench
test/bin/gpu/yolo_kernels.o: yolo_kernels.cu yolo.h
	$(EMU_NEED_NVCC)
	@mkdir -p test/bin/gpu
	$(EMU_NVCC) -std=c++17 -O3 $(EMU_GENCODE) -c -o $@ $<
test/bin/gpu/kernels_test: test/kernels_test.c test/bin/gpu/yolo_kernels.o yolo.h test/test.h $(SRC)
	$(CC) -std=c11 -O2 -fopenmp -Wall -Wextra -I$(EMU_CUDA)/include -c -o test/bin/gpu/kernels_test.o $<
	$(EMU_CXX) -o $@ test/bin/gpu/kernels_test.o test/bin/gpu/yolo_kernels.o -L$(EMU_CUDA)/lib64 -lcudart $(EMU_LDLIBS)
	@echo "built $@ (run it on a machine with a GPU)"
test/bin/gpu/gpu_step_test: test/gpu_step_test.c test/bin/gpu/yolo_kernels.o yolo.h test/test.h $(SRC)
	$(CC) -std=c11 -O2 -fopenmp -Wall -Wextra -I. -I$(EMU_CUDA)/include -c -o test/bin/gpu/gpu_step_test.o $<
	$(EMU_CXX) -o $@ test/bin/gpu/gpu_step_test.o test/bin/gpu/yolo_kernels.o -L$(EMU_CUDA)/lib64 -lcudart $(EMU_LDLIBS)
	@echo "built $@ (run it on a machine with a GPU)"
test/bin/gpu/gpu_bench: test/gpu_bench.c test/bin/gpu/yolo_kernels.o yolo.h test/test.h $(SRC)
	$(CC) -std=c11 -O2 -fopenmp -Wall -Wextra -I. -I$(EMU_CUDA)/include -c -o test/bin/gpu/gpu_bench.o $<
	$(EMU_CXX) -o $@ test/bin/gpu/gpu_bench.o test/bin/gpu/yolo_kernels.o -L$(EMU_CUDA)/lib64 -lcudart $(EMU_LDLIBS)
	@echo "built $@ (run it on a machine with a GPU)"

# --- counter mode (issue 14; not part of make test except its own test, emu_count_test) ---------
#   make emu-count-test  the counter mode's test alone (built by make tests, run by test/run_emu.sh)
#   make emu-count    builds test/bin/emu-count: the kernel file instrumented so that every load and
#                     store reaches the emulator's counters (g++ -fsanitize=kernel-address in call
#                     mode, hooks in test/cuda_emu.cpp), the counter test and the one-step driver
#                     test/gpu_count.c, twice: loads only (test/bin/emu-count) and stores only
#                     (test/bin/emu-count/st; one build of both under-counts a read-modify-write's store,
#                     see EMU_COUNT_KINDS in test/cuda_emu.cpp); then counts one yolov8n 640 batch-16
#                     step with each (EMU_SAMPLE blocks of each launch, default 6) and adds the two into
#                     test/bin/emu-count/step.tsv (gpu_model.sh --merge)
#   make gpu-model    the modeled time per kernel kind and per step for named GPUs (test/gpu_model.sh)
EMU_COUNT_DIR = test/bin/emu-count
EMU_SAMPLE   ?= 6
EMU_COUNT_KFLAGS = -DEMU_COUNTING -fsanitize=kernel-address --param asan-instrumentation-with-call-threshold=0 \
                   --param asan-stack=0 --param asan-globals=0 -fno-tree-sra -fno-ipa-sra
EMU_COUNT_LD = EMU_KFLAGS="$(EMU_COUNT_KFLAGS) --param asan-instrument-writes=0 -DEMU_COUNT_KINDS=1" \
               EMU_CDEFS="-DEMU_COUNTERS -DEMU_COUNT_KINDS=1"
EMU_COUNT_ST = EMU_KFLAGS="$(EMU_COUNT_KFLAGS) --param asan-instrument-reads=0 -DEMU_COUNT_KINDS=2" \
               EMU_CDEFS="-DEMU_COUNTERS -DEMU_COUNT_KINDS=2"
emu-count-bins:
	$(MAKE) --no-print-directory EMU_DIR=$(EMU_COUNT_DIR) $(EMU_COUNT_LD) $(EMU_COUNT_DIR)/emu_count_test $(EMU_COUNT_DIR)/gpu_count
	$(MAKE) --no-print-directory EMU_DIR=$(EMU_COUNT_DIR)/st $(EMU_COUNT_ST) $(EMU_COUNT_DIR)/st/emu_count_test \
	    $(EMU_COUNT_DIR)/st/gpu_count
emu-count-test:
	$(MAKE) --no-print-directory EMU_DIR=$(EMU_COUNT_DIR) $(EMU_COUNT_LD) $(EMU_COUNT_DIR)/emu_count_test
	$(MAKE) --no-print-directory EMU_DIR=$(EMU_COUNT_DIR)/st $(EMU_COUNT_ST) $(EMU_COUNT_DIR)/st/emu_count_test
$(EMU_DIR)/emu_count_test.cpp: test/emu_count_test.cu $(EMU_DEPS)
	@mkdir -p $(EMU_DIR)
	bash test/emu_rewrite.sh $< $@
$(EMU_DIR)/emu_count_test.o: $(EMU_DIR)/emu_count_test.cpp test/test.h $(EMU_DEPS)
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_KFLAGS) -Itest -c -o $@ $<
$(EMU_DIR)/emu_count_test: $(EMU_DIR)/emu_count_test.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) -o $@ $^ $(EMU_LDLIBS)
$(EMU_DIR)/gpu_count.o: test/gpu_count.c yolo.h test/yolo_test.h $(SRC)
	@mkdir -p $(EMU_DIR)
	$(CC) $(EMU_CFLAGS) -I. -c -o $@ $<
$(EMU_DIR)/gpu_count: $(EMU_DIR)/gpu_count.o $(EMU_DIR)/yolo_kernels.o $(EMU_DIR)/cuda_emu.o
	$(EMU_CXX) -o $@ $^ $(EMU_LDLIBS)
$(EMU_COUNT_DIR)/step.tsv: emu-count-bins
	EMU_COUNT=$(EMU_COUNT_DIR)/st/step.tsv EMU_SAMPLE=$(EMU_SAMPLE) $(EMU_COUNT_DIR)/st/gpu_count & \
	EMU_COUNT=$(EMU_COUNT_DIR)/loads.tsv EMU_SAMPLE=$(EMU_SAMPLE) $(EMU_COUNT_DIR)/gpu_count; s=$$?; wait $$! && [ $$s = 0 ]
	bash test/gpu_model.sh --merge $(EMU_COUNT_DIR)/loads.tsv $(EMU_COUNT_DIR)/st/step.tsv > $@.tmp && mv $@.tmp $@
emu-count: $(EMU_COUNT_DIR)/step.tsv
gpu-model: $(EMU_COUNT_DIR)/step.tsv
	bash test/gpu_model.sh $(EMU_COUNT_DIR)/step.tsv

.PHONY: emu-bins test-emu emu-asan emu-asan-bins cuda-check test-gpu emu-count-bins emu-count-test emu-count gpu-model
