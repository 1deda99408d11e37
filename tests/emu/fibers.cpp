// The emulated card's launcher (tests/emu/README.md): runs a kernel's blocks one after the other, each block's
// threads as fibers of the calling host thread, switching only where CUDA threads can wait for each
// other: __syncthreads (every live thread of the block) and the warp exchanges (every live lane of the warp).
// A fiber that returns counts as exited for both, as on Volta. A wait nobody can complete is reported as a
// deadlock of that kernel, and __trap() as a failure; a wild pointer still crashes the process, as it would
// corrupt or kill a real context.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_cpu.h"

#if !defined(__x86_64__)
#error "the emulated card's fiber switch is written for x86-64"
#endif

// Saves the callee-saved registers and the fp control words on the current stack, stores its pointer in *save,
// and resumes the stack at `load` (one saved the same way, or a new fiber's from start_stack). glibc's
// swapcontext does the same plus two signal-mask system calls a switch: tests/gpu/test_norm_rope.py took 34.8 s
// with it and 7.6 s with this.
extern "C" void emu_switch(void** save, void* load);
asm(R"(
.text
.p2align 4
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

// The bounds of this library's __shared__ variables (cuda_cpu.h), set by the linker; absent when it has none.
extern "C" char __start_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((weak, visibility("hidden")));

namespace emu {
dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {
enum class State : unsigned char { ready, at_warp, at_block, done };

constexpr size_t STACK_BYTES = 256 * 1024;  // room for kernels' local arrays; pages never touched cost nothing
constexpr size_t GUARD_BYTES = 4096;
constexpr size_t SLOT_BYTES = 16;
// RIGLLM_EMU_POISON=1 fills the top of every fiber's stack with 0xFF bytes before each block, so a local read
// before it is written is NaN (floats) or -1 (ints) instead of whatever the previous kernel left there.
constexpr size_t POISONED_STACK_BYTES = 32 * 1024;
bool poison_stacks = false;

struct Fiber {
    void* sp;  // where emu_switch left the fiber's registers
    State state;
    char* stack;
};

std::vector<Fiber> fibers;
void* home = nullptr;  // the scheduler's stack while a fiber runs
unsigned current = 0;
void (*kernel_entry)(void**) = nullptr;
void** entry_args = nullptr;
std::vector<unsigned char> slots;
std::vector<unsigned char> shared_bytes;
std::string failure;
bool failed = false;
unsigned block_threads = 0;

void grow(unsigned threads) {
    while (fibers.size() < threads) {
        void* mem = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) throw std::bad_alloc();
        mprotect(mem, GUARD_BYTES, PROT_NONE);  // an overflowing fiber faults instead of writing into its neighbour
        fibers.push_back(Fiber{nullptr, State::done, static_cast<char*>(mem)});
    }
    slots.assign((size_t)threads * SLOT_BYTES + 32 * SLOT_BYTES, 0);
}

[[noreturn]] void fiber_main() {
    kernel_entry(entry_args);
    fibers[current].state = State::done;
    void* unused;
    emu_switch(&unused, home);  // never resumed: the next block starts a fresh stack
    __builtin_unreachable();
}

// A new fiber's stack, laid out as emu_switch leaves one: fp control words, six registers, then fiber_main
// as the return address, aligned so fiber_main starts as if called.
void* start_stack(char* top) {
    auto* sp = reinterpret_cast<unsigned long long*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15)) - 1;
    *--sp = reinterpret_cast<unsigned long long>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--sp = 0;
    unsigned control[2];
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
    *--sp = control[0] | (unsigned long long)(control[1] & 0xffffu) << 32;
    return sp;
}

void enter(unsigned i) {
    current = i;
    const unsigned bx = blockDim.x, by = blockDim.y;
    threadIdx = dim3{i % bx, (i / bx) % by, i / (bx * by)};
    emu_switch(&home, fibers[i].sp);
}

void wait(State s) {
    Fiber& f = fibers[current];
    f.state = s;
    emu_switch(&f.sp, home);
}

