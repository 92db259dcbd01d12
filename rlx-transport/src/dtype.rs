//! Element types and reduction operators that travel on the wire, and the reduce-dtype
//! negotiation rule.

use std::fmt;
use std::str::FromStr;

use crate::CollectiveError;

/// The element type of a buffer. Every type is little-endian on the wire, always.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every dtype, in a fixed order (handy for test matrices and benchmarks).
    pub const ALL: [DType; 8] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The lowercase name used in flags, tables and JSON (`"f32"`, `"bf16"`...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// A stable one-byte code for wire headers.
    pub const fn code(self) -> u8 {
        match self {
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::F32 => 3,
            DType::F64 => 4,
            DType::I8 => 5,
            DType::U8 => 6,
            DType::I32 => 7,
            DType::I64 => 8,
        }
    }

    /// The dtype for a [`DType::code`], if it is one.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.name() == lower)
            .ok_or_else(|| {
                CollectiveError::invalid(format!(
                    "unknown dtype {s:?} (expected one of f16, bf16, f32, f64, i8, u8, i32, i64)"
                ))
            })
    }
}

/// How an all-reduce, reduce or reduce-scatter combines the contributions of the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceKind {
    /// Sum of all contributions.
    Sum,
    /// Sum divided by the number of ranks (integers round to nearest, halves away from zero).
    Mean,
    /// Largest contribution.
    Max,
    /// Smallest contribution.
    Min,
    /// Product of all contributions.
    Product,
}

impl ReduceKind {
    /// Every reduction, in a fixed order.
    pub const ALL: [ReduceKind; 5] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Product,
    ];

    /// The lowercase name used in flags and tables (`"sum"`, `"prod"`...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Mean => "mean",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::Product => "prod",
        }
    }

    /// A stable one-byte code for wire headers.
    pub const fn code(self) -> u8 {
        match self {
            ReduceKind::Sum => 1,
            ReduceKind::Mean => 2,
            ReduceKind::Max => 3,
            ReduceKind::Min => 4,
            ReduceKind::Product => 5,
        }
    }
}

impl fmt::Display for ReduceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceKind {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceKind::Sum),
            "mean" | "avg" => Ok(ReduceKind::Mean),
            "max" => Ok(ReduceKind::Max),
            "min" => Ok(ReduceKind::Min),
            "prod" | "product" => Ok(ReduceKind::Product),
            _ => Err(CollectiveError::invalid(format!(
                "unknown reduction {s:?} (expected sum, mean, max, min or prod)"
            ))),
        }
    }
}

/// The dtype in which ranks holding `dtypes` should reduce together: [`DType::F64`] if any rank
/// holds `F64`, else [`DType::F32`] (also for the empty list).
///
/// # Examples
///
/// ```
/// use rlx_transport::{DType, negotiate_reduce_dtype};
/// assert_eq!(negotiate_reduce_dtype(&[DType::F16, DType::BF16]), DType::F32);
/// assert_eq!(negotiate_reduce_dtype(&[DType::F16, DType::F64]), DType::F64);
/// assert_eq!(negotiate_reduce_dtype(&[]), DType::F32);
/// ```
pub fn negotiate_reduce_dtype(dtypes: &[DType]) -> DType {
    if dtypes.contains(&DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        for r in ReduceKind::ALL {
            assert_eq!(r.name().parse::<ReduceKind>().unwrap(), r);
        }
        assert!("f128".parse::<DType>().is_err());
        assert_eq!(DType::from_code(0), None);
    }

    #[test]
    fn sizes() {
        let total: usize = DType::ALL.iter().map(|d| d.size()).sum();
        assert_eq!(total, 2 + 2 + 4 + 8 + 1 + 1 + 4 + 8);
    }
}
