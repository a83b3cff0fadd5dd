/* flambeau AOTInductor: the C API of a compiled package (model.so), usable with no Python.
 *
 *   FlAotiRunner* r;
 *   if (fl_aoti_create("/path/to/extracted/package", &r) != FL_AOTI_OK) { puts(fl_aoti_last_error()); ... }
 *   const void* inputs[] = {x};                 // C-contiguous input buffers, in the program's input order
 *   const int64_t x_shape[] = {16, 8};
 *   const int64_t* shapes[] = {x_shape};        // each input's shape (dynamic dims take any size in range)
 *   if (fl_aoti_run(r, inputs, shapes) != FL_AOTI_OK) { puts(fl_aoti_last_error()); ... }
 *   const float* y = (const float*)fl_aoti_output_data(r, 0);   // valid until the next run or free
 *   fl_aoti_free(r);
 *
 * Link the program with the package's model.so (e.g. g++ main.cpp -I<dir> <dir>/model.so
 * -Wl,-rpath,<dir>). The package directory holds model.so, weights.bin (the constants the
 * library reads at fl_aoti_create, checked against the size and checksum compiled into it) and
 * metadata.json (for Python and for people; the library does not read it).
 *
 * The kernels run on OpenMP (libgomp): on a shared machine set GOMP_SPINCOUNT=10000 (what flambeau
 * sets for its own Python processes) or OMP_WAIT_POLICY=passive; libgomp's default spin made a small
 * GPT's calls 4x slower on a loaded 2-core machine.
 *
 * Every call returns FL_AOTI_OK or an error code; fl_aoti_last_error() then describes the last
 * error of the calling thread. A runner is not safe to run from two threads at once.
 */
#ifndef FLAMBEAU_AOTI_RUNTIME_H
#define FLAMBEAU_AOTI_RUNTIME_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_AOTI_ABI_VERSION 2

enum FlAotiStatus {
    FL_AOTI_OK = 0,
    FL_AOTI_ERR_ARGUMENT = 1,   /* a null pointer, an index out of range */
    FL_AOTI_ERR_IO = 2,         /* weights.bin missing or unreadable */
    FL_AOTI_ERR_FORMAT = 3,     /* weights.bin of another package, or a library of another ABI version */
    FL_AOTI_ERR_SHAPE = 4,      /* an input's shape differs from the program's, or a dynamic size is out of range */
    FL_AOTI_ERR_KERNEL = 5,     /* a kernel found an error (an index out of range, an integer division by zero) */
    FL_AOTI_ERR_MEMORY = 6,
    FL_AOTI_ERR_CPU = 7         /* the package was compiled for CPU features this CPU lacks (the message names them) */
};

enum FlAotiDtype {
    FL_AOTI_FLOAT32 = 0, FL_AOTI_FLOAT64 = 1, FL_AOTI_INT64 = 2, FL_AOTI_INT32 = 3, FL_AOTI_INT16 = 4,
    FL_AOTI_INT8 = 5, FL_AOTI_UINT8 = 6, FL_AOTI_BOOL = 7,
    FL_AOTI_BFLOAT16 = 8, FL_AOTI_FLOAT16 = 9   /* their 16-bit patterns (bfloat16: a float's upper half) */
};

typedef struct FlAotiRunner FlAotiRunner;

int fl_aoti_create(const char* package_dir, FlAotiRunner** runner);
void fl_aoti_free(FlAotiRunner* runner);
const char* fl_aoti_last_error(void);

int fl_aoti_num_inputs(const FlAotiRunner* runner);
int fl_aoti_num_outputs(const FlAotiRunner* runner);
/* An input's rank, dtype (FlAotiDtype) and shape as exported: -1 for a dynamic dim; its range via
 * fl_aoti_input_dim_range. */
int fl_aoti_input_ndim(const FlAotiRunner* runner, int i);
int fl_aoti_input_dtype(const FlAotiRunner* runner, int i);
int fl_aoti_input_shape(const FlAotiRunner* runner, int i, int64_t* shape);
int fl_aoti_input_dim_range(const FlAotiRunner* runner, int i, int dim, int64_t* lower, int64_t* upper);

int fl_aoti_run(FlAotiRunner* runner, const void* const* inputs, const int64_t* const* input_shapes);

/* The outputs of the last run: C-contiguous, owned by the runner. */
int fl_aoti_output_ndim(const FlAotiRunner* runner, int i);
int fl_aoti_output_dtype(const FlAotiRunner* runner, int i);
const int64_t* fl_aoti_output_shape(const FlAotiRunner* runner, int i);
const void* fl_aoti_output_data(const FlAotiRunner* runner, int i);

/* The package's constants (its parameters, buffers and folded constants), each C-contiguous and
 * owned by the runner unless set with user_managed. fl_aoti_constant_fqn names the module attribute a
 * constant holds ("bn.running_mean"; "" for a constant folded at compile time); a constant that is
 * mutable is a buffer the program updates (BatchNorm's running statistics in training mode, a counter):
 * every successful run writes its new value there, so the state carries over from run to run.
 * fl_aoti_set_constant replaces a constant's value: copied into the runner's memory, or with
 * user_managed the runner reads (and updates) the caller's buffer from then on, which must outlive
 * the runner's use of it; products that read a constant from packed panels are repacked. */
int fl_aoti_num_constants(const FlAotiRunner* runner);
const char* fl_aoti_constant_fqn(const FlAotiRunner* runner, int i);
int fl_aoti_constant_dtype(const FlAotiRunner* runner, int i);
int fl_aoti_constant_ndim(const FlAotiRunner* runner, int i);
const int64_t* fl_aoti_constant_shape(const FlAotiRunner* runner, int i);
int fl_aoti_constant_mutable(const FlAotiRunner* runner, int i);
void* fl_aoti_constant_data(FlAotiRunner* runner, int i);
int fl_aoti_set_constant(FlAotiRunner* runner, int i, void* data, int user_managed);

/* ---- between the runtime and the generated model code (not for users) ---- */
typedef struct {
    const char* fqn;               /* "" for a folded constant */
    int dtype;
    int ndim;
    const int64_t* shape;
    int is_mutable;                /* runs write it */
} FlAotiConstantSpec;

typedef struct {
    const char* name;
    int dtype;
    int ndim;
    const int64_t* shape;          /* -1: dynamic */
    const int64_t* lower;          /* per dim: the range of a dynamic dim (static dims: the size) */
    const int64_t* upper;
} FlAotiTensorSpec;

typedef struct {
    int abi_version;
    int n_inputs;
    const FlAotiTensorSpec* inputs;
    int n_outputs;
    const FlAotiTensorSpec* outputs;
    int n_constants;
    const int64_t* constant_offsets;   /* byte offsets into weights.bin */
    int64_t weights_nbytes;
    uint64_t weights_checksum;
    int n_sizes;                        /* size symbols the kernels take */
    /* sizes[] from the input shapes; FL_AOTI_ERR_SHAPE with a message in err otherwise */
    int (*bind_sizes)(const int64_t* const* shapes, int64_t* sizes, char* err, int err_len);
    void (*output_shape)(int i, const int64_t* sizes, int64_t* shape);
    int (*run)(void* const* inputs, void* const* outputs, const int64_t* sizes, void* const* constants);
    const FlAotiConstantSpec* constants;   /* n_constants of them */
} FlAotiModelInfo;

const FlAotiModelInfo* fl_aoti_model_info(void);
uint64_t fl_aoti_checksum(const void* data, int64_t nbytes);

#ifdef __cplusplus
}
#endif

#endif
