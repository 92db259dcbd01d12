//! Reuse of the MLX arrays that carry native collectives' data between calls.
//!
//! A native collective copies the caller's bytes into an MLX array (MLX's CPU allocator cannot
//! wrap foreign memory) and hands the array to the collective thread. A fresh array of a large
//! size is fresh memory from the system, and touching it the first time costs as much as the
//! copy itself; training loops all-reduce the same sizes call after call, so arrays of the
//! same type and size are kept for the next call. Only arrays that came back from a finished
//! collective are kept: one still owned by a stuck collective thread is never reused.

use std::sync::Mutex;

use crate::ffi::{HostArray, ShimError};
use crate::native::MlxDtype;
use crate::sync::lock;

/// How many spare arrays a transport keeps (an all-gather uses two at once).
const SPARE_ARRAYS: usize = 4;

/// Spare MLX arrays of one transport, newest last.
#[derive(Default)]
pub(crate) struct ArrayPool {
    spare: Mutex<Vec<HostArray>>,
}

impl ArrayPool {
    /// A spare array of `dtype` holding exactly `nbytes` bytes, if there is one.
    fn take(&self, dtype: MlxDtype, nbytes: usize) -> Option<HostArray> {
        let mut spare = lock(&self.spare);
        let at = spare
            .iter()
            .rposition(|a| a.dtype() == dtype && a.nbytes() == nbytes)?;
        Some(spare.remove(at))
    }

    /// An array of `dtype` holding a copy of `data`.
    pub(crate) fn filled(&self, dtype: MlxDtype, data: &[u8]) -> Result<HostArray, ShimError> {
        match self.take(dtype, data.len()) {
            Some(mut array) => {
                array.write_from(data)?;
                Ok(array)
            }
            None => HostArray::copy_of(dtype, data),
        }
    }

    /// An array of `count` elements of `dtype` whose contents MLX will overwrite.
    pub(crate) fn blank(&self, dtype: MlxDtype, count: usize) -> Result<HostArray, ShimError> {
        match self.take(dtype, count * dtype.size()) {
            Some(array) => Ok(array),
            None => HostArray::uninitialized(dtype, count),
        }
    }

    /// Keeps `array` for a later call, dropping the oldest spare when the pool is full.
    pub(crate) fn give_back(&self, array: HostArray) {
        let mut spare = lock(&self.spare);
        if spare.len() == SPARE_ARRAYS {
            spare.remove(0);
        }
        spare.push(array);
    }
}

/// The error of an MLX collective over `arrays`, which are leaked unless MLX refused the call
/// before starting: a failed collective returns as soon as one connection fails, while MLX's
/// transfers on its other connections may still write into the arrays, so their memory must
/// never be reused. Only a transport that is unusable afterwards leaks them.
pub(crate) fn abandon_on_failure<T>(error: ShimError, arrays: T) -> ShimError {
    if !error.refused {
        std::mem::forget(arrays);
    }
    error
}
