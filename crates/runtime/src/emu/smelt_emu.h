// smelt's CUDA emulator: what the generated CUDA C uses, for the host C++
// compiler. A kernel's text compiles unchanged against this header, except
// that the emulator turns each pointer parameter `T* NAME` into a checked
// pointer `smelt_emu::Ptr<T> NAME` (every access checked against the
// argument's planned extent), so generated code must address memory through
// its parameters (no raw derived pointers).
//
// Execution: a block's threads run one at a time on one OS thread. Kernels
// without `__syncthreads` run each thread to completion; kernels with it run
// each thread as a fiber (its own stack) that yields at the barrier, and the
// block's scheduler resumes the next only after every live thread arrived
// (in the order the launch's `Schedule` gives, below).
// `__shared__` variables are per OS thread (one block at a time runs on it).
//
// Numerics follow CUDA: `__half` conversions round to nearest even (the host
// `_Float16`), `__nv_bfloat16` likewise; f32 arithmetic is IEEE with no
// contraction (`-ffp-contract=off`), as smelt's CPU descriptions compute.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned int x, y, z; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct dim3 { unsigned int x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// CUDA's integer min and max overloads.
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }

inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __int_as_float(unsigned int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// CUDA's reciprocal square root (the device version is within 2 ulp of this).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

struct __half { unsigned short x; };
inline __half __float2half(float f) {
    _Float16 h = (_Float16)f;
    __half r;
    std::memcpy(&r.x, &h, 2);
    return r;
}
inline __half __float2half_rn(float f) { return __float2half(f); }
// Exact, from the bits (the compiler's `_Float16` widening is a libgcc
// call on hosts without F16C): a NaN comes back quiet, as the hardware's.
inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu, u;
    if (e == 0x1fu) {
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else {
        float f = (float)m * 0x1p-24f;  // zero or subnormal: exact in f32
        std::memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

struct __nv_bfloat16 { unsigned short x; };
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = 0x7fff;  // CUDA's canonical NaN
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
        r.x = (unsigned short)(u >> 16);
    }
    return r;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

namespace smelt_emu {

// One pointer parameter's planned extent, as the runtime passes it.
struct Extent {
    unsigned long long lo, hi;  // host addresses: [lo, hi)
};

// One call of the launcher: a range of blocks of one launch.
struct Launch {
    unsigned int grid[3], block[3];
    unsigned long long block_begin, block_end;  // linear block ids
    const Extent* extents;                       // one per parameter (pointers only)
    unsigned long long nparams;
    char* error;                                 // first error, NUL-terminated
    unsigned long long error_cap;
    unsigned long long errors;                   // how many accesses failed
    unsigned int schedule;                       // kLockstep, kWarpsInOrder or kWarpsReversed
};

// The order a block's threads run in between barriers. Every order is one
// a GPU may take, so a kernel without races computes the same bytes in each;
// a missing barrier shows in one of them as different bytes.
//  - kLockstep: every warp runs to its next warp operation (lanes in
//    order), then the next warp; warps advance together.
//  - kWarpsInOrder: one warp at a time runs until all its lanes wait at
//    __syncthreads (its warp operations released as soon as they arrive):
//    a warp that overwrites shared memory its neighbours still read, with
//    no barrier between, does so before they read.
//  - kWarpsReversed: the same, warps and lanes in reverse order.
enum Schedule : unsigned int { kLockstep, kWarpsInOrder, kWarpsReversed };

}  // namespace smelt_emu

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace smelt_emu {

thread_local Launch* current;

template <class... A>
void fail(const char* fmt, A... a) {
    Launch* l = current;
    if (l->errors++ == 0 && l->error_cap > 0) {
        char what[512];
        std::snprintf(what, sizeof what, fmt, a...);
        std::snprintf(l->error, l->error_cap, "thread (%u,%u,%u) of block (%u,%u,%u): %s", threadIdx.x, threadIdx.y,
                      threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
    }
}

// A pointer parameter: every access checked against its argument's extent.
// An access outside it is recorded (the first with thread and block) and
// reads or writes a scratch element instead, so the launch finishes.
template <class T>
struct Ptr {
    T* p;
    const char* lo;
    const char* hi;
    const char* name;

    static Ptr make(void* arg, unsigned long long i, const char* name) {
        Ptr r;
        std::memcpy(&r.p, arg, sizeof(void*));
        const Extent& e = current->extents[i];
        r.lo = (const char*)e.lo;
        r.hi = (const char*)e.hi;
        r.name = name;
        if ((unsigned long long)r.p % alignof(T) != 0) {
            fail("parameter %s at address 0x%llx is not aligned to %llu bytes", name, (unsigned long long)r.p,
                 (unsigned long long)alignof(T));
        }
        return r;
    }

    template <class I>
    T& operator[](I i) const {
        static_assert(std::is_integral<I>::value, "index a pointer parameter with an integer");
        long long k = (long long)i;
        const char* at = (const char*)p + k * (long long)sizeof(T);
        if (at < lo || at + sizeof(T) > hi) {
            fail("%s[%lld] is outside its argument (%llu bytes, element of %llu bytes)", name, k,
                 (unsigned long long)(hi - lo), (unsigned long long)sizeof(T));
            static thread_local typename std::remove_const<T>::type scratch[1];
            std::memset((void*)scratch, 0, sizeof scratch);
            return scratch[0];
        }
        return p[k];
    }
    T& operator*() const { return (*this)[0]; }
    template <class I>
    Ptr operator+(I i) const {
        Ptr r = *this;
        r.p = p + (long long)i;
        return r;
    }
};

// ---- fibers -------------------------------------------------------------
// A switch saves and restores the callee-saved registers only: the floating
// point environment (MXCSR, the x87 control word) is the OS thread's, which
// no kernel changes (saving and loading it cost 9 in 10 of a switch's time).

#if defined(__x86_64__)
extern "C" void smelt_emu_switch(void** save, void* load);
extern "C" void smelt_emu_fiber_start();
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".globl smelt_emu_switch\n"
    ".hidden smelt_emu_switch\n"
    ".type smelt_emu_switch,@function\n"
    "smelt_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size smelt_emu_switch, .-smelt_emu_switch\n"
    ".globl smelt_emu_fiber_start\n"
    ".hidden smelt_emu_fiber_start\n"
    ".type smelt_emu_fiber_start,@function\n"
    "smelt_emu_fiber_start:\n"
    "  movq %rbx, %rdi\n  callq *%r12\n  ud2\n"
    ".size smelt_emu_fiber_start, .-smelt_emu_fiber_start\n");
#else
#error "smelt's emulator switches fibers with x86-64 assembly; this host is not x86-64"
#endif

constexpr unsigned long long kStack = 64 * 1024;

enum State : unsigned char { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
    void* sp;
    State state;
    unsigned int tid;
};

struct Block {
    Fiber* fibers;
    unsigned int count;
    Fiber* running;
    void* scheduler_sp;
    void (*body)(void*);
    void* data;
    char* stacks;
    unsigned long long exchange[32][32];  // per warp, per lane: a collective's operand
};

thread_local Block* block;

inline uint3 thread_of(unsigned int t, const Launch* l) {
    return uint3{t % l->block[0], t / l->block[0] % l->block[1], t / (l->block[0] * l->block[1])};
}

extern "C" inline void smelt_emu_fiber_main(Fiber* f) {
    Block* b = block;
    b->body(b->data);
    f->state = kDone;
    void* dead;
    smelt_emu_switch(&dead, b->scheduler_sp);
    __builtin_unreachable();
}

inline void init_fiber(Fiber* f, char* stack_top) {
    uintptr_t top = (uintptr_t)stack_top & ~(uintptr_t)15;
    void** sp = (void**)(top - 56);
    sp[0] = nullptr;                           // r15
    sp[1] = nullptr;                           // r14
    sp[2] = nullptr;                           // r13
    sp[3] = (void*)&smelt_emu_fiber_main;      // r12: the entry
    sp[4] = (void*)f;                          // rbx: its argument
    sp[5] = nullptr;                           // rbp
    sp[6] = (void*)&smelt_emu_fiber_start;     // return address
    f->sp = sp;
    f->state = kReady;
}

// Yields the running thread to its block's scheduler, waiting at a block
// barrier or at its warp's.
inline void wait(State at) {
    Block* b = block;
    if (b == nullptr) return;  // a block of one thread
    Fiber* f = b->running;
    f->state = at;
    smelt_emu_switch(&f->sp, b->scheduler_sp);
}

// The running thread's lane and warp, and the mask of its warp's live lanes.
inline unsigned int lane() { return block ? block->running->tid % 32 : 0; }
inline unsigned int warp() { return block ? block->running->tid / 32 : 0; }
inline unsigned int live_lanes() {
    Block* b = block;
    if (b == nullptr) return 1u;
    unsigned int w = warp(), mask = 0;
    for (unsigned int l = 0; l < 32 && w * 32 + l < b->count; ++l) {
        if (b->fibers[w * 32 + l].state != kDone) mask |= 1u << l;
    }
    return mask;
}

// A warp collective: every live lane deposits `v`, all wait, each reads
// the lane `src(lane)` chose (its own value when out of range), all wait
// again (so the slots can be reused).
template <class T, class F>
T exchange(T v, F src) {
    static_assert(sizeof(T) <= 8, "warp exchange of at most 8 bytes");
    Block* b = block;
    if (b == nullptr) return v;
    unsigned int w = warp(), l = lane();
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    b->exchange[w][l] = bits;
    wait(kAtWarpBarrier);
    int from = src((int)l);
    T r = v;
    if (from >= 0 && from < 32 && w * 32 + from < b->count) std::memcpy(&r, &b->exchange[w][from], sizeof(T));
    wait(kAtWarpBarrier);
    return r;
}

}  // namespace smelt_emu

// Asynchronous copies to shared memory (cuda_pipeline.h's primitives, which
// are `cp.async` from sm_80 on): each thread's copies are queued in groups
// and performed only when `__pipeline_wait_prior` waits for their group,
// and until then the destination holds NaNs (0xff bytes), as a copy in
// flight may: a kernel that reads it before waiting, or that starts a copy
// into bytes other threads still read (no barrier between), computes NaNs.
namespace smelt_emu {
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned long long bytes, zeros, group;
};
constexpr unsigned kMaxAsync = 64;
struct AsyncQueue {
    AsyncCopy copies[kMaxAsync];
    unsigned n;
    unsigned long long committed;
};
// Per thread of the block running on this OS thread (at most 1024).
inline thread_local AsyncQueue* async_queues = nullptr;
inline AsyncQueue& async_queue() {
    if (async_queues == nullptr) async_queues = (AsyncQueue*)std::calloc(1024, sizeof(AsyncQueue));
    if (async_queues == nullptr) {
        std::fprintf(stderr, "smelt emulator: out of memory for the asynchronous copy queues\n");
        std::abort();
    }
    return async_queues[threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)];
}
// Forgets every thread's queue (a new block starts).
inline void reset_async(unsigned int threads) {
    if (async_queues != nullptr) std::memset((void*)async_queues, 0, sizeof(AsyncQueue) * threads);
}
}  // namespace smelt_emu

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes, size_t zfill = 0) {
    smelt_emu::AsyncQueue& q = smelt_emu::async_queue();
    if (!(bytes == 4 || bytes == 8 || bytes == 16) || zfill > bytes) {
        smelt_emu::fail("__pipeline_memcpy_async of %llu bytes (%llu zero-filled): 4, 8 or 16 only", (unsigned long long)bytes,
                        (unsigned long long)zfill);
        return;
    }
    if ((unsigned long long)dst % bytes != 0 || (unsigned long long)src % bytes != 0) {
        smelt_emu::fail("__pipeline_memcpy_async of %llu bytes from 0x%llx to 0x%llx: both must be aligned to the size",
                        (unsigned long long)bytes, (unsigned long long)src, (unsigned long long)dst);
        return;
    }
    if (q.n == smelt_emu::kMaxAsync) {
        smelt_emu::fail("more than %u asynchronous copies in flight", smelt_emu::kMaxAsync);
        return;
    }
    q.copies[q.n++] = smelt_emu::AsyncCopy{dst, src, bytes - zfill, zfill, q.committed};
    std::memset(dst, 0xff, bytes);
}
inline void __pipeline_commit() { smelt_emu::async_queue().committed++; }
// Completes the copies of every committed group but the `prior` latest.
inline void __pipeline_wait_prior(size_t prior) {
    smelt_emu::AsyncQueue& q = smelt_emu::async_queue();
    unsigned kept = 0;
    for (unsigned i = 0; i < q.n; ++i) {
        smelt_emu::AsyncCopy c = q.copies[i];
        if (c.group + prior < q.committed) {
            std::memcpy(c.dst, c.src, c.bytes);
            std::memset((char*)c.dst + c.bytes, 0, c.zeros);
        } else {
            q.copies[kept++] = c;
        }
    }
    q.n = kept;
}

