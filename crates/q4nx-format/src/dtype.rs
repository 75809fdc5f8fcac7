//! Element types a container may declare.

use std::fmt;

/// An element type, named by its safetensors label.
///
/// The declaration order is the safetensors crate's own `Dtype` order; its
/// serializer writes tensors sorted by this order, largest first, then by name.
/// [`crate::ContainerWriter`] relies on it to reproduce FastFlowLM's files byte
/// for byte, so do not reorder the variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Booleans, one byte each.
    Bool,
    /// Unsigned 8-bit integers.
    U8,
    /// Signed 8-bit integers (q4_1 tiles are stored as `I8`).
    I8,
    /// 8-bit floats, 5 exponent and 2 mantissa bits.
    F8E5M2,
    /// 8-bit floats, 4 exponent and 3 mantissa bits.
    F8E4M3,
    /// Signed 16-bit integers.
    I16,
    /// Unsigned 16-bit integers.
    U16,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integers.
    I32,
    /// Unsigned 32-bit integers.
    U32,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 64-bit integers.
    I64,
    /// Unsigned 64-bit integers.
    U64,
}

impl Dtype {
    /// Every known dtype, in serializer order.
    pub const ALL: [Dtype; 15] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The label used in the JSON header.
    pub fn label(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Parses a header label; `None` for a label this crate does not know.
    pub fn from_label(label: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.label() == label)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E5M2 | Dtype::F8E4M3 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_sizes_are_known() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_label(d.label()), Some(d));
        }
        let sizes: Vec<(&str, usize)> = Dtype::ALL.iter().map(|d| (d.label(), d.size())).collect();
        assert_eq!(
            sizes,
            [
                ("BOOL", 1),
                ("U8", 1),
                ("I8", 1),
                ("F8_E5M2", 1),
                ("F8_E4M3", 1),
                ("I16", 2),
                ("U16", 2),
                ("F16", 2),
                ("BF16", 2),
                ("I32", 4),
                ("U32", 4),
                ("F32", 4),
                ("F64", 8),
                ("I64", 8),
                ("U64", 8),
            ]
        );
        assert_eq!(Dtype::from_label("bf16"), None);
        assert_eq!(Dtype::from_label("Q4"), None);
    }
}
