// A caching allocator for the data of NumPy arrays made inside compiled CPU graphs (the role of
// PyTorch's caching allocators): a freed block of at least MIN_CACHED bytes is kept in a free list of
// its size (rounded up to GRAIN) and handed to the next request of that size, up to `limit` bytes kept.
// glibc's malloc, left to itself, gives the heap's free top back to the system after each step and
// faults fresh zeroed pages in at the next (a small GPT training step: ~800 page faults, a fifth of its
// time). NumPy calls these through a PyDataMem_Handler (NumPy's allocation policy, a context variable),
// which cpu_allocator.py sets around compiled calls only; arrays remember their handler, so a block is
// returned here wherever its array dies. Smaller blocks go straight to malloc/free (malloc's bins
// serve them well). Thread-safe (one mutex).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {
const size_t MIN_CACHED = size_t(1) << 16;
const size_t GRAIN = size_t(1) << 12;

std::mutex pool_lock;
std::unordered_map<size_t, std::vector<void*>>* pool = new std::unordered_map<size_t, std::vector<void*>>();
size_t kept = 0;                        // bytes in the free lists
size_t limit = size_t(1) << 30;         // most bytes kept (flm_pool_set_limit)

size_t rounded(size_t n) { return (n + GRAIN - 1) / GRAIN * GRAIN; }

void* pool_malloc(void*, size_t n) {
    if (n < MIN_CACHED) return std::malloc(n ? n : 1);
    const size_t r = rounded(n);
    {
        std::lock_guard<std::mutex> g(pool_lock);
        auto it = pool->find(r);
        if (it != pool->end() && !it->second.empty()) {
            void* p = it->second.back();
            it->second.pop_back();
            kept -= r;
            return p;
        }
    }
    return std::malloc(r);
}

void* pool_calloc(void* ctx, size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return nullptr;
    const size_t n = count * size;
    if (n < MIN_CACHED) return std::calloc(count ? count : 1, size ? size : 1);
    void* p = pool_malloc(ctx, n);
    if (p) std::memset(p, 0, n);
    return p;
}

// a block that may be kept later has room for its rounded size
void* pool_realloc(void*, void* p, size_t n) { return std::realloc(p, n < MIN_CACHED ? (n ? n : 1) : rounded(n)); }

void pool_free(void*, void* p, size_t n) {
    if (!p) return;
    if (n >= MIN_CACHED) {
        const size_t r = rounded(n);
        std::lock_guard<std::mutex> g(pool_lock);
        if (kept + r <= limit) {
            (*pool)[r].push_back(p);
            kept += r;
            return;
        }
    }
    std::free(p);
}

// NumPy's PyDataMem_Handler (numpy/ndarraytypes.h), version 1
struct Allocator {
    void* ctx;
    void* (*malloc)(void*, size_t);
    void* (*calloc)(void*, size_t, size_t);
    void* (*realloc)(void*, void*, size_t);
    void (*free)(void*, void*, size_t);
};
struct Handler {
    char name[127];
    uint8_t version;
    Allocator allocator;
};
Handler handler = {"flambeau_cpu_cache", 1, {nullptr, pool_malloc, pool_calloc, pool_realloc, pool_free}};
}  // namespace

extern "C" void* flm_pool_handler() { return &handler; }

// The name NumPy looks the handler up by in its capsule. A capsule keeps the pointer, not a copy, and
// arrays keep the capsule until they die, which may be at interpreter exit after every Python object
// holding a copy of the name is gone: the name lives here, in the library, which is never unloaded.
extern "C" const char* flm_pool_capsule_name() { return "mem_handler"; }

extern "C" int64_t flm_pool_kept() {
    std::lock_guard<std::mutex> g(pool_lock);
    return (int64_t)kept;
}

extern "C" void flm_pool_set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> g(pool_lock);
    limit = (size_t)bytes;
}

// give every kept block back to malloc
extern "C" void flm_pool_release() {
    std::lock_guard<std::mutex> g(pool_lock);
    for (auto& kv : *pool)
        for (void* p : kv.second) std::free(p);
    pool->clear();
    kept = 0;
}