// The block barrier: yield until every live thread of the block arrived.
inline void __syncthreads() { smelt_emu::wait(smelt_emu::kAtBlockBarrier); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) { (void)mask; smelt_emu::wait(smelt_emu::kAtWarpBarrier); }
inline unsigned int __activemask() { return smelt_emu::live_lanes(); }

// Shuffles within segments of `width` lanes, as CUDA defines them.
template <class T>
T __shfl_sync(unsigned int, T v, int src, int width = 32) {
    return smelt_emu::exchange(v, [=](int l) { return (l & ~(width - 1)) + (src & (width - 1)); });
}
template <class T>
T __shfl_down_sync(unsigned int, T v, unsigned int d, int width = 32) {
    return smelt_emu::exchange(v, [=](int l) { return (l % width) + (int)d < width ? l + (int)d : l; });
}
template <class T>
T __shfl_up_sync(unsigned int, T v, unsigned int d, int width = 32) {
    return smelt_emu::exchange(v, [=](int l) { return (l % width) >= (int)d ? l - (int)d : l; });
}
template <class T>
T __shfl_xor_sync(unsigned int, T v, int m, int width = 32) {
    return smelt_emu::exchange(v, [=](int l) { return ((l ^ m) & ~(width - 1)) == (l & ~(width - 1)) ? (l ^ m) : l; });
}
inline unsigned int __ballot_sync(unsigned int mask, int pred) {
    smelt_emu::Block* b = smelt_emu::block;
    if (b == nullptr) return pred ? 1u : 0u;
    unsigned int w = smelt_emu::warp();
    b->exchange[w][smelt_emu::lane()] = pred != 0;
    smelt_emu::wait(smelt_emu::kAtWarpBarrier);
    unsigned int live = smelt_emu::live_lanes(), r = 0;
    for (unsigned int l = 0; l < 32; ++l) {
        if ((live & mask & (1u << l)) && b->exchange[w][l]) r |= 1u << l;
    }
    smelt_emu::wait(smelt_emu::kAtWarpBarrier);
    return r;
}
inline int __any_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned int mask, int pred) {
    return __ballot_sync(mask, pred) == (mask & smelt_emu::live_lanes());
}

