//! FastFlowLM's q4_1 tile: 32 rows x 256 columns of 4-bit weights in 5120 bytes.
//!
//! Layout of one tile (see `docs/formats.md`):
//! - bytes `0..512`: scales `d`, 256 bf16, index `group * 32 + row`;
//! - bytes `512..1024`: mins `m`, same order;
//! - bytes `1024..5120`: nibbles `[row group of 16][column 0..256][byte j 0..8]`, byte `j`
//!   holding row `2j` of the row group in its low nibble and row `2j + 1` in its high one.
//!
//! An N x K weight is cut into `ceil(N/32) x ceil(K/256)` tiles, row-tile major, with
//! rows past N and columns past K padded with zeros (d = m = q = 0).

use half::bf16;

use crate::container::TensorView;
use crate::dtype::Dtype;
use crate::error::{FormatError, Result};

/// Rows per tile.
pub const TILE_ROWS: usize = 32;
/// Columns per tile.
pub const TILE_COLS: usize = 256;
/// Columns sharing one scale and min.
pub const GROUP_COLS: usize = 32;
/// Groups per tile row.
pub const GROUPS_PER_TILE: usize = TILE_COLS / GROUP_COLS;
/// Bytes per tile (5 bits per weight).
pub const TILE_BYTES: usize = 5120;
/// Offset of the mins inside a tile.
pub const MIN_OFFSET: usize = 512;
/// Offset of the nibbles inside a tile.
pub const NIBBLE_OFFSET: usize = 1024;

const _: () = assert!(NIBBLE_OFFSET + TILE_ROWS * TILE_COLS / 2 == TILE_BYTES);
const _: () = assert!(2 * TILE_ROWS * GROUPS_PER_TILE == MIN_OFFSET);

/// How a tile's nibbles are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Q4Kind {
    /// ggml Q4_1: unsigned `q` in 0..15, `w = d * q + m`.
    #[default]
    Q4_1,
    /// From a ggml Q4_0 source: signed `q` in -8..7 (two's complement nibble), `m = 0`, `w = d * q`.
    Q4_0,
}

/// Tile-grid geometry of an N x K matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileGrid {
    /// Rows of the matrix (N).
    pub rows: usize,
    /// Columns of the matrix (K).
    pub cols: usize,
}

impl TileGrid {
    /// Row blocks (`ceil(rows / 32)`).
    pub fn row_blocks(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }
    /// Column blocks (`ceil(cols / 256)`).
    pub fn col_blocks(&self) -> usize {
        self.cols.div_ceil(TILE_COLS)
    }
    /// Number of tiles, or `None` on overflow.
    pub fn tiles(&self) -> Option<usize> {
        self.row_blocks().checked_mul(self.col_blocks())
    }
    /// Bytes of the tile tensor, or `None` on overflow.
    pub fn byte_len(&self) -> Option<usize> {
        self.tiles()?.checked_mul(TILE_BYTES)
    }
}

/// Byte index and shift of element (row, col) inside a tile's nibble area.
#[inline]
fn nibble_position(row: usize, col: usize) -> (usize, u32) {
    let byte = NIBBLE_OFFSET + (row / 16) * (TILE_COLS * 8) + col * 8 + (row % 16) / 2;
    (byte, if row % 2 == 1 { 4 } else { 0 })
}

