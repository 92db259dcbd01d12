// The RLX shim over MLX's distributed module: the C functions declared in
// rlx_mlx_shim.h, each a thin, exception-safe wrapper around one call of
// mlx::core::distributed.
//
// The collectives and point-to-point calls drive the group implementation
// (GroupImpl) directly on host-filled arrays and then synchronize the stream,
// instead of building a lazy graph and evaluating it: the result is the same
// MLX code path without a graph per call, and a reduction can run in place.
// Synchronizing the stream is also what surfaces an error thrown on MLX's
// stream thread (a lost peer, an unsupported operation) as an exception here.

#include "rlx_mlx_shim.h"

#include <mlx/allocator.h>
#include <mlx/array.h>
#include <mlx/distributed/distributed.h>
#include <mlx/distributed/distributed_impl.h>
#include <mlx/stream.h>

#include <climits>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace mx = mlx::core;
namespace dist = mlx::core::distributed;

struct rlxmlx_group {
  dist::Group group;
};

struct rlxmlx_array {
  mx::array array;
};

namespace {

// A refused argument, reported as RLXMLX_ERR_ARG rather than RLXMLX_ERR_MLX.
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void write_error(char* err, size_t err_len, const char* message) {
  if (err == nullptr || err_len == 0) {
    return;
  }
  size_t n = std::strlen(message);
  if (n >= err_len) {
    n = err_len - 1;
  }
  std::memcpy(err, message, n);
  err[n] = '\0';
}

// Runs `body`, turning every exception into a status code and a message.
template <typename F>
int guarded(char* err, size_t err_len, F&& body) {
  try {
    body();
    return RLXMLX_OK;
  } catch (const ArgumentError& e) {
    write_error(err, err_len, e.what());
    return RLXMLX_ERR_ARG;
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
    return RLXMLX_ERR_MLX;
  } catch (...) {
    write_error(err, err_len, "a non-standard exception was thrown in MLX");
    return RLXMLX_ERR_UNKNOWN;
  }
}

mx::Dtype to_dtype(int code) {
  switch (code) {
    case RLXMLX_BOOL:
      return mx::bool_;
    case RLXMLX_U8:
      return mx::uint8;
    case RLXMLX_U16:
      return mx::uint16;
    case RLXMLX_U32:
      return mx::uint32;
    case RLXMLX_U64:
      return mx::uint64;
    case RLXMLX_I8:
      return mx::int8;
    case RLXMLX_I16:
      return mx::int16;
    case RLXMLX_I32:
      return mx::int32;
    case RLXMLX_I64:
      return mx::int64;
    case RLXMLX_F16:
      return mx::float16;
    case RLXMLX_BF16:
      return mx::bfloat16;
    case RLXMLX_F32:
      return mx::float32;
    case RLXMLX_F64:
      return mx::float64;
    case RLXMLX_C64:
      return mx::complex64;
    default:
      throw ArgumentError("unknown dtype code " + std::to_string(code));
  }
}

// MLX shapes hold 32-bit dimensions; a flat array is limited to INT_MAX
// elements.
mx::Shape flat_shape(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw ArgumentError(
        "an MLX array holds at most " + std::to_string(INT_MAX) +
        " elements per call, got " + std::to_string(count));
  }
  return mx::Shape{static_cast<int>(count)};
}

// An array whose contents are a copy of `count` elements at `data`.
mx::array copied_in(const void* data, size_t count, mx::Dtype dtype) {
  return mx::array(
      const_cast<void*>(data), flat_shape(count), dtype, [](void*) {});
}

// An array of `count` elements whose contents are left for MLX to write.
mx::array uninitialized(size_t count, mx::Dtype dtype) {
  mx::Shape shape = flat_shape(count);
  return mx::array(
      mx::allocator::malloc(count * dtype.size()), std::move(shape), dtype);
}

void copy_out(const mx::array& a, void* out) {
  if (a.nbytes() > 0) {
    std::memcpy(out, a.data<char>(), a.nbytes());
  }
}

// Runs `transfer` on `array` and frees the array afterwards, unless the
// transfer fails: MLX fails a call as soon as one of its connections fails,
// while its transfers on other connections may still write into or read from
// the array, so a failed call's array is left allocated (the connection, and
// with it the transport, is unusable afterwards anyway).
template <typename F>
void transfer_keeping_on_failure(std::unique_ptr<mx::array> array,
                                 F&& transfer) {
  try {
    transfer(*array);
  } catch (...) {
    array.release();
    throw;
  }
}

// The stream of the calling thread (MLX streams are usable only by the thread
// that created them).
mx::Stream thread_stream() {
  static thread_local std::optional<mx::Stream> stream;
  if (!stream.has_value()) {
    stream.emplace(mx::new_stream(mx::Device::cpu));
  }
  return *stream;
}

// The group's implementation and the stream its operations run on.
struct Target {
  dist::detail::GroupImpl* impl;
  mx::Stream stream;
};

Target target(const rlxmlx_group* group) {
  if (group == nullptr) {
    throw ArgumentError("null group handle");
  }
  auto* impl = group->group.raw_group().get();
  if (impl == nullptr) {
    throw ArgumentError("the group has no implementation");
  }
  return Target{impl, impl->communication_stream(thread_stream())};
}

// Refuses null handles, and arrays of `in` and `out` whose types differ or
// where `whole` does not hold exactly one `block` per rank of the group.
void check_blocks(const Target& t, const rlxmlx_array* in,
                  const rlxmlx_array* out, const rlxmlx_array* whole,
                  const rlxmlx_array* block, const char* what) {
  if (in == nullptr || out == nullptr) {
    throw ArgumentError("null array handle");
  }
  size_t size = static_cast<size_t>(t.impl->size());
  if (out->array.dtype() != in->array.dtype() ||
      whole->array.size() != block->array.size() * size) {
    throw ArgumentError(what);
  }
}

} // namespace