// Tensor-core fragments (nvcuda::wmma), executed per warp: every lane holds
// the whole tile (row-major), loads and stores all of it, and computes the
// whole product with f32 accumulation in ascending k; each operation is a
// warp collective (all live lanes arrive before any goes on).
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct shape_of;
template <int M, int N, int K> struct shape_of<matrix_a, M, N, K> { static const int rows = M, cols = K; };
template <int M, int N, int K> struct shape_of<matrix_b, M, N, K> { static const int rows = K, cols = N; };
template <int M, int N, int K> struct shape_of<accumulator, M, N, K> { static const int rows = M, cols = N; };

namespace precision {
// TF32 operands: stored as float, rounded by __float_to_tf32.
struct tf32 {};
}  // namespace precision
template <class T> struct storage { typedef T type; };
template <> struct storage<precision::tf32> { typedef float type; };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static const int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
    static const int num_elements = rows * cols;
    typename storage<T>::type x[rows * cols];
};

// cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero; infinities and
// NaN unchanged.
inline float __float_to_tf32(float v) {
    unsigned int b;
    std::memcpy(&b, &v, 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return v;
    b = (b + 0x1000u) & 0xffffe000u;
    std::memcpy(&v, &b, 4);
    return v;
}

inline float to_f(float v) { return v; }
inline float to_f(__half v) { return __half2float(v); }
inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline __half from_f<__half>(float v) { return __float2half(v); }
template <> inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

template <class Use, int M, int N, int K, class T, class L, class V>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, V v) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = (typename storage<T>::type)v;
}
template <class F, class P>
void load_tile(F& f, P p, unsigned int ldm, bool col) {
    __syncwarp();
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = col ? p[(unsigned long long)c * ldm + r] : p[(unsigned long long)r * ldm + c];
}
template <class Use, int M, int N, int K, class T, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, P p, unsigned int ldm) { load_tile(f, p, ldm, false); }
template <class Use, int M, int N, int K, class T, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, P p, unsigned int ldm) { load_tile(f, p, ldm, true); }
template <int M, int N, int K, class T, class P>
void load_matrix_sync(fragment<accumulator, M, N, K, T, void>& f, P p, unsigned int ldm, layout_t l) {
    load_tile(f, p, ldm, l == mem_col_major);
}
template <int M, int N, int K, class T, class P>
void store_matrix_sync(P p, const fragment<accumulator, M, N, K, T, void>& f, unsigned int ldm, layout_t l) {
    __syncwarp();
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) {
            unsigned long long at = l == mem_col_major ? (unsigned long long)c * ldm + r : (unsigned long long)r * ldm + c;
            p[at] = f.x[r * N + c];
        }
}
// The product, computed once per warp by its first live lane: a fragment is
// the warp's, so every other lane checks that its operands are the
// leader's (a lane-dependent fragment is an error) and takes the result.
struct MmaSlot {
    const void* a;
    const void* b;
    const void* c;
    unsigned int turn;
    float out[256];
};
template <int M, int N, int K, class TD>
void take(fragment<accumulator, M, N, K, TD, void>& d, const float* out) {
    if constexpr (std::is_same<TD, float>::value) {
        std::memcpy(d.x, out, sizeof d.x);
    } else {
        for (int i = 0; i < M * N; ++i) d.x[i] = from_f<TD>(out[i]);
    }
}
template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC, class TD>
void mma_sync(fragment<accumulator, M, N, K, TD, void>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC, void>& c) {
    static_assert(M * N <= 256, "a wmma tile of at most 256 elements");
    static thread_local MmaSlot slots[32];
    MmaSlot& slot = slots[smelt_emu::warp()];
    bool leader = (unsigned int)__builtin_ctz(smelt_emu::live_lanes()) == smelt_emu::lane();
    // The leader writes the slot only after every lane took the previous
    // product (the second barrier below), and its own `d` (which may be
    // `c`) only after the others compared their `c` with it.
    if (leader) {
        float fa[M * K], fb[K * N];
        for (int i = 0; i < M * K; ++i) fa[i] = to_f(a.x[i]);
        for (int i = 0; i < K * N; ++i) fb[i] = to_f(b.x[i]);
        // Each result accumulates in ascending k (the loop over j only
        // lets the host vectorize).
        for (int i = 0; i < M; ++i) {
            float* acc = &slot.out[i * N];
            for (int j = 0; j < N; ++j) acc[j] = to_f(c.x[i * N + j]);
            for (int k = 0; k < K; ++k) {
                float av = fa[i * K + k];
                for (int j = 0; j < N; ++j) acc[j] += av * fb[k * N + j];
            }
        }
        slot.a = &a;
        slot.b = &b;
        slot.c = &c;
        slot.turn = (slot.turn + 1) % 32;
    }
    __syncwarp();
    if (!leader) {
        // One lane a call compares its operands, in turn: a lane-dependent
        // fragment differs on every call, so it is caught within 32 calls
        // at a 31st of the cost of comparing every lane every time.
        if (slot.turn == smelt_emu::lane() &&
            (std::memcmp(slot.a, &a, sizeof a) != 0 || std::memcmp(slot.b, &b, sizeof b) != 0 || std::memcmp(slot.c, &c, sizeof c) != 0)) {
            smelt_emu::fail("wmma::mma_sync: lane %u's operands differ from lane %u's (a fragment is the warp's)",
                            smelt_emu::lane(), (unsigned int)__builtin_ctz(smelt_emu::live_lanes()));
        }
        take(d, slot.out);
    }
    __syncwarp();
    if (leader) take(d, slot.out);
}
}  // namespace wmma
}  // namespace nvcuda