#[inline]
fn read_bf16(bytes: &[u8], at: usize) -> f32 {
    bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Decodes one 5120-byte tile into 32 x 256 `f32` values (row-major, padding included).
///
/// `w = f32(d) * q + f32(m)` with one rounding for the sum, as FastFlowLM does.
pub fn decode_tile(tile: &[u8; TILE_BYTES], kind: Q4Kind, out: &mut [f32; TILE_ROWS * TILE_COLS]) {
    let mut d = [0f32; TILE_ROWS * GROUPS_PER_TILE];
    let mut m = [0f32; TILE_ROWS * GROUPS_PER_TILE];
    for i in 0..TILE_ROWS * GROUPS_PER_TILE {
        d[i] = read_bf16(tile, 2 * i);
        m[i] = match kind {
            Q4Kind::Q4_1 => read_bf16(tile, MIN_OFFSET + 2 * i),
            Q4Kind::Q4_0 => 0.0,
        };
    }
    for row_group in 0..2 {
        let base = NIBBLE_OFFSET + row_group * TILE_COLS * 8;
        for col in 0..TILE_COLS {
            let g = col / GROUP_COLS;
            let bytes = &tile[base + col * 8..base + col * 8 + 8];
            for (j, &byte) in bytes.iter().enumerate() {
                for (half_idx, nib) in [byte & 0x0f, byte >> 4].into_iter().enumerate() {
                    let row = row_group * 16 + 2 * j + half_idx;
                    let q = match kind {
                        Q4Kind::Q4_1 => nib as f32,
                        Q4Kind::Q4_0 => ((nib ^ 8) as i32 - 8) as f32,
                    };
                    let s = g * TILE_ROWS + row;
                    out[row * TILE_COLS + col] = d[s] * q + m[s];
                }
            }
        }
    }
}

/// A checked view of an N x K weight stored as q4_1 tiles.
#[derive(Clone, Copy, Debug)]
pub struct Q4Matrix<'a> {
    bytes: &'a [u8],
    grid: TileGrid,
    kind: Q4Kind,
}

