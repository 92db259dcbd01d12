// The C interface of the RLX shim over MLX's distributed module
// (mlx::core::distributed). Rust binds exactly these functions in src/ffi.rs.
//
// Conventions:
// - Every function that can fail returns an RLXMLX_* status code and writes a
//   NUL-terminated message into `err` (capacity `err_len`). No C++ exception
//   ever leaves a function of this file.
// - Buffers are host memory owned by the caller; they are copied into and out
//   of MLX arrays, so the caller may reuse them as soon as a call returns.
//   Collectives take array handles (rlxmlx_array) filled and read by the caller.
// - Counts are element counts; an element's size follows from the dtype code.
// - The functions may be called from any thread. Each calling thread gets its
//   own MLX CPU stream, created on first use, because MLX streams are bound to
//   the thread that made them.

#ifndef RLX_MLX_SHIM_H
#define RLX_MLX_SHIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Status codes.
#define RLXMLX_OK 0
// MLX threw (a lost connection, an unsupported operation, a bad hostfile...).
#define RLXMLX_ERR_MLX 1
// An argument was refused before MLX was called (unknown dtype, size...).
#define RLXMLX_ERR_ARG 2
// Something that is not a std::exception was thrown.
#define RLXMLX_ERR_UNKNOWN 3

// Element types: every dtype MLX has.
#define RLXMLX_BOOL 0
#define RLXMLX_U8 1
#define RLXMLX_U16 2
#define RLXMLX_U32 3
#define RLXMLX_U64 4
#define RLXMLX_I8 5
#define RLXMLX_I16 6
#define RLXMLX_I32 7
#define RLXMLX_I64 8
#define RLXMLX_F16 9
#define RLXMLX_BF16 10
#define RLXMLX_F32 11
#define RLXMLX_F64 12
#define RLXMLX_C64 13

// Reductions of rlxmlx_all_reduce.
#define RLXMLX_SUM 0
#define RLXMLX_MAX 1
#define RLXMLX_MIN 2

// An opaque MLX distributed group.
typedef struct rlxmlx_group rlxmlx_group;

// Whether MLX was built with `backend` ("any", "ring", "mpi", "jaccl", "nccl").
int rlxmlx_is_available(const char* backend);

// mlx::core::distributed::init(strict, backend). On success `*out` holds a
// group to release with rlxmlx_group_free.
int rlxmlx_init(int strict, const char* backend, rlxmlx_group** out,
                char* err, size_t err_len);

// Releases a group made by rlxmlx_init or rlxmlx_split.
void rlxmlx_group_free(rlxmlx_group* group);

// mlx::core::distributed::clear_backends(): drops MLX's cached groups, so that a
// group nobody else holds is destroyed (for MPI, that calls MPI_Finalize).
void rlxmlx_clear_backends(void);

// This process's rank in `group`.
int rlxmlx_group_rank(const rlxmlx_group* group);

// Number of ranks in `group`.
int rlxmlx_group_size(const rlxmlx_group* group);

// Group::split(color, key); a negative key keeps the current rank order.
int rlxmlx_split(const rlxmlx_group* group, int color, int key,
                 rlxmlx_group** out, char* err, size_t err_len);

// Sends the bytes of `nparts` parts (part i: `lens[i]` bytes at `parts[i]`),
// one after the other, to rank `dst` as one MLX message and waits until MLX
// has handed them to its connection. The parts are gathered straight into the
// MLX array that is sent, so a frame and its header cost one copy.
int rlxmlx_send(const rlxmlx_group* group, int dst, const void* const* parts,
                const size_t* lens, size_t nparts, char* err, size_t err_len);

// Receives exactly `count` elements from rank `src` into `data`.
int rlxmlx_recv(const rlxmlx_group* group, int src, int dtype, void* data,
                size_t count, char* err, size_t err_len);

// An MLX array in host memory, owned by the caller of rlxmlx_array_new.
// Collectives work on these handles so that the thread that runs a collective
// never touches the caller's buffers: a caller that gives up on a stuck
// collective can return while the handle stays valid for MLX.
typedef struct rlxmlx_array rlxmlx_array;

// Sends the whole of `array` to rank `dst` as one MLX message, without copying
// it, and waits until MLX has handed it to its connection. On failure MLX may
// still read the array, so the caller must not free it.
int rlxmlx_send_array(const rlxmlx_group* group, int dst,
                      const rlxmlx_array* array, char* err, size_t err_len);

// A new array of `count` elements: a copy of `data`, or uninitialized when
// `data` is NULL. Release it with rlxmlx_array_free.
int rlxmlx_array_new(int dtype, const void* data, size_t count,
                     rlxmlx_array** out, char* err, size_t err_len);

// Size of the array's contents in bytes.
size_t rlxmlx_array_nbytes(const rlxmlx_array* array);

// Copies the array's contents (rlxmlx_array_nbytes bytes) to `out`.
void rlxmlx_array_read(const rlxmlx_array* array, void* out);

// Overwrites the array's contents with rlxmlx_array_nbytes bytes from `data`,
// so that an array can serve call after call without a new allocation.
void rlxmlx_array_write(rlxmlx_array* array, const void* data);

// Releases an array.
void rlxmlx_array_free(rlxmlx_array* array);

// all_sum / all_max / all_min of `data`, in place.
int rlxmlx_all_reduce(const rlxmlx_group* group, int op, rlxmlx_array* data,
                      char* err, size_t err_len);

// all_gather of `in` into `out` (size x the elements of `in`, rank order).
int rlxmlx_all_gather(const rlxmlx_group* group, const rlxmlx_array* in,
                      rlxmlx_array* out, char* err, size_t err_len);

// sum_scatter of `in` (size x the elements of `out`); this rank's block of the
// sum lands in `out`.
int rlxmlx_sum_scatter(const rlxmlx_group* group, const rlxmlx_array* in,
                       rlxmlx_array* out, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
