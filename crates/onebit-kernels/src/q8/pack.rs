//! Weight packing for the q8 family, done once at load: q4 tiles into [`PackedQ4`]'s
//! dot-product order (several matrices of the same K stacked) and the int8 head into
//! [`I8Matrix`]'s blocks.

use std::ops::Range;
use std::sync::Arc;

use half::bf16;
use q4nx_format::{Q4Kind, Q4Matrix, TILE_ROWS};
use rayon::prelude::*;

use super::{quantize_group, BLOCK_ROWS, GROUP, I8_BLOCK_ROWS, I8_GROUP_BYTES, Q4_GROUP_BYTES};
use crate::pages::WeightBytes;

/// q4 weights repacked for integer dot products, optionally several matrices of the same
/// K stacked into one (q, k and v; gate and up), so one parallel region computes them all.
///
/// Block `b` (32 rows), group `g` (32 columns) is [`Q4_GROUP_BYTES`] bytes at
/// `(b · groups + g) · Q4_GROUP_BYTES`: for half `h` (rows 16h..16h+16) and quad `q`,
/// 64 bytes at `(4h + q) · 64` hold, for lane `j` (row 16h + j), bytes `4j + t` =
/// `code(col 8q + t) | code(col 8q + 4 + t) << 4`; then 32 bf16 scales `d`, then 32 bf16
/// mins `m`. A q4_0 source is stored as unsigned codes `c ^ 8` with `m = -8d` (the same
/// values). Rows past a part's end are zero codes with zero scale and min.
#[derive(Clone, Debug)]
pub struct PackedQ4 {
    k: usize,
    blocks: usize,
    /// `(rows, first block)` of each stacked matrix.
    parts: Vec<(usize, usize)>,
    /// The buffer this matrix shares with the others packed with it ([`stack_many`]),
    /// and where its bytes are in it.
    ///
    /// [`stack_many`]: PackedQ4::stack_many
    buffer: Arc<WeightBytes>,
    range: Range<usize>,
}

/// The shape of one stack: K, blocks, each part's `(rows, first block)`, bytes.
pub(super) struct StackLayout {
    k: usize,
    blocks: usize,
    parts: Vec<(usize, usize)>,
    bytes: usize,
}

impl StackLayout {
    /// # Panics
    /// If the matrices' K differ, K is not a multiple of 32, or the list is empty.
    fn of(parts: &[&Q4Matrix]) -> StackLayout {
        assert!(!parts.is_empty(), "q8: nothing to pack");
        let k = parts[0].cols();
        assert_eq!(k % GROUP, 0, "q8: K must be a multiple of 32, got {k}");
        let mut layout = Vec::new();
        let mut blocks = 0;
        for w in parts {
            assert_eq!(w.cols(), k, "q8: stacked matrices must share K");
            layout.push((w.rows(), blocks));
            blocks += w.rows().div_ceil(BLOCK_ROWS);
        }
        StackLayout {
            k,
            blocks,
            parts: layout,
            bytes: blocks * (k / GROUP) * Q4_GROUP_BYTES,
        }
    }

    /// Packs `parts` (this layout's matrices) into `data` (`self.bytes` zero bytes).
    fn pack(&self, parts: &[&Q4Matrix], data: &mut [u8]) {
        let groups = self.k / GROUP;
        data.par_chunks_mut(groups * Q4_GROUP_BYTES)
            .enumerate()
            .for_each(|(b, out)| {
                let (part, &(rows, first)) = self
                    .parts
                    .iter()
                    .enumerate()
                    .rev()
                    .find(|(_, &(_, first))| first <= b)
                    .expect("block belongs to a part");
                let w = parts[part];
                let rb = b - first;
                for (g, dst) in out.chunks_exact_mut(Q4_GROUP_BYTES).enumerate() {
                    pack_q4_group(w, rows, rb, g, dst);
                }
            });
    }
}

impl PackedQ4 {
    /// Repacks one matrix.
    pub fn new(w: &Q4Matrix) -> PackedQ4 {
        Self::stack(&[w])
    }

    /// Repacks matrices of the same K into one, each starting on a 32-row block.
    ///
    /// # Panics
    /// If the matrices' K differ, K is not a multiple of 32, or the list is empty.
    pub fn stack(parts: &[&Q4Matrix]) -> PackedQ4 {
        Self::stack_many(&[parts]).remove(0)
    }