impl<'a> Q4Matrix<'a> {
    /// Checks that `tensor` is `I8 [ceil(N/32) * ceil(K/256), 5120]` for `rows` = N, `cols` = K.
    pub fn from_tensor(
        tensor: &TensorView<'a>,
        rows: usize,
        cols: usize,
        kind: Q4Kind,
    ) -> Result<Q4Matrix<'a>> {
        let grid_err = |message: String| FormatError::BadTileGrid {
            path: tensor.path.to_string(),
            tensor: tensor.name.to_string(),
            message,
        };
        if tensor.dtype != Dtype::I8 {
            return Err(FormatError::WrongDtype {
                path: tensor.path.to_string(),
                tensor: tensor.name.to_string(),
                expected: "I8 (q4_1 tiles)".into(),
                found: tensor.dtype.label().into(),
            });
        }
        let grid = TileGrid { rows, cols };
        let tiles = grid
            .tiles()
            .ok_or_else(|| grid_err(format!("a {rows} x {cols} tile grid overflows")))?;
        if rows == 0 || cols == 0 {
            return Err(grid_err(format!(
                "a {rows} x {cols} matrix has no elements"
            )));
        }
        if tensor.shape != [tiles, TILE_BYTES] {
            return Err(grid_err(format!(
                "shape {:?} is not the q4_1 tile grid of {rows} x {cols}: expected [{tiles}, {TILE_BYTES}] \
                 ({} row blocks x {} column blocks)",
                tensor.shape,
                grid.row_blocks(),
                grid.col_blocks()
            )));
        }
        Ok(Q4Matrix {
            bytes: tensor.bytes,
            grid,
            kind,
        })
    }

    /// Wraps raw tile bytes (e.g. from the encoder). `label` names them in errors.
    pub fn from_bytes(
        label: &str,
        bytes: &'a [u8],
        rows: usize,
        cols: usize,
        kind: Q4Kind,
    ) -> Result<Q4Matrix<'a>> {
        let grid = TileGrid { rows, cols };
        match grid.byte_len() {
            Some(n) if n == bytes.len() && rows > 0 && cols > 0 => {
                Ok(Q4Matrix { bytes, grid, kind })
            }
            _ => Err(FormatError::BadTileGrid {
                path: "<memory>".into(),
                tensor: label.into(),
                message: format!(
                    "{} bytes are not the q4_1 tile grid of {rows} x {cols} ({:?} bytes expected)",
                    bytes.len(),
                    grid.byte_len()
                ),
            }),
        }
    }

    /// Logical rows (N).
    pub fn rows(&self) -> usize {
        self.grid.rows
    }
    /// Logical columns (K).
    pub fn cols(&self) -> usize {
        self.grid.cols
    }
    /// The grid.
    pub fn grid(&self) -> TileGrid {
        self.grid
    }
    /// How nibbles are read.
    pub fn kind(&self) -> Q4Kind {
        self.kind
    }
    /// The raw tile bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The bytes of tile (row_block, col_block).
    ///
    /// # Panics
    /// If the block indices are outside the grid.
    pub fn tile(&self, row_block: usize, col_block: usize) -> &'a [u8; TILE_BYTES] {
        assert!(row_block < self.grid.row_blocks() && col_block < self.grid.col_blocks());
        let i = row_block * self.grid.col_blocks() + col_block;
        self.bytes[i * TILE_BYTES..(i + 1) * TILE_BYTES]
            .try_into()
            .expect("tile slice is TILE_BYTES long")
    }

    /// Decodes one tile to 32 x 256 values, padding included.
    pub fn decode_tile(&self, row_block: usize, col_block: usize) -> Vec<f32> {
        let mut out = [0f32; TILE_ROWS * TILE_COLS];
        decode_tile(self.tile(row_block, col_block), self.kind, &mut out);
        out.to_vec()
    }

    /// Decodes rows `rows` (logical, unpadded) to a row-major `rows.len() x K` matrix.
    ///
    /// # Panics
    /// If the range is outside `0..N`.
    pub fn decode_rows(&self, rows: std::ops::Range<usize>) -> Vec<f32> {
        assert!(rows.start <= rows.end && rows.end <= self.grid.rows);
        let k = self.grid.cols;
        let mut out = vec![0f32; rows.len() * k];
        let mut tile_buf = [0f32; TILE_ROWS * TILE_COLS];
        if rows.is_empty() {
            return out;
        }
        for rb in rows.start / TILE_ROWS..rows.end.div_ceil(TILE_ROWS) {
            for cb in 0..self.grid.col_blocks() {
                decode_tile(self.tile(rb, cb), self.kind, &mut tile_buf);
                let c0 = cb * TILE_COLS;
                let width = TILE_COLS.min(k - c0);
                for r in 0..TILE_ROWS {
                    let row = rb * TILE_ROWS + r;
                    if row < rows.start || row >= rows.end {
                        continue;
                    }
                    let dst = (row - rows.start) * k + c0;
                    out[dst..dst + width]
                        .copy_from_slice(&tile_buf[r * TILE_COLS..r * TILE_COLS + width]);
                }
            }
        }
        out
    }

    /// Decodes the whole matrix to row-major N x K.
    pub fn decode(&self) -> Vec<f32> {
        self.decode_rows(0..self.grid.rows)
    }

    /// Element (row, col), decoded on its own.
    pub fn get(&self, row: usize, col: usize) -> f32 {
        let tile = self.tile(row / TILE_ROWS, col / TILE_COLS);
        let (r, c) = (row % TILE_ROWS, col % TILE_COLS);
        let s = (c / GROUP_COLS) * TILE_ROWS + r;
        let d = read_bf16(tile, 2 * s);
        let (byte, shift) = nibble_position(r, c);
        let nib = (tile[byte] >> shift) & 0x0f;
        match self.kind {
            Q4Kind::Q4_1 => d * nib as f32 + read_bf16(tile, MIN_OFFSET + 2 * s),
            Q4Kind::Q4_0 => d * ((nib ^ 8) as i32 - 8) as f32 + 0.0,
        }
    }
}

/// One group's q4_1 parameters as stored in a tile: bf16 scale and min, 32 codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4Group {
    /// Scale (BF16).
    pub d: bf16,
    /// Minimum (BF16): value = d · q + m.
    pub m: bf16,
    /// The 32 codes, 0..=15.
    pub q: [u8; GROUP_COLS],
}