extern "C" {

int rlxmlx_is_available(const char* backend) {
  try {
    return dist::is_available(std::string(backend ? backend : "any")) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int rlxmlx_init(int strict, const char* backend, rlxmlx_group** out,
                char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    if (out == nullptr) {
      throw ArgumentError("null output pointer");
    }
    std::string bk(backend ? backend : "any");
    dist::Group group = dist::init(strict != 0, bk);
    *out = new rlxmlx_group{group};
  });
}

void rlxmlx_group_free(rlxmlx_group* group) {
  delete group;
}

void rlxmlx_clear_backends(void) {
  try {
    dist::clear_backends();
  } catch (...) {
    // Nothing to report: the process is shutting its MLX world down.
  }
}

int rlxmlx_group_rank(const rlxmlx_group* group) {
  try {
    return group ? group->group.rank() : -1;
  } catch (...) {
    return -1;
  }
}

int rlxmlx_group_size(const rlxmlx_group* group) {
  try {
    return group ? group->group.size() : -1;
  } catch (...) {
    return -1;
  }
}

int rlxmlx_split(const rlxmlx_group* group, int color, int key,
                 rlxmlx_group** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    if (group == nullptr || out == nullptr) {
      throw ArgumentError("null group handle or output pointer");
    }
    dist::Group sub = group->group.split(color, key);
    *out = new rlxmlx_group{sub};
  });
}

int rlxmlx_send(const rlxmlx_group* group, int dst, const void* const* parts,
                const size_t* lens, size_t nparts, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    if (nparts > 0 && (parts == nullptr || lens == nullptr)) {
      throw ArgumentError("null part list");
    }
    size_t total = 0;
    for (size_t i = 0; i < nparts; i++) {
      total += lens[i];
    }
    auto a = std::make_unique<mx::array>(uninitialized(total, mx::uint8));
    char* at = a->data<char>();
    for (size_t i = 0; i < nparts; i++) {
      if (lens[i] > 0) {
        std::memcpy(at, parts[i], lens[i]);
        at += lens[i];
      }
    }
    transfer_keeping_on_failure(std::move(a), [&](mx::array& array) {
      t.impl->send(array, dst, t.stream);
      mx::synchronize(t.stream);
    });
  });
}

int rlxmlx_send_array(const rlxmlx_group* group, int dst,
                      const rlxmlx_array* array, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    if (array == nullptr) {
      throw ArgumentError("null array handle");
    }
    t.impl->send(array->array, dst, t.stream);
    mx::synchronize(t.stream);
  });
}

int rlxmlx_recv(const rlxmlx_group* group, int src, int dtype, void* data,
                size_t count, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    auto a = std::make_unique<mx::array>(uninitialized(count, to_dtype(dtype)));
    transfer_keeping_on_failure(std::move(a), [&](mx::array& array) {
      t.impl->recv(array, src, t.stream);
      mx::synchronize(t.stream);
      copy_out(array, data);
    });
  });
}

int rlxmlx_array_new(int dtype, const void* data, size_t count,
                     rlxmlx_array** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    if (out == nullptr) {
      throw ArgumentError("null output pointer");
    }
    mx::Dtype dt = to_dtype(dtype);
    mx::array a = data != nullptr ? copied_in(data, count, dt)
                                  : uninitialized(count, dt);
    *out = new rlxmlx_array{std::move(a)};
  });
}

size_t rlxmlx_array_nbytes(const rlxmlx_array* array) {
  return array ? array->array.nbytes() : 0;
}

void rlxmlx_array_read(const rlxmlx_array* array, void* out) {
  if (array != nullptr && out != nullptr) {
    copy_out(array->array, out);
  }
}

void rlxmlx_array_write(rlxmlx_array* array, const void* data) {
  if (array != nullptr && data != nullptr && array->array.nbytes() > 0) {
    std::memcpy(array->array.data<char>(), data, array->array.nbytes());
  }
}

void rlxmlx_array_free(rlxmlx_array* array) {
  delete array;
}

int rlxmlx_all_reduce(const rlxmlx_group* group, int op, rlxmlx_array* data,
                      char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    if (data == nullptr) {
      throw ArgumentError("null array handle");
    }
    // In place: the backend is spared its own input-to-output copy.
    mx::array& a = data->array;
    switch (op) {
      case RLXMLX_SUM:
        t.impl->all_sum(a, a, t.stream);
        break;
      case RLXMLX_MAX:
        t.impl->all_max(a, a, t.stream);
        break;
      case RLXMLX_MIN:
        t.impl->all_min(a, a, t.stream);
        break;
      default:
        throw ArgumentError("unknown reduction code " + std::to_string(op));
    }
    mx::synchronize(t.stream);
  });
}

int rlxmlx_all_gather(const rlxmlx_group* group, const rlxmlx_array* in,
                      rlxmlx_array* out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    check_blocks(t, in, out, out, in, "all_gather output must hold size x input elements");
    t.impl->all_gather(in->array, out->array, t.stream);
    mx::synchronize(t.stream);
  });
}

int rlxmlx_sum_scatter(const rlxmlx_group* group, const rlxmlx_array* in,
                       rlxmlx_array* out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    Target t = target(group);
    check_blocks(t, in, out, in, out, "sum_scatter input must hold size x output elements");
    t.impl->sum_scatter(in->array, out->array, t.stream);
    mx::synchronize(t.stream);
  });
}

} // extern "C"
