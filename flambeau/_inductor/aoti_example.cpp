// A C++ program running an AOTInductor package through the C API (aoti_runtime.h), with no Python.
//
//   g++ -O2 aoti_example.cpp -I<package dir> <package dir>/model.so -Wl,-rpath,<package dir> -o run
//   ./run <package dir> <in dir> <out dir> [repeat]
//
// Reads input i from <in dir>/input<i>.bin, writes output i to <out dir>/output<i>.bin, each file an
// int64 dtype code (FlAotiDtype), an int64 rank, the int64 sizes, then the C-contiguous data. With
// `repeat` it runs the program that many more times and prints "per_call_us <microseconds>" (the mean
// over the runs; tests/test_aoti.py and bench/export_aoti.py use it). The outputs written are the last
// run's; each buffer the program updates is written to <out dir>/state.<fqn>.bin after the runs.
#include "aoti_runtime.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static int64_t item_size(int64_t dtype) {
    switch (dtype) {
        case FL_AOTI_FLOAT64: case FL_AOTI_INT64: return 8;
        case FL_AOTI_FLOAT32: case FL_AOTI_INT32: return 4;
        case FL_AOTI_INT16: case FL_AOTI_BFLOAT16: case FL_AOTI_FLOAT16: return 2;
        default: return 1;
    }
}

struct Blob {
    int64_t dtype = 0;
    std::vector<int64_t> shape;
    std::vector<char> data;
};

static bool read_blob(const std::string& path, Blob& b) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    int64_t ndim = 0;
    bool ok = std::fread(&b.dtype, 8, 1, f) == 1 && std::fread(&ndim, 8, 1, f) == 1 && ndim >= 0 && ndim < 16;
    if (ok) {
        b.shape.resize(ndim);
        ok = ndim == 0 || std::fread(b.shape.data(), 8, ndim, f) == (size_t)ndim;
    }
    if (ok) {
        int64_t n = item_size(b.dtype);
        for (int64_t s : b.shape) n *= s;
        b.data.resize(n);
        ok = n == 0 || std::fread(b.data.data(), 1, n, f) == (size_t)n;
    }
    std::fclose(f);
    return ok;
}

static bool write_blob(const std::string& path, int64_t dtype, int64_t ndim, const int64_t* shape, const void* data) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    int64_t n = item_size(dtype);
    for (int64_t d = 0; d < ndim; d++) n *= shape[d];
    bool ok = std::fwrite(&dtype, 8, 1, f) == 1 && std::fwrite(&ndim, 8, 1, f) == 1 &&
              (ndim == 0 || std::fwrite(shape, 8, ndim, f) == (size_t)ndim) &&
              (n == 0 || std::fwrite(data, 1, n, f) == (size_t)n);
    std::fclose(f);
    return ok;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s <package dir> <in dir> <out dir> [repeat]\n", argv[0]);
        return 2;
    }
    FlAotiRunner* runner = nullptr;
    if (fl_aoti_create(argv[1], &runner) != FL_AOTI_OK) {
        std::fprintf(stderr, "error: %s\n", fl_aoti_last_error());
        return 1;
    }
    int n_in = fl_aoti_num_inputs(runner);
    std::vector<Blob> blobs(n_in);
    std::vector<const void*> inputs(n_in);
    std::vector<const int64_t*> shapes(n_in);
    for (int i = 0; i < n_in; i++) {
        std::string path = std::string(argv[2]) + "/input" + std::to_string(i) + ".bin";
        if (!read_blob(path, blobs[i]) || blobs[i].dtype != fl_aoti_input_dtype(runner, i)) {
            std::fprintf(stderr, "error: cannot read %s (or its dtype is not the program's)\n", path.c_str());
            return 1;
        }
        inputs[i] = blobs[i].data.data();
        shapes[i] = blobs[i].shape.data();
    }
    if (fl_aoti_run(runner, inputs.data(), shapes.data()) != FL_AOTI_OK) {
        std::fprintf(stderr, "error: %s\n", fl_aoti_last_error());
        return 1;
    }
    int repeat = argc > 4 ? std::atoi(argv[4]) : 0;
    if (repeat > 0) {
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < repeat; r++) fl_aoti_run(runner, inputs.data(), shapes.data());
        auto t1 = std::chrono::steady_clock::now();
        std::printf("per_call_us %.3f\n", std::chrono::duration<double, std::micro>(t1 - t0).count() / repeat);
    }
    for (int i = 0; i < fl_aoti_num_outputs(runner); i++) {
        std::string path = std::string(argv[3]) + "/output" + std::to_string(i) + ".bin";
        if (!write_blob(path, fl_aoti_output_dtype(runner, i), fl_aoti_output_ndim(runner, i),
                        fl_aoti_output_shape(runner, i), fl_aoti_output_data(runner, i))) {
            std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
            return 1;
        }
    }
    for (int j = 0; j < fl_aoti_num_constants(runner); j++) {     // the buffers the runs updated
        if (!fl_aoti_constant_mutable(runner, j)) continue;
        std::string path = std::string(argv[3]) + "/state." + fl_aoti_constant_fqn(runner, j) + ".bin";
        if (!write_blob(path, fl_aoti_constant_dtype(runner, j), fl_aoti_constant_ndim(runner, j),
                        fl_aoti_constant_shape(runner, j), fl_aoti_constant_data(runner, j))) {
            std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
            return 1;
        }
    }
    fl_aoti_free(runner);
    return 0;
}