// Releases the waits that can complete; false when none can (all exited, or a deadlock).
bool release(unsigned threads) {
    bool any = false;
    for (unsigned w = 0; w * 32 < threads; ++w) {
        unsigned live = 0, waiting = 0;
        for (unsigned i = w * 32; i < std::min(threads, w * 32 + 32); ++i) {
            live += fibers[i].state != State::done;
            waiting += fibers[i].state == State::at_warp;
        }
        if (waiting > 0 && waiting == live) {
            for (unsigned i = w * 32; i < std::min(threads, w * 32 + 32); ++i)
                if (fibers[i].state == State::at_warp) fibers[i].state = State::ready;
            any = true;
        }
    }
    if (any) return true;
    unsigned live = 0, waiting = 0;
    for (unsigned i = 0; i < threads; ++i) {
        live += fibers[i].state != State::done;
        waiting += fibers[i].state == State::at_block;
    }
    if (waiting > 0 && waiting == live) {
        for (unsigned i = 0; i < threads; ++i)
            if (fibers[i].state == State::at_block) fibers[i].state = State::ready;
        return true;
    }
    if (live > 0) {
        failure = "deadlock: threads wait at a warp exchange and at __syncthreads at once, or a warp's lanes at different ones";
        failed = true;
    }
    return false;
}

bool run_block(unsigned threads) {
    if (__start_emu_shared != nullptr) std::memset(__start_emu_shared, 0xff, __stop_emu_shared - __start_emu_shared);
    std::fill(shared_bytes.begin(), shared_bytes.end(), 0xff);
    for (unsigned i = 0; i < threads; ++i) {
        if (poison_stacks) std::memset(fibers[i].stack + GUARD_BYTES + STACK_BYTES - POISONED_STACK_BYTES, 0xff, POISONED_STACK_BYTES);
        fibers[i].sp = start_stack(fibers[i].stack + GUARD_BYTES + STACK_BYTES);
        fibers[i].state = State::ready;
    }
    do {
        for (unsigned i = 0; i < threads && !failed; ++i)
            if (fibers[i].state == State::ready) enter(i);
        if (failed) return false;
    } while (release(threads));
    return !failed;
}
}  // namespace

void warp_barrier() { wait(State::at_warp); }
void block_barrier() { wait(State::at_block); }
unsigned lane_id() { return current % 32; }
unsigned char* warp_slot(unsigned lane) { return &slots[((size_t)(current / 32) * 32 + lane) * SLOT_BYTES]; }
void* dynamic_shared() { return shared_bytes.data(); }

void trap(const char* why) {
    failure = why;
    failed = true;
    fibers[current].state = State::done;
    void* unused;
    emu_switch(&unused, home);  // never resumed: the launch ends here
    __builtin_unreachable();
}
}  // namespace emu

// Lanes that have exited vote 0, as on a card.
unsigned emu_ballot(int pred) {
    using namespace emu;
    const int own = pred != 0;
    std::memcpy(warp_slot(lane_id()), &own, sizeof own);
    warp_barrier();
    const unsigned first = current / 32 * 32;
    unsigned bits = 0;
    for (unsigned lane = 0; lane < 32 && first + lane < block_threads; ++lane) {
        int p;
        std::memcpy(&p, warp_slot(lane), sizeof p);
        if (fibers[first + lane].state != State::done) bits |= (unsigned)(p != 0) << lane;
    }
    warp_barrier();
    return bits;
}

extern "C" __attribute__((visibility("default"))) const char* emu_failure() { return emu::failure.c_str(); }

// Runs kernel `kernel` over grid × block with `shared` bytes of dynamic shared memory; 0, or -1 with
// emu_failure() saying why.
extern "C" __attribute__((visibility("default"))) int emu_run(void (*kernel)(void**), void** args, unsigned gx, unsigned gy,
                                                              unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                              unsigned long long shared) {
    using namespace emu;
    const unsigned threads = bx * by * bz;
    if (threads == 0 || threads > 1024) {
        failure = "a block of " + std::to_string(threads) + " threads";
        return -1;
    }
    failed = false;
    failure.clear();
    poison_stacks = std::getenv("RIGLLM_EMU_POISON") != nullptr;
    grow(threads);
    block_threads = threads;
    shared_bytes.resize(shared + 16);
    kernel_entry = kernel;
    entry_args = args;
    blockDim = dim3{bx, by, bz};
    gridDim = dim3{gx, gy, gz};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = dim3{x, y, z};
                if (!run_block(threads)) {
                    char where[96];
                    std::snprintf(where, sizeof where, " (block %u,%u,%u)", x, y, z);
                    failure += where;
                    return -1;
                }
            }
    return 0;
}
