// flambeau AOTInductor runtime: the C API of aoti_runtime.h over the generated model code.
//
// Linked into every package's model.so next to the generated kernels and wrapper (model.cpp, which
// defines fl_aoti_model_info) and flambeau's GEMM/convolution (cpu_kernels.cpp) and
// fused attention (cpu_attention.cpp). A runner reads
// weights.bin once (size and checksum checked against the library's), keeps a pointer per constant,
// packs the constant operands of matrix products once (fl_graph_prepack of the C++ wrapper), and per
// run: binds the size symbols from the input shapes (model code: checks each dim, and each dynamic
// size against its range), allocates the outputs, calls the generated wrapper (which then writes the
// buffers the program updates into their constants). Constants can be read and replaced by index
// (fl_aoti_constant_*, fl_aoti_set_constant: copied, or the caller's memory used from then on).
#include "aoti_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" void fl_link_externs(int threads);
extern "C" const char* fl_aoti_cpu_features(void);
extern "C" const char* fl_aoti_march(void);
extern "C" int fl_graph_num_packed(void);
extern "C" int64_t fl_graph_packed_floats(int k);
extern "C" void fl_graph_prepack(void* const* consts);
extern "C" int flm_gemm_threads();

static thread_local std::string fl_last_error;
static const int64_t FL_ALIGN = 64;
static const int FL_MAX_DIMS = 16;

static int fl_fail(int code, const std::string& msg) {
    fl_last_error = msg;
    return code;
}

static int64_t fl_itemsize(int dtype) {
    switch (dtype) {
        case FL_AOTI_FLOAT64: case FL_AOTI_INT64: return 8;
        case FL_AOTI_FLOAT32: case FL_AOTI_INT32: return 4;
        case FL_AOTI_INT16: case FL_AOTI_BFLOAT16: case FL_AOTI_FLOAT16: return 2;
        default: return 1;
    }
}

struct FlAotiRunner {
    const FlAotiModelInfo* info = nullptr;
    void* weights = nullptr;
    std::vector<void*> constants;       // each constant in weights, then the packed GEMM operands
    std::vector<void*> packed;
    std::vector<int64_t> sizes;
    std::vector<void*> outputs;
    std::vector<std::vector<int64_t>> output_shapes;

    void release_outputs() {
        for (void* p : outputs) std::free(p);
        outputs.assign(outputs.size(), nullptr);
    }
    ~FlAotiRunner() {
        release_outputs();
        for (void* p : packed) std::free(p);
        std::free(weights);
    }
};

extern "C" const char* fl_aoti_last_error(void) { return fl_last_error.c_str(); }

static const FlAotiConstantSpec* fl_constant_spec(const FlAotiRunner* r, int i) {
    if (!r) return nullptr;
    if (i < 0 || i >= r->info->n_constants) {
        fl_fail(FL_AOTI_ERR_ARGUMENT, "constant index " + std::to_string(i) + " out of range (the package has " +
                std::to_string(r->info->n_constants) + ")");
        return nullptr;
    }
    return &r->info->constants[i];
}

extern "C" int fl_aoti_num_constants(const FlAotiRunner* r) { return r ? r->info->n_constants : -1; }

extern "C" const char* fl_aoti_constant_fqn(const FlAotiRunner* r, int i) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    return s ? s->fqn : nullptr;
}

extern "C" int fl_aoti_constant_dtype(const FlAotiRunner* r, int i) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    return s ? s->dtype : -1;
}

extern "C" int fl_aoti_constant_ndim(const FlAotiRunner* r, int i) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    return s ? s->ndim : -1;
}

extern "C" const int64_t* fl_aoti_constant_shape(const FlAotiRunner* r, int i) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    return s ? s->shape : nullptr;
}

extern "C" int fl_aoti_constant_mutable(const FlAotiRunner* r, int i) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    return s ? s->is_mutable : -1;
}

extern "C" void* fl_aoti_constant_data(FlAotiRunner* r, int i) {
    return fl_constant_spec(r, i) ? r->constants[i] : nullptr;
}

