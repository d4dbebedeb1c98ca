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
// block's scheduler resumes the next only after every live thread arrived.
// `__shared__` variables are per OS thread (one block at a time runs on it).
//
// Numerics follow CUDA: `__half` conversions round to nearest even (the host
// `_Float16`), `__nv_bfloat16` likewise; f32 arithmetic is IEEE with no
// contraction (`-ffp-contract=off`), as smelt's CPU descriptions compute.
#pragma once
#include <cmath>
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

struct uint3 { unsigned int x, y, z; };
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

struct __half { unsigned short x; };
inline __half __float2half(float f) {
    _Float16 h = (_Float16)f;
    __half r;
    std::memcpy(&r.x, &h, 2);
    return r;
}
inline __half __float2half_rn(float f) { return __float2half(f); }
inline float __half2float(__half h) {
    _Float16 v;
    std::memcpy(&v, &h.x, 2);
    return (float)v;
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
};

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
    "  subq $16, %rsp\n  stmxcsr 8(%rsp)\n  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr 8(%rsp)\n  fldcw (%rsp)\n  addq $16, %rsp\n"
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

struct Fiber {
    void* sp;
    bool done;
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
};

thread_local Block* block;

inline uint3 thread_of(unsigned int t, const Launch* l) {
    return uint3{t % l->block[0], t / l->block[0] % l->block[1], t / (l->block[0] * l->block[1])};
}

extern "C" inline void smelt_emu_fiber_main(Fiber* f) {
    Block* b = block;
    b->body(b->data);
    f->done = true;
    void* dead;
    smelt_emu_switch(&dead, b->scheduler_sp);
    __builtin_unreachable();
}

inline void init_fiber(Fiber* f, char* stack_top) {
    uintptr_t top = (uintptr_t)stack_top & ~(uintptr_t)15;
    void** sp = (void**)(top - 72);
    uint32_t mxcsr = 0x1f80;
    uint16_t fpcw = 0x037f;
    std::memset(sp, 0, 16);
    std::memcpy((char*)sp, &fpcw, 2);
    std::memcpy((char*)sp + 8, &mxcsr, 4);
    sp[2] = nullptr;                           // r15
    sp[3] = nullptr;                           // r14
    sp[4] = nullptr;                           // r13
    sp[5] = (void*)&smelt_emu_fiber_main;      // r12: the entry
    sp[6] = (void*)f;                          // rbx: its argument
    sp[7] = nullptr;                           // rbp
    sp[8] = (void*)&smelt_emu_fiber_start;     // return address
    f->sp = sp;
    f->done = false;
}

}  // namespace smelt_emu

// The barrier: yield to the block's scheduler until every live thread of
// the block has arrived.
inline void __syncthreads() {
    smelt_emu::Block* b = smelt_emu::block;
    if (b == nullptr) return;  // a block of one thread
    smelt_emu::Fiber* f = b->running;
    smelt_emu::smelt_emu_switch(&f->sp, b->scheduler_sp);
}

namespace smelt_emu {

// Runs blocks [l->block_begin, l->block_end) of a launch: `body(data)` once
// per thread, with threadIdx, blockIdx, blockDim and gridDim set. With
// `barriers`, each thread is a fiber and `__syncthreads` is a barrier.
inline int run(Launch* l, bool barriers, void (*body)(void*), void* data) {
    current = l;
    gridDim = dim3{l->grid[0], l->grid[1], l->grid[2]};
    blockDim = dim3{l->block[0], l->block[1], l->block[2]};
    unsigned int threads = l->block[0] * l->block[1] * l->block[2];
    Block b{};
    if (barriers && threads > 1) {
        b.count = threads;
        b.fibers = (Fiber*)std::calloc(threads, sizeof(Fiber));
        b.stacks = (char*)std::malloc(kStack * threads);
        if (b.fibers == nullptr || b.stacks == nullptr) {
            std::free(b.fibers);
            std::free(b.stacks);
            std::snprintf(l->error, l->error_cap, "out of memory for %u fiber stacks", threads);
            return 1;
        }
        b.body = body;
        b.data = data;
    }
    for (unsigned long long lin = l->block_begin; lin < l->block_end; ++lin) {
        blockIdx = uint3{(unsigned int)(lin % l->grid[0]), (unsigned int)(lin / l->grid[0] % l->grid[1]),
                         (unsigned int)(lin / ((unsigned long long)l->grid[0] * l->grid[1]))};
        if (b.count == 0) {
            for (unsigned int t = 0; t < threads; ++t) {
                threadIdx = thread_of(t, l);
                body(data);
            }
            continue;
        }
        for (unsigned int t = 0; t < threads; ++t) {
            b.fibers[t].tid = t;
            init_fiber(&b.fibers[t], b.stacks + kStack * (t + 1));
        }
        block = &b;
        unsigned int live = threads;
        while (live > 0) {
            for (unsigned int t = 0; t < threads; ++t) {
                Fiber* f = &b.fibers[t];
                if (f->done) continue;
                b.running = f;
                threadIdx = thread_of(t, l);
                smelt_emu_switch(&b.scheduler_sp, f->sp);
                if (f->done) --live;
            }
        }
        block = nullptr;
    }
    std::free(b.fibers);
    std::free(b.stacks);
    return 0;
}

}  // namespace smelt_emu
