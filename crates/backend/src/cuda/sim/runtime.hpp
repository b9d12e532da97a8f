// The host runtime of the CUDA simulator (crates/backend/src/cuda/sim/mod.rs). A unit of kernels/
// is compiled by the host C++ compiler after this header: the kernels' own source, unchanged but
// for dynamic shared memory declarations, runs on the CPU with every CUDA thread as a fiber.
//
// What it reproduces: the launch grid and the built-in indices; __syncthreads (a block barrier
// over the threads that have not exited); __syncwarp and the warp shuffles (a barrier over the
// lanes of the mask, the values exchanged while every lane of the mask waits, with the `width`
// segments of the CUDA semantics); the bf16 tensor-core instruction of the products in bf16
// precision (mma_bf16_16816, the operands exchanged between the lanes as a shuffle does); shared memory per block (dynamic shared memory starts as NaN
// bytes, so a read before a write shows); IEEE single arithmetic without contraction (the build
// passes -ffp-contract=off, as NVRTC gets --fmad=false); thread block clusters along x (a cluster's
// blocks run together, each as far as it goes alone, meeting at cluster_sync; cluster_map is a
// block's view of another's dynamic shared memory). Blocks (clusters) run last
// first and threads between barriers in forward or reverse order, so a kernel that leans on an
// order the GPU does not give reads data before it is written. What it does not: concurrency
// between clusters (they run one after another), the device's expf/logf (the host libm's, within
// 2 ulp of them), the memory model, timing. A cluster's blocks share their static shared memory
// here (it is one per OS thread): kernels launched in clusters keep theirs dynamic.
//
// A deadlock (a barrier some threads never reach, a shuffle whose mask names a lane that has
// exited) and a shuffle reading a lane outside its mask are reported as the launch's error.

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
// Static shared memory: one copy per OS thread, reused block after block (blocks of a launch run
// one at a time on the launching thread, but for a cluster's; launches on other threads have their
// own).
#define __shared__ static thread_local

struct dim3 {
    unsigned x, y, z;
};
typedef dim3 uint3;

static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

