//! The raw `extern "C"` interface of the C++ shim (`shim/rlx_mlx_shim.h`) and the one safe
//! type over it, [`Group`]: an owned MLX group whose calls return [`CollectiveError`]s.
//!
//! Nothing outside this module touches a raw pointer of the shim.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;

use rlx_transport::{CollectiveError, Result};

use crate::native::{MlxDtype, MlxReduce};

/// Opaque group handle of the shim.
#[repr(C)]
struct RawGroup {
    _private: [u8; 0],
}

/// Opaque array handle of the shim.
#[repr(C)]
struct RawArray {
    _private: [u8; 0],
}

const OK: c_int = 0;
const ERR_ARG: c_int = 2;
const ERROR_CAPACITY: usize = 1024;

// SAFETY: these declarations match `shim/rlx_mlx_shim.h` exactly; every function catches all
// C++ exceptions and reports them through its return code and `err` buffer.
unsafe extern "C" {
    fn rlxmlx_is_available(backend: *const c_char) -> c_int;
    fn rlxmlx_init(
        strict: c_int,
        backend: *const c_char,
        out: *mut *mut RawGroup,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_group_free(group: *mut RawGroup);
    fn rlxmlx_clear_backends();
    fn rlxmlx_group_rank(group: *const RawGroup) -> c_int;
    fn rlxmlx_group_size(group: *const RawGroup) -> c_int;
    fn rlxmlx_split(
        group: *const RawGroup,
        color: c_int,
        key: c_int,
        out: *mut *mut RawGroup,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_send(
        group: *const RawGroup,
        dst: c_int,
        parts: *const *const c_void,
        lens: *const usize,
        nparts: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_send_array(
        group: *const RawGroup,
        dst: c_int,
        array: *const RawArray,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_recv(
        group: *const RawGroup,
        src: c_int,
        dtype: c_int,
        data: *mut c_void,
        count: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_array_new(
        dtype: c_int,
        data: *const c_void,
        count: usize,
        out: *mut *mut RawArray,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_array_nbytes(array: *const RawArray) -> usize;
    fn rlxmlx_array_read(array: *const RawArray, out: *mut c_void);
    fn rlxmlx_array_write(array: *mut RawArray, data: *const c_void);
    fn rlxmlx_array_free(array: *mut RawArray);
    fn rlxmlx_all_reduce(
        group: *const RawGroup,
        op: c_int,
        data: *mut RawArray,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_all_gather(
        group: *const RawGroup,
        input: *const RawArray,
        out: *mut RawArray,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    fn rlxmlx_sum_scatter(
        group: *const RawGroup,
        input: *const RawArray,
        out: *mut RawArray,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// Whether this MLX build has `backend` (`"any"`, `"ring"`, `"mpi"`, `"jaccl"`).
pub(crate) fn is_available(backend: &str) -> bool {
    let Ok(name) = CString::new(backend) else {
        return false;
    };
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    unsafe { rlxmlx_is_available(name.as_ptr()) == 1 }
}

/// Drops MLX's cached groups, so that groups no [`Group`] holds any more are destroyed; for
/// MPI this is what calls `MPI_Finalize`, which `mpirun` requires before a rank exits.
pub(crate) fn clear_backends() {
    // SAFETY: the shim function takes no arguments and catches every exception.
    unsafe { rlxmlx_clear_backends() }
}

/// A failed shim call: the status code and MLX's message.
#[derive(Debug)]
pub(crate) struct ShimError {
    /// Whether the shim refused an argument before calling MLX.
    pub(crate) refused: bool,
    pub(crate) message: String,
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Runs one shim call with an error buffer and turns a failure into a [`ShimError`].
fn call(f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), ShimError> {
    let mut err = [0 as c_char; ERROR_CAPACITY];
    let code = f(err.as_mut_ptr(), err.len());
    if code == OK {
        return Ok(());
    }
    // The shim always NUL-terminates within the capacity; the last byte is forced to NUL so a
    // shim bug cannot make this read past the buffer.
    err[ERROR_CAPACITY - 1] = 0;
    // SAFETY: `err` is a NUL-terminated buffer that lives until the end of this function.
    let message = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(ShimError {
        refused: code == ERR_ARG,
        message: if message.is_empty() {
            format!("MLX call failed with status {code}")
        } else {
            message
        },
    })
}

fn rank_arg(rank: u32) -> Result<c_int, ShimError> {
    c_int::try_from(rank).map_err(|_| ShimError {
        refused: true,
        message: format!("rank {rank} does not fit MLX's int"),
    })
}

/// An MLX distributed group owned by RLX. The shim is safe to call from any thread, so the
/// group is `Send + Sync`.
pub(crate) struct Group {
    raw: *mut RawGroup,
}

// SAFETY: the shim's functions may be called concurrently from any thread (each thread uses
// its own MLX stream, MLX's backends lock their own queues), and the handle is freed only in
// `Drop`, when no other reference exists.
unsafe impl Send for Group {}
// SAFETY: as above; every method takes `&self` and the shim never mutates the handle.
unsafe impl Sync for Group {}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Group {
    /// `mlx::core::distributed::init(strict, backend)`.
    pub(crate) fn init(strict: bool, backend: &str) -> Result<Group, ShimError> {
        let name = CString::new(backend).map_err(|_| ShimError {
            refused: true,
            message: format!("backend name {backend:?} contains a NUL byte"),
        })?;
        let mut raw: *mut RawGroup = std::ptr::null_mut();
        call(|err, len| {
            // SAFETY: `name` is NUL-terminated, `raw` is a valid out-pointer and `err` holds
            // `len` bytes; all outlive the call.
            unsafe { rlxmlx_init(c_int::from(strict), name.as_ptr(), &mut raw, err, len) }
        })?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: *mut RawGroup) -> Result<Group, ShimError> {
        if raw.is_null() {
            return Err(ShimError {
                refused: false,
                message: "MLX returned no group".to_owned(),
            });
        }
        Ok(Group { raw })
    }

    /// This process's rank in the group (`None` if MLX reports nonsense).
    pub(crate) fn rank(&self) -> Option<u32> {
        // SAFETY: `self.raw` is a live group handle until `Drop`.
        u32::try_from(unsafe { rlxmlx_group_rank(self.raw) }).ok()
    }

    /// Number of ranks in the group (`None` if MLX reports nonsense).
    pub(crate) fn size(&self) -> Option<u32> {
        // SAFETY: `self.raw` is a live group handle until `Drop`.
        u32::try_from(unsafe { rlxmlx_group_size(self.raw) }).ok()
    }

    /// `Group::split(color, key)`; a negative key keeps the current order.
    pub(crate) fn split(&self, color: i32, key: i32) -> Result<Group, ShimError> {
        let mut raw: *mut RawGroup = std::ptr::null_mut();
        call(|err, len| {
            // SAFETY: `self.raw` is live, `raw` is a valid out-pointer, `err` holds `len` bytes.
            unsafe { rlxmlx_split(self.raw, color, key, &mut raw, err, len) }
        })?;
        Self::from_raw(raw)
    }

    /// Sends `data` (bytes) to `dst`; returns once MLX has handed them to its connection.
    pub(crate) fn send(&self, dst: u32, data: &[u8]) -> Result<(), ShimError> {
        self.send_parts(dst, &[data])
    }

    /// Sends the bytes of `parts`, one after the other, to `dst` as one MLX message (the
    /// shim gathers them into the array it sends); returns once MLX has handed them to its
    /// connection.
    /// At most [`MAX_SEND_PARTS`] parts, listed on the stack: a send allocates nothing here.
    pub(crate) fn send_parts(&self, dst: u32, parts: &[&[u8]]) -> Result<(), ShimError> {
        let dst = rank_arg(dst)?;
        if parts.len() > MAX_SEND_PARTS {
            return Err(ShimError {
                refused: true,
                message: format!(
                    "{} parts in one send; at most {MAX_SEND_PARTS}",
                    parts.len()
                ),
            });
        }
        let mut pointers = [std::ptr::null::<c_void>(); MAX_SEND_PARTS];
        let mut lens = [0usize; MAX_SEND_PARTS];
        for (i, part) in parts.iter().enumerate() {
            pointers[i] = part.as_ptr().cast();
            lens[i] = part.len();
        }
        call(|err, len| {
            // SAFETY: part `i` is valid for `lens[i]` bytes for the whole call (the shim
            // copies the parts before returning), the first `parts.len()` entries of
            // `pointers` and `lens` describe them (at most MAX_SEND_PARTS, checked above), and
            // `err` holds `len` bytes.
            unsafe {
                rlxmlx_send(
                    self.raw,
                    dst,
                    pointers.as_ptr(),
                    lens.as_ptr(),
                    parts.len(),
                    err,
                    len,
                )
            }
        })
    }

    /// Sends the whole of `array` to `dst` as one message, without copying it. On failure
    /// MLX may still read the array, so the caller must leak it (see
    /// `pool::abandon_on_failure`).
    pub(crate) fn send_array(&self, dst: u32, array: &HostArray) -> Result<(), ShimError> {
        let dst = rank_arg(dst)?;
        call(|err, len| {
            // SAFETY: `self.raw` and `array.raw` are live handles; `err` holds `len` bytes.
            unsafe { rlxmlx_send_array(self.raw, dst, array.raw, err, len) }
        })
    }

    /// Receives exactly `len` bytes from `src` into the memory at `dst`; the shim writes only
    /// there.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes for the whole call.
    unsafe fn recv_raw(&self, src: u32, dst: *mut u8, len: usize) -> Result<(), ShimError> {
        let src = rank_arg(src)?;
        call(|err, err_len| {
            // SAFETY: the caller guarantees `dst`; `err` holds `err_len` bytes.
            unsafe {
                rlxmlx_recv(
                    self.raw,
                    src,
                    MlxDtype::U8.code(),
                    dst.cast(),
                    len,
                    err,
                    err_len,
                )
            }
        })
    }

    /// Receives exactly `data.len()` bytes from `src` into `data`.
    pub(crate) fn recv(&self, src: u32, data: &mut [u8]) -> Result<(), ShimError> {
        // SAFETY: `data` is valid for writes of `data.len()` bytes for the whole call.
        unsafe { self.recv_raw(src, data.as_mut_ptr(), data.len()) }
    }

    /// Receives `count` bytes from `src` and appends them to `buf` (whose capacity must
    /// already hold them), without first zeroing the space they go into.
    pub(crate) fn recv_append(
        &self,
        src: u32,
        buf: &mut Vec<u8>,
        count: usize,
    ) -> Result<(), ShimError> {
        let spare = buf.spare_capacity_mut();
        if spare.len() < count {
            return Err(ShimError {
                refused: true,
                message: format!(
                    "a receive of {count} bytes into a buffer with room for {}",
                    spare.len()
                ),
            });
        }
        // SAFETY: `spare` is valid for writes of at least `count` bytes for the whole call.
        unsafe { self.recv_raw(src, spare.as_mut_ptr().cast(), count) }?;
        // SAFETY: on success the shim has written all `count` bytes after the initialised
        // part of `buf`, within its capacity (checked above).
        unsafe { buf.set_len(buf.len() + count) };
        Ok(())
    }

    /// In-place all-reduce of `data`.
    pub(crate) fn all_reduce(&self, op: MlxReduce, data: &mut HostArray) -> Result<(), ShimError> {
        call(|err, len| {
            // SAFETY: `self.raw` and `data.raw` are live handles; `err` holds `len` bytes.
            unsafe { rlxmlx_all_reduce(self.raw, op as c_int, data.raw, err, len) }
        })
    }

    /// Gathers every rank's `local` into `out` (`size ×` its elements, rank order).
    pub(crate) fn all_gather(
        &self,
        local: &HostArray,
        out: &mut HostArray,
    ) -> Result<(), ShimError> {
        call(|err, len| {
            // SAFETY: both handles are live; the shim checks their shapes; `err` holds `len`.
            unsafe { rlxmlx_all_gather(self.raw, local.raw, out.raw, err, len) }
        })
    }

    /// Sums `input` (`size` equal blocks) and leaves this rank's block in `out`.
    pub(crate) fn sum_scatter(
        &self,
        input: &HostArray,
        out: &mut HostArray,
    ) -> Result<(), ShimError> {
        call(|err, len| {
            // SAFETY: both handles are live; the shim checks their shapes; `err` holds `len`.
            unsafe { rlxmlx_sum_scatter(self.raw, input.raw, out.raw, err, len) }
        })
    }
}

/// Most parts one [`Group::send_parts`] takes: a frame's header, its body parts and padding.
pub(crate) const MAX_SEND_PARTS: usize = 8;

/// An MLX array in host memory owned by RLX: filled from and read into the caller's buffers
/// on the caller's thread, and handed to the thread that runs a collective.
pub(crate) struct HostArray {
    raw: *mut RawArray,
    dtype: MlxDtype,
}

// SAFETY: an MLX array is reference-counted data with no thread affinity; the handle is used
// by one thread at a time (it moves to the collective's thread and back) and freed once.
unsafe impl Send for HostArray {}

impl fmt::Debug for HostArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostArray")
            .field("dtype", &self.dtype)
            .field("nbytes", &self.nbytes())
            .finish()
    }
}

impl HostArray {
    /// A copy of `data`, whose elements are `dtype`.
    pub(crate) fn copy_of(dtype: MlxDtype, data: &[u8]) -> Result<HostArray, ShimError> {
        Self::make(dtype, data.as_ptr(), data.len() / dtype.size())
    }

    /// `count` elements of `dtype` for MLX to fill.
    pub(crate) fn uninitialized(dtype: MlxDtype, count: usize) -> Result<HostArray, ShimError> {
        Self::make(dtype, std::ptr::null(), count)
    }

    fn make(dtype: MlxDtype, data: *const u8, count: usize) -> Result<HostArray, ShimError> {
        let mut raw: *mut RawArray = std::ptr::null_mut();
        call(|err, len| {
            // SAFETY: `data` is null or valid for `count * dtype.size()` bytes (the callers
            // above derive `count` from the slice), `raw` is a valid out-pointer and `err`
            // holds `len` bytes.
            unsafe { rlxmlx_array_new(dtype.code(), data.cast(), count, &mut raw, err, len) }
        })?;
        if raw.is_null() {
            return Err(ShimError {
                refused: false,
                message: "MLX returned no array".to_owned(),
            });
        }
        Ok(HostArray { raw, dtype })
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> MlxDtype {
        self.dtype
    }

    /// Overwrites the contents with `data`, which must be exactly [`HostArray::nbytes`] long.
    pub(crate) fn write_from(&mut self, data: &[u8]) -> Result<(), ShimError> {
        self.check_len(data.len())?;
        // SAFETY: `data` is readable for exactly `nbytes()` bytes (checked above), the handle
        // is live and `&mut self` makes this the only user of the array.
        unsafe { rlxmlx_array_write(self.raw, data.as_ptr().cast()) };
        Ok(())
    }

    /// Refuses a host buffer of `len` bytes that is not exactly as long as the contents.
    fn check_len(&self, len: usize) -> Result<(), ShimError> {
        if len == self.nbytes() {
            return Ok(());
        }
        Err(ShimError {
            refused: true,
            message: format!(
                "a host buffer of {len} bytes for an MLX array of {} bytes",
                self.nbytes()
            ),
        })
    }

    /// Size of the contents in bytes.
    pub(crate) fn nbytes(&self) -> usize {
        // SAFETY: `self.raw` is a live array handle until `Drop`.
        unsafe { rlxmlx_array_nbytes(self.raw) }
    }

    /// Copies the contents into `out`, which must be exactly [`HostArray::nbytes`] long.
    pub(crate) fn read_into(&self, out: &mut [u8]) -> Result<(), ShimError> {
        self.check_len(out.len())?;
        // SAFETY: `out` is writable for exactly `nbytes()` bytes (checked above) and the
        // handle is live.
        unsafe { rlxmlx_array_read(self.raw, out.as_mut_ptr().cast()) };
        Ok(())
    }
}

impl Drop for HostArray {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from the shim, is non-null and is freed exactly once here.
        unsafe { rlxmlx_array_free(self.raw) }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from the shim, is non-null and is freed exactly once here.
        unsafe { rlxmlx_group_free(self.raw) }
    }
}

impl ShimError {
    /// This failure as the project's error for the MLX operation `op`: a refused argument is
    /// [`CollectiveError::InvalidArgument`]; a failure inside MLX (typically a lost
    /// connection, whose peer MLX does not name) is [`CollectiveError::Io`].
    pub(crate) fn into_error(self, op: &str) -> CollectiveError {
        if self.refused {
            return CollectiveError::invalid(format!("MLX {op}: {}", self.message));
        }
        CollectiveError::Io {
            peer: None,
            source: std::io::Error::other(format!("MLX {op} failed: {}", self.message)),
        }
    }
}
