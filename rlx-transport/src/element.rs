//! [`Element`]: the Rust types a typed collective or message can carry, each tied to its
//! [`DType`], so that a buffer's type and the dtype it travels as can never disagree.

use crate::DType;

/// A plain element type that travels as [`Element::DTYPE`]: `f32`, `f64`, `half::f16`,
/// `half::bf16`, `i8`, `u8`, `i32` and `i64`.
///
/// The typed collectives of `rlx-collective` (`all_reduce::<T>`, `broadcast::<T>`, ...) move a
/// `&[T]` as its bytes in memory, which on the little-endian hosts RLX runs on (x86-64 and
/// Apple Silicon, and every Arm Linux board in use) are the little-endian wire encoding. Use the
/// `*_typed(&mut [u8], DType)` forms for buffers whose type is known only at run time.
///
/// # Examples
///
/// ```
/// use rlx_transport::{DType, Element};
///
/// fn dtype_of<T: Element>(_: &[T]) -> DType {
///     T::DTYPE
/// }
/// assert_eq!(dtype_of(&[1.0f32]), DType::F32);
/// assert_eq!(dtype_of(&[half::bf16::ONE]), DType::BF16);
/// ```
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// How this type travels.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

impl Element for i8 {
    const DTYPE: DType = DType::I8;
}

impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each type's size is the size its dtype declares, so the bytes of a `&[T]` are whole
    /// elements of `T::DTYPE`.
    #[test]
    fn every_element_has_the_size_of_its_dtype() {
        fn size<T: Element>() -> (usize, usize) {
            (std::mem::size_of::<T>(), T::DTYPE.size())
        }
        for (actual, declared) in [
            size::<f32>(),
            size::<f64>(),
            size::<half::f16>(),
            size::<half::bf16>(),
            size::<i8>(),
            size::<u8>(),
            size::<i32>(),
            size::<i64>(),
        ] {
            assert_eq!(actual, declared);
        }
    }
}