extern "C" int fl_aoti_set_constant(FlAotiRunner* r, int i, void* data, int user_managed) {
    const FlAotiConstantSpec* s = fl_constant_spec(r, i);
    if (!s) return FL_AOTI_ERR_ARGUMENT;
    if (!data) return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_set_constant: null data");
    void* own = (char*)r->weights + r->info->constant_offsets[i];
    if (user_managed) {
        r->constants[i] = data;
    } else {
        int64_t n = fl_itemsize(s->dtype);
        for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
        r->constants[i] = own;
        std::memmove(own, data, (size_t)n);
    }
    fl_graph_prepack(r->constants.data());
    return FL_AOTI_OK;
}

extern "C" uint64_t fl_aoti_checksum(const void* data, int64_t nbytes) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t sum = 0;
    int64_t words = nbytes / 8;
    for (int64_t i = 0; i < words; i++) {
        uint64_t w;
        std::memcpy(&w, p + 8 * i, 8);
        sum += w * (uint64_t)(2 * i + 1);
    }
    if (nbytes % 8) {
        uint64_t w = 0;
        std::memcpy(&w, p + 8 * words, nbytes % 8);
        sum += w * (uint64_t)(2 * words + 1);
    }
    return sum;
}

static int fl_read_weights(FlAotiRunner* r, const char* dir) {
    const FlAotiModelInfo* info = r->info;
    std::string path = std::string(dir) + "/weights.bin";
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return fl_fail(FL_AOTI_ERR_IO, "fl_aoti_create: cannot open " + path);
    std::fseek(f, 0, SEEK_END);
    long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    if (size != info->weights_nbytes) {
        std::fclose(f);
        return fl_fail(FL_AOTI_ERR_FORMAT, "fl_aoti_create: " + path + " has " + std::to_string(size) +
                       " bytes, the library expects " + std::to_string(info->weights_nbytes) +
                       " (weights of another package?)");
    }
    r->weights = std::aligned_alloc(FL_ALIGN, (size_t)((size + FL_ALIGN - 1) / FL_ALIGN * FL_ALIGN + FL_ALIGN));
    if (!r->weights) {
        std::fclose(f);
        return fl_fail(FL_AOTI_ERR_MEMORY, "fl_aoti_create: out of memory for the weights");
    }
    size_t got = size ? std::fread(r->weights, 1, (size_t)size, f) : 0;
    std::fclose(f);
    if ((long)got != size) return fl_fail(FL_AOTI_ERR_IO, "fl_aoti_create: short read of " + path);
    if (fl_aoti_checksum(r->weights, size) != info->weights_checksum)
        return fl_fail(FL_AOTI_ERR_FORMAT, "fl_aoti_create: the checksum of " + path +
                       " differs from the library's (weights of another package, or altered)");
    for (int i = 0; i < info->n_constants; i++)
        r->constants.push_back((char*)r->weights + info->constant_offsets[i]);
    return FL_AOTI_OK;
}