namespace sim {

// Launch shape as the Rust side passes it (`SimConfig`).
struct Config {
    unsigned grid[3];
    unsigned block[3];
    unsigned smem;
    unsigned cluster;  // blocks per cluster along x (1: no clusters)
};

enum class Wait : unsigned char { Ready, Block, Cluster, Warp, Done };

struct Fiber {
    void* sp;  // saved stack pointer while switched out
    Wait wait;
    dim3 tid, bid;
    unsigned rank;  // its block's place in the cluster
    int lane, warp;
    unsigned mask;  // lanes of the warp barrier this fiber waits at
    bool shuffling;
    int src;  // lane read by a shuffle
    uint64_t value, result;
};

// The stacks of one OS thread's fibers, reused by every launch on it.
struct Stacks {
    static const size_t kSize = 256 * 1024;
    static const size_t kGuard = 4096;
    std::vector<char*> bases;
    char* top(size_t i) {
        while (bases.size() <= i) {
            void* p = mmap(nullptr, kSize + kGuard, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return nullptr;
            mprotect(p, kGuard, PROT_NONE);  // an overflow faults instead of corrupting
            bases.push_back((char*)p);
        }
        return bases[i] + kGuard + kSize;
    }
    ~Stacks() {
        for (char* b : bases) munmap(b, kSize + kGuard);
    }
};

// Most threads of a cluster (as on a GPU: 8 blocks of 1024).
static const size_t kMaxClusterThreads = 8 * 1024;

struct Launch {
    const char* kernel;
    void (*body)(void*);
    void* body_data;
    std::vector<Fiber> fibers;
    void* sched_sp;
    Fiber* cur;
    std::vector<std::vector<unsigned char>> dynamic_smem;  // per block of the cluster
    size_t threads;                                        // per block
    char* err;
    size_t err_len;
};

static thread_local Launch* L;
static thread_local Stacks stacks;

}  // namespace sim

// Context switch: saves the callee-saved registers on the current stack, stores the stack pointer
// in *from, switches to `to` and restores the registers saved there.
extern "C" void routed_sim_switch(void** from, void* to);
#if defined(__x86_64__)
asm(R"(
    .text
    .p2align 4
    .hidden routed_sim_switch
    .globl routed_sim_switch
    .type routed_sim_switch, @function
routed_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size routed_sim_switch, .-routed_sim_switch
)");
#elif defined(__aarch64__)
asm(R"(
    .text
    .p2align 4
    .hidden routed_sim_switch
    .globl routed_sim_switch
    .type routed_sim_switch, %function
routed_sim_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
    .size routed_sim_switch, .-routed_sim_switch
)");
#else
#error "the CUDA simulator switches fibers on x86-64 and aarch64 only"
#endif

namespace sim {

static void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* fmt, ...) {
    if (L->err[0]) return;  // the first error is the one that matters
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->err_len, fmt, ap);
    va_end(ap);
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
static inline void yield() { routed_sim_switch(&L->cur->sp, L->sched_sp); }

[[noreturn]] static void fiber_main() {
    L->body(L->body_data);
    L->cur->wait = Wait::Done;
    routed_sim_switch(&L->cur->sp, L->sched_sp);
    __builtin_unreachable();
}

// A fresh stack whose first switch "returns" into fiber_main with the ABI's alignment.
static void* initial_sp(char* top) {
    uintptr_t t = ((uintptr_t)top) & ~(uintptr_t)15;
    void** sp = (void**)t;
    *--sp = nullptr;  // fiber_main's return address (it never returns)
    *--sp = (void*)&fiber_main;
#if defined(__x86_64__)
    for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
    return sp;
#else
    // aarch64: the frame of 176 bytes restored by the switch; x30 (the link register) at +88.
    char* frame = (char*)t - 176;
    memset(frame, 0, 176);
    ((void**)frame)[11] = (void*)&fiber_main;
    return frame;
#endif
}

static void resume(Fiber* f) {
    L->cur = f;
    threadIdx = f->tid;
    blockIdx = f->bid;
    routed_sim_switch(&L->sched_sp, f->sp);
}

static unsigned live_lanes(int warp) {
    int n = (int)L->fibers.size() - warp * 32;
    return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

// Releases every warp barrier of block `b` whose lanes have all arrived; true if any was
// released. (A cluster's blocks hold whole warps: their threads are a multiple of 32.)
static bool release_warps(size_t b) {
    bool released = false;
    const int first = (int)(b * L->threads / 32);
    const int end = (int)(((b + 1) * L->threads + 31) / 32);
    for (int w = first; w < end; ++w) {
        Fiber* lanes = &L->fibers[w * 32];
        int n = (int)L->fibers.size() - w * 32;
        if (n > 32) n = 32;
        for (int i = 0; i < n; ++i) {
            if (lanes[i].wait != Wait::Warp) continue;
            unsigned mask = lanes[i].mask & live_lanes(w);
            bool all = true;
            for (int j = 0; j < n && all; ++j)
                if ((mask >> j) & 1u) all = lanes[j].wait == Wait::Warp && lanes[j].mask == lanes[i].mask;
            if (!all) continue;
            for (int j = 0; j < n; ++j) {
                if (!((mask >> j) & 1u)) continue;
                Fiber& f = lanes[j];
                if (f.shuffling) {
                    if (((mask >> f.src) & 1u) && lanes[f.src].shuffling) {
                        f.result = lanes[f.src].value;
                    } else {
                        fail("%s: block (%u,%u,%u) thread %u reads lane %d, outside the shuffle's mask %#x",
                             L->kernel, blockIdx.x, blockIdx.y, blockIdx.z, (unsigned)(w * 32 + j), f.src,
                             lanes[i].mask);
                        f.result = f.value;
                    }
                }
                f.wait = Wait::Ready;
            }
            released = true;
        }
    }
    return released;
}

// Describes why no fiber can go on.
static void deadlock() {
    int at_block = 0, at_cluster = 0, at_warp = -1, done = 0;
    for (size_t i = 0; i < L->fibers.size(); ++i) {
        Wait w = L->fibers[i].wait;
        if (w == Wait::Block) ++at_block;
        if (w == Wait::Cluster) ++at_cluster;
        if (w == Wait::Done) ++done;
        if (w == Wait::Warp && at_warp < 0) at_warp = (int)i;
    }
    const dim3 b = L->fibers[at_warp >= 0 ? at_warp : 0].bid;
    if (at_warp >= 0) {
        fail("%s: block (%u,%u,%u) deadlocks: thread %zu waits at a warp sync with mask %#x that other lanes "
             "never reach (%d threads at __syncthreads, %d at cluster_sync, %d exited)",
             L->kernel, b.x, b.y, b.z, at_warp % L->threads, L->fibers[at_warp].mask, at_block, at_cluster,
             done);
    } else {
        fail("%s: block (%u,%u,%u) deadlocks (%d threads at __syncthreads, %d at cluster_sync, %d exited)",
             L->kernel, b.x, b.y, b.z, at_block, at_cluster, done);
    }
}

// Releases the threads of block `b` (fibers [b * threads, (b + 1) * threads)) once every one of
// them has reached __syncthreads or exited; true if it did.
static bool release_block(size_t b) {
    const size_t first = b * L->threads, end = first + L->threads;
    bool all = true, any = false;
    for (size_t i = first; i < end; ++i) {
        Wait w = L->fibers[i].wait;
        all = all && (w == Wait::Done || w == Wait::Block);
        any = any || w == Wait::Block;
    }
    if (!all || !any) return false;
    for (size_t i = first; i < end; ++i)
        if (L->fibers[i].wait == Wait::Block) L->fibers[i].wait = Wait::Ready;
    return true;
}

// Runs block `b` of the cluster until each of its threads waits at cluster_sync, has exited or is
// stuck. Between two barriers a GPU runs a block's threads in no order the kernel may rely on; the
// simulator runs each ready fiber to its next barrier, lowest thread first or, with `reverse`,
// highest first, so that a write another thread reads without a barrier in between is missed in
// one of the two orders (a broadcast from thread 0 is read before it is written in reverse order;
// partial sums gathered by thread 0 in forward order).
static void run_block(size_t b, bool reverse) {
    const size_t first = b * L->threads, n = L->threads;
    for (;;) {
        bool ran = false;
        for (size_t i = 0; i < n; ++i) {
            Fiber& f = L->fibers[first + (reverse ? n - 1 - i : i)];
            if (f.wait != Wait::Ready) continue;
            resume(&f);
            ran = true;
        }
        if (L->err[0]) return;
        if (release_warps(b) || release_block(b)) continue;
        if (!ran) return;
    }
}

// Runs one cluster (one block without clusters) to the end (or to an error): each block in turn
// (the last first with `reverse`) as far as it goes on its own, then the cluster barrier once
// every thread is there. Blocks thus meet only at cluster barriers, so one that reads another's
// shared memory without a barrier between the write and the read reads it unwritten in one of
// the two orders; and a block's shared memory turns to NaN bytes once it has exited, so reading
// a block that may have left (no cluster barrier before the reader's exit) shows as well.
static void run_cluster(bool reverse) {
    const size_t blocks = L->fibers.size() / L->threads;
    for (;;) {
        for (size_t k = 0; k < blocks; ++k) {
            const size_t b = reverse ? blocks - 1 - k : k;
            run_block(b, reverse);
            if (L->err[0]) return;
            bool exited = true;
            for (size_t i = b * L->threads; i < (b + 1) * L->threads; ++i)
                exited = exited && L->fibers[i].wait == Wait::Done;
            if (exited && blocks > 1) memset(L->dynamic_smem[b].data(), 0xff, L->dynamic_smem[b].size());
        }
        bool all_done = true, all_there = true;
        for (const Fiber& f : L->fibers) {
            all_done = all_done && f.wait == Wait::Done;
            all_there = all_there && (f.wait == Wait::Done || f.wait == Wait::Cluster);
        }
        if (all_done) return;
        if (!all_there) {
            deadlock();
            return;
        }
        for (Fiber& f : L->fibers)
            if (f.wait == Wait::Cluster) f.wait = Wait::Ready;
    }
}

template <typename... A, size_t... I>
static void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <typename... A>
struct Body {
    void (*kernel)(A...);
    void** args;
    static void run(void* self) {
        Body* b = static_cast<Body*>(self);
        call(b->kernel, b->args, std::index_sequence_for<A...>{});
    }
};

// Runs `kernel` over the grid of `c`; 0 on success, else 1 with the message in `err`.
template <typename... A>
static int launch(const char* name, void (*kernel)(A...), const Config* c, void** args, char* err, size_t err_len) {
    Body<A...> body{kernel, args};
    Launch launch;
    launch.kernel = name;
    launch.body = &Body<A...>::run;
    launch.body_data = &body;
    launch.err = err;
    launch.err_len = err_len;
    err[0] = 0;
    Launch* outer = L;
    L = &launch;
    gridDim = dim3{c->grid[0], c->grid[1], c->grid[2]};
    blockDim = dim3{c->block[0], c->block[1], c->block[2]};
    const size_t threads = (size_t)c->block[0] * c->block[1] * c->block[2];
    const unsigned cluster = c->cluster ? c->cluster : 1;
    if (c->grid[0] % cluster || (cluster > 1 && threads % 32) || threads * cluster > kMaxClusterThreads) {
        fail("%s: clusters of %u blocks of %zu threads over a grid of %u in x", name, cluster, threads, c->grid[0]);
        L = outer;
        return 1;
    }
    launch.threads = threads;
    const size_t num_fibers = threads * cluster;
    launch.fibers.resize(num_fibers);
    launch.dynamic_smem.assign(cluster, std::vector<unsigned char>(c->smem));
    for (size_t i = 0; i < num_fibers; ++i) {
        if (!stacks.top(i)) {
            fail("%s: no memory for %zu fiber stacks", name, num_fibers);
            L = outer;
            return 1;
        }
    }
    // Clusters (blocks) run last first: a GPU gives them no order, and a block that reads what a
    // lower one of the same launch writes is then reading it before it is written. Even clusters
    // (so every one-block launch) run their threads in reverse order, odd ones in order (see
    // run_cluster).
    const size_t clusters_x = c->grid[0] / cluster;
    const size_t num_clusters = clusters_x * c->grid[1] * c->grid[2];
    for (size_t q = num_clusters; q-- > 0 && !err[0];) {
        const unsigned x0 = (unsigned)(q % clusters_x * cluster), y = (unsigned)(q / clusters_x % c->grid[1]),
                       z = (unsigned)(q / (clusters_x * c->grid[1]));
        // NaN bytes: a read of dynamic shared memory before any write shows in the output.
        for (auto& smem : launch.dynamic_smem) memset(smem.data(), 0xff, smem.size());
        for (size_t i = 0; i < num_fibers; ++i) {
            Fiber& f = launch.fibers[i];
            const size_t t = i % threads;
            f = Fiber{};
            f.tid = dim3{(unsigned)(t % c->block[0]), (unsigned)(t / c->block[0] % c->block[1]),
                         (unsigned)(t / ((size_t)c->block[0] * c->block[1]))};
            f.rank = (unsigned)(i / threads);
            f.bid = dim3{x0 + f.rank, y, z};
            f.lane = (int)(t % 32);
            f.warp = (int)(i / 32);
            f.wait = Wait::Ready;
            f.sp = initial_sp(stacks.top(i));
        }
        run_cluster(q % 2 == 0);
    }
    L = outer;
    return err[0] ? 1 : 0;
}

static inline unsigned char* dynamic_smem() { return L->dynamic_smem[L->cur->rank].data(); }

// The address `p` (in this block's dynamic shared memory) has in block `rank` of the cluster.
template <typename T>
static inline T* cluster_map(T* p, unsigned rank) {
    auto& mine = L->dynamic_smem[L->cur->rank];
    const uintptr_t at = (uintptr_t)p, base = (uintptr_t)mine.data();
    if (at < base || at >= base + mine.size() || rank >= L->dynamic_smem.size()) {
        fail("%s: cluster_map of an address outside dynamic shared memory, or to block %u of %zu", L->kernel,
             rank, L->dynamic_smem.size());
        return p;
    }
    return (T*)(L->dynamic_smem[rank].data() + (at - base));
}

template <typename T>
static inline T shuffle(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    Fiber* f = L->cur;
    f->mask = mask;
    f->shuffling = true;
    f->src = src;
    f->value = 0;
    memcpy(&f->value, &v, sizeof(T));
    f->wait = Wait::Warp;
    yield();
    f->shuffling = false;
    T r;
    memcpy(&r, &f->result, sizeof(T));
    return r;
}

}  // namespace sim

// ---- CUDA built-ins the kernels use ----

static inline void __syncthreads() {
    sim::L->cur->wait = sim::Wait::Block;
    sim::yield();
}

// barrier.cluster: every thread of every block of the cluster (exited ones count as there), with
// the ordering of its release and acquire.
static inline void cluster_sync() {
    sim::L->cur->wait = sim::Wait::Cluster;
    sim::yield();
}

template <typename T>
static inline T* cluster_map(T* p, unsigned rank) {
    return sim::cluster_map(p, rank);
}

static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    sim::Fiber* f = sim::L->cur;
    f->mask = mask;
    f->shuffling = false;
    f->wait = sim::Wait::Warp;
    sim::yield();
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    int lane = sim::L->cur->lane;
    return sim::shuffle(mask, v, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    int lane = sim::L->cur->lane;
    int src = lane ^ lane_mask;
    if (src >= (lane & ~(width - 1)) + width) src = lane;
    return sim::shuffle(mask, v, src);
}

template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = sim::L->cur->lane;
    int src = (lane & (width - 1)) + (int)delta >= width ? lane : lane + (int)delta;
    return sim::shuffle(mask, v, src);
}

