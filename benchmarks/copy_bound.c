// The copying a two-rank allgather cannot avoid on one host, with no library
// around it: two processes (fork), each copies its own block into its output
// and gets the peer's block one of the two ways processes without shared
// buffers can:
//   kernel: read straight from the peer's memory with process_vm_readv (Linux
//           CMA, one copy by the kernel; Open MPI's single copy);
//   shm:    the peer copies its block into shared memory, and we copy it out
//           (two memcpys; what shared-memory rings do, without their protocol).
// memcpy goes in 256 KiB pieces, as ringdist's copyBytes (glibc's vector loop
// above the L2 size is slower on AMD). A busy-polled shared-memory barrier
// starts and ends each iteration, so an iteration's time is the slower
// process's. Any allgather that writes both blocks of both outputs does at
// least the work of the cheaper mode per call.
//
// A third mode, reduce, is the least a small float32 SUM allreduce of two
// processes costs here: back-to-back calls, each rank copies its input into
// its shared slot (two slots by call parity), publishes the call's number,
// spins until the peer published it too, and adds its input to the peer's
// slot in its output: one cache-line hand-off each way per call, no
// library, no syscall (DeepSpeed's scheme without torch around it). Prints
// the mean per call over the loop.
//
//   gcc -O2 -o copy_bound benchmarks/copy_bound.c
//   ./copy_bound kernel|shm|reduce BYTES_PER_RANK ITERATIONS   # prints the time per call
//
// benchmarks/copy_bound.py builds and runs it beside the backends.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kReadPieceBytes = 4 << 20, kCopyPieceBytes = 256 << 10 };

typedef struct {
  atomic_long generation;
  atomic_int arrived;
  atomic_int ready;
  char* input[2];
  pid_t pid[2];
  _Alignas(64) atomic_long published[2][8];  // reduce: [rank][0], a cache line each
} Shared;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Spinning flat out slows the other core's copies on these VMs (2x for the
// shm mode at 256 KiB): pause between looks, as ringdist's spin does.
static void cpuRelax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void barrier(Shared* s) {
  long generation = atomic_load(&s->generation);
  if (atomic_fetch_add(&s->arrived, 1) == 1) {
    atomic_store(&s->arrived, 0);
    atomic_fetch_add(&s->generation, 1);
  } else {
    while (atomic_load(&s->generation) == generation) {
      cpuRelax();
    }
  }
}

static void copyBytes(char* dst, const char* src, size_t bytes) {
  for (size_t done = 0; done < bytes; done += kCopyPieceBytes) {
    memcpy(dst + done, src + done, bytes - done < kCopyPieceBytes ? bytes - done : kCopyPieceBytes);
  }
}

static void readPeer(pid_t pid, char* dst, const char* src, size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    size_t piece = bytes - done < kReadPieceBytes ? bytes - done : kReadPieceBytes;
    struct iovec local = {dst + done, piece};
    struct iovec remote = {(void*)(src + done), piece};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      perror("copy_bound: process_vm_readv");
      exit(1);
    }
    done += (size_t)n;
  }
}