// Whether this CPU has `f` (a name of aoti.CPU_FEATURES); a name this runtime does not know counts as absent.
static bool fl_cpu_has(const std::string& f) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (f == "sse4.2") return __builtin_cpu_supports("sse4.2");
    if (f == "avx") return __builtin_cpu_supports("avx");
    if (f == "avx2") return __builtin_cpu_supports("avx2");
    if (f == "fma") return __builtin_cpu_supports("fma");
    if (f == "f16c") return __builtin_cpu_supports("f16c");
    if (f == "bmi") return __builtin_cpu_supports("bmi");
    if (f == "bmi2") return __builtin_cpu_supports("bmi2");
    if (f == "avx512f") return __builtin_cpu_supports("avx512f");
    if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
    if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
    if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
    if (f == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
    if (f == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
    if (f == "avx512fp16") return __builtin_cpu_supports("avx512fp16");
    if (f == "amx-tile") return __builtin_cpu_supports("amx-tile");
    if (f == "amx-bf16") return __builtin_cpu_supports("amx-bf16");
    if (f == "amx-int8") return __builtin_cpu_supports("amx-int8");
#endif
    return false;
}

// Refuse a package whose code uses CPU features this CPU lacks, before any of that code runs (this
// file is built for a baseline CPU).
static int fl_check_cpu(void) {
    std::string missing, f;
    const std::string features = std::string(fl_aoti_cpu_features()) + " ";
    for (char ch : features) {
        if (ch != ' ') { f += ch; continue; }
        if (!f.empty() && !fl_cpu_has(f)) missing += (missing.empty() ? "" : ", ") + f;
        f.clear();
    }
    if (missing.empty()) return FL_AOTI_OK;
    return fl_fail(FL_AOTI_ERR_CPU, "fl_aoti_create: the package was compiled for CPU features this CPU lacks: " +
                   missing + " (built with -march=" + fl_aoti_march() + "); compile it on this machine, or for a "
                   "CPU this one covers with inductor_configs={'aoti_march': 'x86-64-v3'} (or another -march name)");
}

extern "C" int fl_aoti_create(const char* package_dir, FlAotiRunner** runner) {
    if (!package_dir || !runner) return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_create: null argument");
    *runner = nullptr;
    if (fl_check_cpu() != FL_AOTI_OK) return FL_AOTI_ERR_CPU;
    const FlAotiModelInfo* info = fl_aoti_model_info();
    if (info->abi_version != FL_AOTI_ABI_VERSION)
        return fl_fail(FL_AOTI_ERR_FORMAT, "fl_aoti_create: the model library has ABI version " +
                       std::to_string(info->abi_version) + ", this runtime " + std::to_string(FL_AOTI_ABI_VERSION));
    FlAotiRunner* r = new FlAotiRunner();
    r->info = info;
    int rc = fl_read_weights(r, package_dir);
    if (rc != FL_AOTI_OK) {
        delete r;
        return rc;
    }
    r->sizes.assign(info->n_sizes + 1, 0);
    r->outputs.assign(info->n_outputs, nullptr);
    r->output_shapes.assign(info->n_outputs, std::vector<int64_t>());
    fl_link_externs(flm_gemm_threads());    // the wrapper's GEMM, convolution and attention: this library's
    for (int k = 0; k < fl_graph_num_packed(); k++) {   // constant GEMM operands packed once, here
        int64_t bytes = fl_graph_packed_floats(k) * (int64_t)sizeof(float);
        void* p = std::aligned_alloc(FL_ALIGN, (size_t)((bytes + FL_ALIGN - 1) / FL_ALIGN * FL_ALIGN + FL_ALIGN));
        if (!p) {
            delete r;
            return fl_fail(FL_AOTI_ERR_MEMORY, "fl_aoti_create: out of memory for the packed weights");
        }
        r->packed.push_back(p);
        r->constants.push_back(p);
    }
    fl_graph_prepack(r->constants.data());
    *runner = r;
    return FL_AOTI_OK;
}

extern "C" void fl_aoti_free(FlAotiRunner* runner) { delete runner; }

extern "C" int fl_aoti_num_inputs(const FlAotiRunner* r) { return r ? r->info->n_inputs : -1; }
extern "C" int fl_aoti_num_outputs(const FlAotiRunner* r) { return r ? r->info->n_outputs : -1; }

static const FlAotiTensorSpec* fl_spec(const FlAotiRunner* r, int i, bool output) {
    if (!r) return nullptr;
    int n = output ? r->info->n_outputs : r->info->n_inputs;
    if (i < 0 || i >= n) {
        fl_fail(FL_AOTI_ERR_ARGUMENT, std::string(output ? "output" : "input") + " index " + std::to_string(i) +
                " out of range (the program has " + std::to_string(n) + ")");
        return nullptr;
    }
    return output ? &r->info->outputs[i] : &r->info->inputs[i];
}

extern "C" int fl_aoti_input_ndim(const FlAotiRunner* r, int i) {
    const FlAotiTensorSpec* s = fl_spec(r, i, false);
    return s ? s->ndim : -1;
}

extern "C" int fl_aoti_input_dtype(const FlAotiRunner* r, int i) {
    const FlAotiTensorSpec* s = fl_spec(r, i, false);
    return s ? s->dtype : -1;
}

extern "C" int fl_aoti_input_shape(const FlAotiRunner* r, int i, int64_t* shape) {
    const FlAotiTensorSpec* s = fl_spec(r, i, false);
    if (!s || !shape) return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_input_shape: bad argument");
    std::memcpy(shape, s->shape, sizeof(int64_t) * s->ndim);
    return FL_AOTI_OK;
}

extern "C" int fl_aoti_input_dim_range(const FlAotiRunner* r, int i, int dim, int64_t* lower, int64_t* upper) {
    const FlAotiTensorSpec* s = fl_spec(r, i, false);
    if (!s || dim < 0 || dim >= s->ndim || !lower || !upper)
        return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_input_dim_range: bad argument");
    *lower = s->lower[dim];
    *upper = s->upper[dim];
    return FL_AOTI_OK;
}

extern "C" int fl_aoti_run(FlAotiRunner* r, const void* const* inputs, const int64_t* const* input_shapes) {
    if (!r || (r->info->n_inputs && (!inputs || !input_shapes)))
        return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_run: null argument");
    const FlAotiModelInfo* info = r->info;
    for (int i = 0; i < info->n_inputs; i++)
        if (!inputs[i] || !input_shapes[i])
            return fl_fail(FL_AOTI_ERR_ARGUMENT, "fl_aoti_run: input " + std::to_string(i) + " is null");
    char err[512] = {0};
    if (info->bind_sizes(input_shapes, r->sizes.data(), err, sizeof(err)) != FL_AOTI_OK)
        return fl_fail(FL_AOTI_ERR_SHAPE, std::string("fl_aoti_run: ") + err);
    r->release_outputs();
    int64_t shape[FL_MAX_DIMS];
    for (int i = 0; i < info->n_outputs; i++) {
        const FlAotiTensorSpec& s = info->outputs[i];
        info->output_shape(i, r->sizes.data(), shape);
        r->output_shapes[i].assign(shape, shape + s.ndim);
        int64_t n = fl_itemsize(s.dtype);
        for (int d = 0; d < s.ndim; d++) n *= shape[d];
        r->outputs[i] = std::aligned_alloc(FL_ALIGN, (size_t)((n + FL_ALIGN - 1) / FL_ALIGN * FL_ALIGN + FL_ALIGN));
        if (!r->outputs[i]) return fl_fail(FL_AOTI_ERR_MEMORY, "fl_aoti_run: out of memory for the outputs");
    }
    int code = info->run((void* const*)inputs, r->outputs.data(), r->sizes.data(), r->constants.data());
    if (code == 1) return fl_fail(FL_AOTI_ERR_KERNEL, "fl_aoti_run: index out of range in self (an index read "
                                  "by a compiled kernel is out of bounds)");
    if (code == 2) return fl_fail(FL_AOTI_ERR_KERNEL, "fl_aoti_run: integer division by zero in a compiled kernel");
    if (code) return fl_fail(FL_AOTI_ERR_KERNEL, "fl_aoti_run: compiled kernel reported error code " +
                             std::to_string(code));
    return FL_AOTI_OK;
}

extern "C" int fl_aoti_output_ndim(const FlAotiRunner* r, int i) {
    const FlAotiTensorSpec* s = fl_spec(r, i, true);
    return s ? s->ndim : -1;
}

extern "C" int fl_aoti_output_dtype(const FlAotiRunner* r, int i) {
    const FlAotiTensorSpec* s = fl_spec(r, i, true);
    return s ? s->dtype : -1;
}

extern "C" const int64_t* fl_aoti_output_shape(const FlAotiRunner* r, int i) {
    return fl_spec(r, i, true) ? r->output_shapes[i].data() : nullptr;
}

extern "C" const void* fl_aoti_output_data(const FlAotiRunner* r, int i) {
    return fl_spec(r, i, true) ? r->outputs[i] : nullptr;
}