    /// Repacks each list of `stacks` as [`PackedQ4::stack`] does, all into one buffer,
    /// so that a model's projections (0.4–1.1 MB each for SmolLM2) share huge pages
    /// ([`WeightBytes`]) that none of them would fill alone. Each gets the bytes
    /// `stack` would give it.
    ///
    /// # Panics
    /// As [`PackedQ4::stack`], for any of the lists.
    pub fn stack_many(stacks: &[&[&Q4Matrix]]) -> Vec<PackedQ4> {
        let layouts: Vec<StackLayout> = stacks.iter().map(|parts| StackLayout::of(parts)).collect();
        let mut buffer = WeightBytes::zeroed(layouts.iter().map(|l| l.bytes).sum());
        let mut ranges = Vec::with_capacity(layouts.len());
        {
            let mut rest: &mut [u8] = &mut buffer;
            let mut slices = Vec::with_capacity(layouts.len());
            for l in &layouts {
                let at = ranges.last().map_or(0, |r: &Range<usize>| r.end);
                ranges.push(at..at + l.bytes);
                let (mine, after) = std::mem::take(&mut rest).split_at_mut(l.bytes);
                slices.push(mine);
                rest = after;
            }
            slices
                .into_par_iter()
                .zip(layouts.par_iter().zip(stacks))
                .for_each(|(data, (layout, parts))| layout.pack(parts, data));
        }
        let buffer = Arc::new(buffer);
        layouts
            .into_iter()
            .zip(ranges)
            .map(|(l, range)| PackedQ4 {
                k: l.k,
                blocks: l.blocks,
                parts: l.parts,
                buffer: buffer.clone(),
                range,
            })
            .collect()
    }

    /// A model's layers packed into one buffer by [`PackedQ4::stack_many`]:
    /// `stacks_of(layer)` names the layer's `N` stacks, and each layer gets its `N`
    /// packed stacks back, in that order.
    pub fn stack_layers<'m, L, const N: usize>(
        layers: &'m [L],
        stacks_of: impl Fn(&'m L) -> [Vec<&'m Q4Matrix<'m>>; N],
    ) -> Vec<[PackedQ4; N]> {
        let stacks: Vec<[Vec<&Q4Matrix>; N]> = layers.iter().map(stacks_of).collect();
        let lists: Vec<&[&Q4Matrix]> = stacks.iter().flatten().map(Vec::as_slice).collect();
        let mut packed = Self::stack_many(&lists).into_iter();
        stacks
            .iter()
            .map(|_| std::array::from_fn(|_| packed.next().expect("N stacks a layer")))
            .collect()
    }

    /// Columns (K).
    pub fn cols(&self) -> usize {
        self.k
    }
    /// Output values per input row: 32 per block (parts padded to whole blocks).
    pub fn stride(&self) -> usize {
        self.blocks * BLOCK_ROWS
    }
    /// Where part `p`'s rows start in an output row, and how many there are.
    pub fn part(&self, p: usize) -> std::ops::Range<usize> {
        let (rows, first) = self.parts[p];
        first * BLOCK_ROWS..first * BLOCK_ROWS + rows
    }
    /// Bytes of packed weights (what one pass streams).
    pub fn byte_len(&self) -> usize {
        self.range.len()
    }
    pub(crate) fn group_bytes(&self, block: usize, g: usize) -> &[u8] {
        let at = (block * (self.k / GROUP) + g) * Q4_GROUP_BYTES;
        &self.data()[at..at + Q4_GROUP_BYTES]
    }
    pub(crate) fn data(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }
}