static int byValue(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// The reduce mode's loop on this rank; rank 0's mean per call in us.
static double reduceLoop(Shared* s, char* staging, size_t bytes, int rank, int iterations,
                         const float* input, float* output) {
  const size_t count = bytes / sizeof(float);
  const int peer = 1 - rank;
  double start = 0;
  for (long call = -iterations / 10 - 1; call < iterations; ++call) {  // warm-up first
    if (call == 0) {
      barrier(s);
      start = now();
    }
    const long number = call + iterations / 10 + 2;  // > 0, rising
    float* mine = (float*)(staging + (size_t)((number & 1) * 2 + rank) * bytes);
    const float* theirs = (const float*)(staging + (size_t)((number & 1) * 2 + peer) * bytes);
    memcpy(mine, input, bytes);
    atomic_store_explicit(&s->published[rank][0], number, memory_order_release);
    while (atomic_load_explicit(&s->published[peer][0], memory_order_acquire) < number) {
      cpuRelax();
    }
    // Copied out first: reading the peer's lines in the add loop itself took
    // 4x longer at 4 KiB at -O2 (no wide loads, one line at a time).
    memcpy(output, theirs, bytes);
    for (size_t i = 0; i < count; ++i) output[i] += input[i];
  }
  double elapsed = now() - start;
  barrier(s);
  return elapsed / iterations * 1e6;
}

int main(int argc, char** argv) {
  if (argc != 4 || (strcmp(argv[1], "kernel") != 0 && strcmp(argv[1], "shm") != 0 &&
                    strcmp(argv[1], "reduce") != 0)) {
    fprintf(stderr, "usage: %s kernel|shm|reduce BYTES_PER_RANK ITERATIONS\n", argv[0]);
    return 2;
  }
  int reduceMode = strcmp(argv[1], "reduce") == 0;
  int viaKernel = strcmp(argv[1], "kernel") == 0;
  size_t bytes = strtoull(argv[2], NULL, 0);
  int iterations = atoi(argv[3]);
  if (bytes == 0 || iterations < 1) {
    fprintf(stderr, "copy_bound: BYTES_PER_RANK and ITERATIONS must be positive\n");
    return 2;
  }
  Shared* s = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* staging = mmap(NULL, 4 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED || staging == MAP_FAILED) {
    perror("copy_bound: mmap");
    return 1;
  }
  pid_t child = fork();
  int rank = child == 0 ? 1 : 0;
  int peer = 1 - rank;
  // Page-aligned like torch's large tensors (mmap'd by malloc), touched first.
  char* input = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  char* output = aligned_alloc(4096, (2 * bytes + 4095) / 4096 * 4096);
  double* times = malloc(sizeof(double) * (size_t)iterations);
  memset(input, rank + 1, bytes);
  memset(output, 0, 2 * bytes);
  s->input[rank] = input;
  s->pid[rank] = getpid();
  barrier(s);
  if (reduceMode) {
    float* in = (float*)input;
    float* out = (float*)output;
    for (size_t i = 0; i < bytes / sizeof(float); ++i) in[i] = (float)(rank + 1);
    double perCall = reduceLoop(s, staging, bytes, rank, iterations, in, out);
    for (size_t i = 0; i < bytes / sizeof(float); ++i) {
      if (out[i] != 3.0f) {
        fprintf(stderr, "copy_bound: rank %d's sum %zu is %g, not 3\n", rank, i, out[i]);
        return 1;
      }
    }
    if (rank == 1) return 0;
    int status = 0;
    waitpid(child, &status, 0);
    printf("copy_bound reduce allreduce %zu B N=2: %.2f us per call (mean of %d)\n", bytes,
           perCall, iterations);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  for (int i = -iterations / 10 - 1; i < iterations; ++i) {  // warm-up first
    barrier(s);
    double start = now();
    if (viaKernel) {
      readPeer(s->pid[peer], output + (size_t)peer * bytes, s->input[peer], bytes);
    } else {
      copyBytes(staging + (size_t)rank * bytes, input, bytes);
      barrier(s);
      copyBytes(output + (size_t)peer * bytes, staging + (size_t)peer * bytes, bytes);
    }
    copyBytes(output + (size_t)rank * bytes, input, bytes);
    barrier(s);
    if (i >= 0) {
      times[i] = now() - start;
    }
  }
  if (output[(size_t)peer * bytes] != peer + 1 || output[(size_t)rank * bytes] != rank + 1) {
    fprintf(stderr, "copy_bound: wrong bytes in rank %d's output\n", rank);
    return 1;
  }
  if (rank == 1) {
    return 0;
  }
  int status = 0;
  waitpid(child, &status, 0);
  qsort(times, (size_t)iterations, sizeof(double), byValue);
  printf("copy_bound %s allgather %zu B N=2: %.2f us per call (median of %d)\n", argv[1], bytes,
         times[iterations / 2] * 1e6, iterations);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
