//! # q4nx-format
//!
//! Q4NX is the weight container of FastFlowLM's NPU model packages (`model.q4nx`,
//! `dflash_weight.q4nx`). It is a safetensors file: an 8-byte little-endian header
//! length, a JSON header mapping tensor names to dtype, shape and byte offsets, then
//! the data. Projections are stored as FastFlowLM's 32 x 256 q4_1 *tiles* (`I8
//! [tiles, 5120]`); embeddings and norms are dense BF16.
//!
//! This crate reads and writes that container and encodes and decodes the tiles. It
//! does no arithmetic on weights beyond decoding and encoding, and nothing it does
//! panics on file content: every size from a file goes through checked arithmetic,
//! and every refusal is a [`FormatError`] whose message starts `q4nx: ` and names the
//! file, the tensor and the values.
//!
//! - [`Container`] maps a file (or takes bytes) and validates it with
//!   [`Header::parse`]; [`TensorView`]s are zero-copy slices in file order or by name.
//! - [`Q4Matrix`] is a checked view of one N x K tile tensor: decode a tile, rows, or all.
//! - [`encode_q4_1`] and [`TileBuilder`] make tiles; [`ContainerWriter`] writes files
//!   byte-identical to the safetensors library's `save_file`.
//!
//! ```
//! use q4nx_format::{encode_q4_1, Container, ContainerWriter, Dtype, Q4Kind, Q4Matrix};
//!
//! // A 40 x 320 weight (K not a multiple of 256, N not of 32) whose groups are exactly q4_1-representable.
//! let (n, k) = (40, 320);
//! let weight: Vec<f32> = (0..n * k).map(|i| 0.5 * (i % 16) as f32 - 2.0).collect();
//! let tiles = encode_q4_1(&weight, n, k)?;
//!
//! let mut writer = ContainerWriter::new();
//! writer.add("proj.weight", Dtype::I8, &[tiles.len() / 5120, 5120], tiles)?;
//! writer.add_bf16("norm.weight", &[4], &[1.0, 0.5, 0.25, 2.0])?;
//! let container = Container::from_bytes("example", writer.to_bytes())?;
//!
//! let view = container.tensor("proj.weight")?;
//! let matrix = Q4Matrix::from_tensor(&view, n, k, Q4Kind::Q4_1)?;
//! assert_eq!(matrix.decode(), weight);
//! assert_eq!(container.tensor("norm.weight")?.to_f32()?, vec![1.0, 0.5, 0.25, 2.0]);
//! # Ok::<(), q4nx_format::FormatError>(())
//! ```

#![warn(missing_docs)]

mod container;
mod dtype;
mod error;
mod tile;
mod writer;

pub use container::{Container, Header, TensorInfo, TensorView, MAX_HEADER_LEN};
pub use dtype::Dtype;
pub use error::{FormatError, Result};
pub use tile::{
    decode_tile, encode_q4_1, quantize_group, Q4Group, Q4Kind, Q4Matrix, TileBuilder, TileGrid,
    GROUPS_PER_TILE, GROUP_COLS, MIN_OFFSET, NIBBLE_OFFSET, TILE_BYTES, TILE_COLS, TILE_ROWS,
};
pub use writer::ContainerWriter;

/// Entry points for the fuzz harness (`cargo xtask fuzz`) and the property tests:
/// parse untrusted bytes and use everything an accepted container offers.
#[doc(hidden)]
pub mod fuzzing {
    use crate::{Container, Dtype, Q4Kind, Q4Matrix, TILE_BYTES};

    /// Parses `bytes` and, if accepted, reads every tensor every way a caller can.
    /// Panics only on an internal inconsistency (a bug), never on bad input.
    pub fn exercise_container(bytes: Vec<u8>) -> bool {
        let Ok(c) = Container::from_bytes("fuzz", bytes) else {
            return false;
        };
        let mut end = 0;
        for t in c.tensors() {
            assert_eq!(t.bytes.len(), t.num_elements() * t.dtype.size());
            end += t.bytes.len();
            let _ = t.to_f32();
            let _ = t.to_i64();
            if t.dtype == Dtype::I8 && t.shape.len() == 2 && t.shape[1] == TILE_BYTES {
                if let Ok(m) = Q4Matrix::from_tensor(&t, t.shape[0] * 32, 256, Q4Kind::Q4_1) {
                    let _ = m.decode_rows(0..m.rows().min(40));
                }
            }
        }
        assert_eq!(end + c.header().data_start(), c.file_len());
        true
    }
}