/// Quantizes one group of up to 32 values with the tile rule: `m = bf16(min)`,
/// `d = bf16((max - m) / 15)`, `q = clamp(round_half_even((w - m) / d), 0, 15)`.
///
/// Quantizing against the stored (bf16) `d` and `m` makes the round trip exact for
/// any group that is already of the form `f32(d) * q + f32(m)` with both 0 and 15
/// among its codes. Missing values (a short last group) are treated as padding and
/// do not enter min/max.
pub fn quantize_group(values: &[f32]) -> Q4Group {
    let mut q = [0u8; GROUP_COLS];
    if values.is_empty() {
        return Q4Group {
            d: bf16::ZERO,
            m: bf16::ZERO,
            q,
        };
    }
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let m = bf16::from_f32(lo);
    let mf = m.to_f32();
    let d = bf16::from_f32((hi - mf) / 15.0);
    let df = d.to_f32();
    for (qi, &v) in q.iter_mut().zip(values) {
        *qi = if df > 0.0 {
            ((v - mf) / df).round_ties_even().clamp(0.0, 15.0) as u8
        } else {
            0
        };
    }
    Q4Group { d, m, q }
}

/// Builds tile bytes for an N x K matrix, one group at a time.
///
/// The builder owns the zero-filled tile buffer; padding stays zero.
pub struct TileBuilder {
    grid: TileGrid,
    bytes: Vec<u8>,
}

impl TileBuilder {
    /// A zeroed tile buffer for `rows` x `cols`.
    pub fn new(rows: usize, cols: usize) -> Result<TileBuilder> {
        let grid = TileGrid { rows, cols };
        let len = grid.byte_len().ok_or_else(|| FormatError::Writer {
            message: format!("a {rows} x {cols} tile grid overflows"),
        })?;
        Ok(TileBuilder {
            grid,
            bytes: vec![0u8; len],
        })
    }

    /// Stores group `group` (column `group * 32 ..`) of row `row`.
    ///
    /// # Panics
    /// If the row or group lies outside the grid.
    pub fn set_group(&mut self, row: usize, group: usize, g: &Q4Group) {
        let col0 = group * GROUP_COLS;
        assert!(row < self.grid.rows && col0 < self.grid.cols);
        let (rb, cb) = (row / TILE_ROWS, col0 / TILE_COLS);
        let base = (rb * self.grid.col_blocks() + cb) * TILE_BYTES;
        let tile = &mut self.bytes[base..base + TILE_BYTES];
        let r = row % TILE_ROWS;
        let gi = (col0 % TILE_COLS) / GROUP_COLS;
        let s = gi * TILE_ROWS + r;
        tile[2 * s..2 * s + 2].copy_from_slice(&g.d.to_le_bytes());
        tile[MIN_OFFSET + 2 * s..MIN_OFFSET + 2 * s + 2].copy_from_slice(&g.m.to_le_bytes());
        for (i, &q) in g.q.iter().enumerate() {
            let (byte, shift) = nibble_position(r, gi * GROUP_COLS + i);
            tile[byte] = (tile[byte] & !(0x0f << shift)) | ((q & 0x0f) << shift);
        }
    }

    /// The finished tile bytes (`I8 [tiles, 5120]`).
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Encodes a row-major N x K `f32` matrix into q4_1 tiles with [`quantize_group`].
///
/// # Panics
/// If `values.len() != rows * cols`.
pub fn encode_q4_1(values: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
    assert_eq!(values.len(), rows * cols, "values must be rows x cols");
    let mut builder = TileBuilder::new(rows, cols)?;
    for r in 0..rows {
        let row = &values[r * cols..(r + 1) * cols];
        for (g, chunk) in row.chunks(GROUP_COLS).enumerate() {
            builder.set_group(r, g, &quantize_group(chunk));
        }
    }
    Ok(builder.finish())
}