template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int lane = sim::L->cur->lane;
    int src = (lane & (width - 1)) < (int)delta ? lane : lane - (int)delta;
    return sim::shuffle(mask, v, src);
}

// mma.sync.m16n8k16 with bf16 inputs and f32 accumulation (gemm/mma_tile.cuh), a warp
// collective: every lane posts its fragments, the warp meets, each lane computes its four
// outputs from everyone's fragments, and the warp meets again before any lane may post anew.
// The operand layout is the PTX ISA's; inside a tile the sums are taken in ascending k (the
// hardware's own order is its own, so tests compare the results with a summation bound).
#define ROUTED_SIM 1

namespace sim {
struct MmaLane {
    unsigned a[4], b[2];
};
// [warp][lane] of the running cluster (at most kMaxClusterThreads threads).
static thread_local MmaLane mma_lanes[kMaxClusterThreads / 32][32];

static inline float bf16_half(unsigned pair, int upper) {
    unsigned bits = (upper ? pair >> 16 : pair & 0xffffu) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
}  // namespace sim

static inline void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                  const float (&c)[4]) {
    sim::Fiber* f = sim::L->cur;
    sim::MmaLane& me = sim::mma_lanes[f->warp][f->lane];
    memcpy(me.a, a, sizeof me.a);
    memcpy(me.b, b, sizeof me.b);
    float sums[4];
    memcpy(sums, c, sizeof sums);
    __syncwarp();
    const sim::MmaLane* lanes = sim::mma_lanes[f->warp];
    const int g = f->lane / 4, t = f->lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        for (int k = 0; k < 16; ++k) {
            // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (k / 8) * 2 + row / 8.
            const sim::MmaLane& al = lanes[(row % 8) * 4 + (k % 8) / 2];
            const float av = sim::bf16_half(al.a[(k / 8) * 2 + row / 8], k & 1);
            // B[k][col]: lane col * 4 + (k % 8) / 2, register k / 8.
            const sim::MmaLane& bl = lanes[col * 4 + (k % 8) / 2];
            const float bv = sim::bf16_half(bl.b[k / 8], k & 1);
            sums[i] = sums[i] + av * bv;
        }
    }
    __syncwarp();
    memcpy(d, sums, sizeof sums);
}

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }

template <typename To, typename From>
static inline To bits_as(From v) {
    static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the size");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}
static inline float __uint_as_float(unsigned v) { return bits_as<float>(v); }
static inline float __int_as_float(int v) { return bits_as<float>(v); }
static inline unsigned __float_as_uint(float f) { return bits_as<unsigned>(f); }
static inline int __float_as_int(float f) { return bits_as<int>(f); }
static inline long long __double_as_longlong(double d) { return bits_as<long long>(d); }
static inline double __longlong_as_double(long long v) { return bits_as<double>(v); }

// CUDA's overloads of min and max for the integer types the kernels mix.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

// Atomics. A thread runs on until it reaches a barrier, so no other thread's access can come
// between the read and the write.
template <typename T>
static inline T atomic_update(T* p, T v, T (*f)(T, T)) {
    T old = *p;
    *p = f(old, v);
    return old;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return atomic_update<unsigned>(p, v, [](unsigned a, unsigned b) { return a + b; });
}
static inline unsigned atomicMin(unsigned* p, unsigned v) {
    return atomic_update<unsigned>(p, v, [](unsigned a, unsigned b) { return min(a, b); });
}
static inline unsigned atomicMax(unsigned* p, unsigned v) {
    return atomic_update<unsigned>(p, v, [](unsigned a, unsigned b) { return max(a, b); });
}

// Leading zero bits of a 64-bit word (64 for 0).
static inline int __clzll(long long v) { return v ? __builtin_clzll((unsigned long long)v) : 64; }

// Exports the launch entry of kernel `k` as `routed_sim_<k>`.
#define ROUTED_SIM_EXPORT(k)                                                                     \
    extern "C" __attribute__((visibility("default"))) int routed_sim_##k(                        \
        const sim::Config* c, void** args, char* err, size_t err_len) {                          \
        return sim::launch(#k, &k, c, args, err, err_len);                                       \
    }

// The unit's source follows.