pub(super) fn pack_q4_group(w: &Q4Matrix, rows: usize, rb: usize, g: usize, dst: &mut [u8]) {
    let tile = w.tile(rb, g * GROUP / q4nx_format::TILE_COLS);
    let gi = (g * GROUP % q4nx_format::TILE_COLS) / GROUP;
    let nib = |r: usize, c: usize| -> u8 {
        let col = gi * GROUP + c;
        let byte = tile[q4nx_format::NIBBLE_OFFSET
            + (r / 16) * (q4nx_format::TILE_COLS * 8)
            + col * 8
            + (r % 16) / 2];
        let v = if r % 2 == 1 { byte >> 4 } else { byte & 0x0f };
        match w.kind() {
            Q4Kind::Q4_1 => v,
            Q4Kind::Q4_0 => v ^ 8,
        }
    };
    for r in 0..BLOCK_ROWS {
        if rb * BLOCK_ROWS + r >= rows {
            break; // padding rows stay zero: zero codes, zero scale, zero min
        }
        let (h, j) = (r / 16, r % 16);
        for q in 0..4 {
            for t in 0..4 {
                let lo = nib(r, 8 * q + t);
                let hi = nib(r, 8 * q + 4 + t);
                dst[(4 * h + q) * 64 + 4 * j + t] = lo | (hi << 4);
            }
        }
        let s = gi * TILE_ROWS + r;
        let d = [tile[2 * s], tile[2 * s + 1]];
        let m = match w.kind() {
            Q4Kind::Q4_1 => [
                tile[q4nx_format::MIN_OFFSET + 2 * s],
                tile[q4nx_format::MIN_OFFSET + 2 * s + 1],
            ],
            // -8·d is exact in bf16 (an exponent shift and a sign).
            Q4Kind::Q4_0 => bf16::from_f32(-8.0 * bf16::from_le_bytes(d).to_f32()).to_le_bytes(),
        };
        dst[512 + 2 * r..512 + 2 * r + 2].copy_from_slice(&d);
        dst[576 + 2 * r..576 + 2 * r + 2].copy_from_slice(&m);
    }
}

/// A dense matrix quantized to int8 per row and 32-column group (the tied head's
/// embedding), packed in 16-row blocks: block `b`, group `g` is [`I8_GROUP_BYTES`]
/// bytes: for quad `q` (columns 4q..4q+4), 64 bytes with lane `j` (row 16b + j) at
/// `4j..4j+4`; then 16 f32 scales.
#[derive(Clone, Debug)]
pub struct I8Matrix {
    rows: usize,
    k: usize,
    data: WeightBytes,
}

impl I8Matrix {
    /// Quantizes a row-major BF16 matrix (`rows × k` little-endian values).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `w` is not `rows × k` BF16 values.
    pub fn from_bf16(w: &[u8], rows: usize, k: usize) -> I8Matrix {
        assert_eq!(k % GROUP, 0, "q8: K must be a multiple of 32, got {k}");
        assert_eq!(w.len(), rows * k * 2, "q8: BF16 matrix is not rows × K");
        let groups = k / GROUP;
        let blocks = rows.div_ceil(I8_BLOCK_ROWS);
        let mut data = WeightBytes::zeroed(blocks * groups * I8_GROUP_BYTES);
        data.par_chunks_mut(groups * I8_GROUP_BYTES)
            .enumerate()
            .for_each(|(b, out)| {
                let mut values = [0f32; GROUP];
                let mut codes = [0i8; GROUP];
                for j in 0..I8_BLOCK_ROWS {
                    let row = b * I8_BLOCK_ROWS + j;
                    if row >= rows {
                        break;
                    }
                    for (g, dst) in out.chunks_exact_mut(I8_GROUP_BYTES).enumerate() {
                        for (c, v) in values.iter_mut().enumerate() {
                            let at = 2 * (row * k + g * GROUP + c);
                            *v = bf16::from_le_bytes([w[at], w[at + 1]]).to_f32();
                        }
                        let d = quantize_group(&values, &mut codes);
                        for q in 0..GROUP / 4 {
                            for t in 0..4 {
                                dst[q * 64 + 4 * j + t] = codes[4 * q + t] as u8;
                            }
                        }
                        dst[512 + 4 * j..512 + 4 * j + 4].copy_from_slice(&d.to_le_bytes());
                    }
                }
            });
        I8Matrix { rows, k, data }
    }

    /// Rows (outputs per input row).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns.
    pub fn cols(&self) -> usize {
        self.k
    }
    /// Bytes of packed weights.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }
    pub(crate) fn group_bytes(&self, block: usize, g: usize) -> &[u8] {
        let at = (block * (self.k / GROUP) + g) * I8_GROUP_BYTES;
        &self.data[at..at + I8_GROUP_BYTES]
    }
    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }
}