namespace smelt_emu {

// Runs blocks [l->block_begin, l->block_end) of a launch: `body(data)` once
// per thread, with threadIdx, blockIdx, blockDim and gridDim set. With
// `collectives`, each thread is a fiber: `__syncthreads` waits for every
// live thread of the block, a warp operation for every live lane of the
// warp; threads waiting at different barriers forever are an error.
inline int run(Launch* l, bool collectives, void (*body)(void*), void* data) {
    current = l;
    gridDim = dim3{l->grid[0], l->grid[1], l->grid[2]};
    blockDim = dim3{l->block[0], l->block[1], l->block[2]};
    unsigned int threads = l->block[0] * l->block[1] * l->block[2];
    Block* b = nullptr;
    if (collectives && threads > 1) {
        b = (Block*)std::calloc(1, sizeof(Block));
        if (b != nullptr) {
            b->count = threads;
            b->fibers = (Fiber*)std::calloc(threads, sizeof(Fiber));
            b->stacks = (char*)std::malloc(kStack * threads);
        }
        if (b == nullptr || b->fibers == nullptr || b->stacks == nullptr) {
            if (b != nullptr) {
                std::free(b->fibers);
                std::free(b->stacks);
                std::free(b);
            }
            std::snprintf(l->error, l->error_cap, "out of memory for %u fiber stacks", threads);
            return 1;
        }
        b->body = body;
        b->data = data;
    }
    int rc = 0;
    for (unsigned long long lin = l->block_begin; lin < l->block_end && rc == 0; ++lin) {
        blockIdx = uint3{(unsigned int)(lin % l->grid[0]), (unsigned int)(lin / l->grid[0] % l->grid[1]),
                         (unsigned int)(lin / ((unsigned long long)l->grid[0] * l->grid[1]))};
        reset_async(threads);
        if (b == nullptr) {
            for (unsigned int i = 0; i < threads; ++i) {
                threadIdx = thread_of(l->schedule == kWarpsReversed ? threads - 1 - i : i, l);
                body(data);
            }
            continue;
        }
        for (unsigned int t = 0; t < threads; ++t) {
            b->fibers[t].tid = t;
            init_fiber(&b->fibers[t], b->stacks + kStack * (t + 1));
        }
        block = b;
        unsigned int live = threads;
        bool reversed = l->schedule == kWarpsReversed;
        unsigned int warps = (threads + 31) / 32;
        // Runs thread `t` until it waits or ends.
        auto step = [&](unsigned int t) {
            Fiber* f = &b->fibers[t];
            if (f->state != kReady) return;
            b->running = f;
            threadIdx = thread_of(t, l);
            smelt_emu_switch(&b->scheduler_sp, f->sp);
            if (f->state == kDone) --live;
        };
        // Releases warp `w` if its live lanes all wait at a warp operation.
        auto release_warp = [&](unsigned int w) {
            unsigned int waiting = 0, alive = 0, end = w * 32 + 32 < threads ? w * 32 + 32 : threads;
            for (unsigned int t = w * 32; t < end; ++t) {
                alive += b->fibers[t].state != kDone;
                waiting += b->fibers[t].state == kAtWarpBarrier;
            }
            if (waiting == 0 || waiting != alive) return false;
            for (unsigned int t = w * 32; t < end; ++t)
                if (b->fibers[t].state == kAtWarpBarrier) b->fibers[t].state = kReady;
            return true;
        };
        while (live > 0) {
            if (l->schedule == kLockstep) {
                for (unsigned int t = 0; t < threads; ++t) step(t);
                if (live == 0) break;
                // Release each warp whose live lanes all wait at a warp
                // operation; else the block (below).
                bool released = false;
                for (unsigned int w = 0; w < warps; ++w) released |= release_warp(w);
                if (released) continue;
            } else {
                // One warp at a time, as far as it goes without the others.
                for (unsigned int i = 0; i < warps; ++i) {
                    unsigned int w = reversed ? warps - 1 - i : i;
                    unsigned int end = w * 32 + 32 < threads ? w * 32 + 32 : threads;
                    do {
                        for (unsigned int j = w * 32; j < end; ++j) step(reversed ? end - 1 - (j - w * 32) : j);
                    } while (release_warp(w));
                }
                if (live == 0) break;
            }
            // Release the block if every live thread waits at __syncthreads;
            // else nobody can go on.
            unsigned int at_block = 0, at_warp = 0;
            for (unsigned int t = 0; t < threads; ++t) {
                at_block += b->fibers[t].state == kAtBlockBarrier;
                at_warp += b->fibers[t].state == kAtWarpBarrier;
            }
            if (at_block == live) {
                for (unsigned int t = 0; t < threads; ++t)
                    if (b->fibers[t].state == kAtBlockBarrier) b->fibers[t].state = kReady;
                continue;
            }
            l->errors++;
            std::snprintf(l->error, l->error_cap,
                          "block (%u,%u,%u) deadlocks: %u threads wait at __syncthreads while %u wait at a warp operation "
                          "that some lane of their warp never reaches (divergent barrier)",
                          blockIdx.x, blockIdx.y, blockIdx.z, at_block, at_warp);
            rc = 1;
            break;
        }
        block = nullptr;
    }
    if (b != nullptr) {
        std::free(b->fibers);
        std::free(b->stacks);
        std::free(b);
    }
    return rc;
}

}  // namespace smelt_emu
