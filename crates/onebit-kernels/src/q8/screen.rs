//! The screened int8 head: a large vocabulary's logits from the cheap q4 tiles, with the
//! exact int8 logits of the best few rows.
//!
//! A head of 262144 rows (Gemma 3) is most of a decode pass's bytes: 189 MB as the int8
//! copy of the embedding, 105 MB as q4 tiles. The tiles alone lose 5% of perplexity; an
//! exact screen (tiles, then the int8 rows whose bound reaches the best) cannot prune:
//! the worst-case bound of a 640-long dot product is ±9–11 logits against a spread of
//! about 4.7 (measured on Gemma 3 270M: 1,000–58,000 candidates a token). So the screened
//! head is its own arithmetic, defined here and in [`super::reference::screened_row`]:
//! for input row `i`,
//! ```text
//! s[r]  = the q4 tiles' output for row r, one activation level   (every r < rows)
//! C     = the `m` rows of largest s[r] (ties to the lower index; NaN counts as -inf)
//! y[r]  = the int8 matrix's output for row r at x's levels        (r in C)
//! y[r]  = s[r]                                                     (otherwise)
//! ```
//! Each term is the family's own arithmetic, so every ISA gives the same bits, and a
//! row's candidates and logits depend on that row alone: batched passes equal
//! single-row passes. A greedy pick is the int8 head's wherever its best row is among
//! the screen's best `m`; sampling and log-probabilities see exact logits for the rows
//! that carry the probability mass. It reads the tiles plus `m` int8 blocks a row.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{I8Matrix, PackedQ4, QuantizedRows, I8_BLOCK_ROWS};
use crate::isa::Isa;

/// A row's screen value and index, ordered worst first: a lower value, or the same
/// value at a higher index, is greater (so a max-heap's top is the worst kept).
#[derive(Clone, Copy, Debug)]
struct Ranked {
    value: f32,
    index: usize,
}

impl Ranked {
    fn new(value: f32, index: usize) -> Ranked {
        // NaN ranks as -inf, and -0 as +0 (they compare equal, so the index decides).
        let value = if value.is_nan() {
            f32::NEG_INFINITY
        } else {
            value + 0.0
        };
        Ranked { value, index }
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Ranked) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Ranked) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Ranked) -> Ordering {
        other
            .value
            .total_cmp(&self.value)
            .then(self.index.cmp(&other.index))
    }
}

/// The indices of the `m` largest `values` (ties to the lower index; NaN counts as
/// -inf), in increasing index order. All of them when there are at most `m`.
pub fn top_rows(values: &[f32], m: usize) -> Vec<usize> {
    if m == 0 {
        return Vec::new();
    }
    let mut kept: BinaryHeap<Ranked> = BinaryHeap::with_capacity(m + 1);
    // Once `m` are kept, a value at most the worst kept one cannot enter: every kept
    // index is lower than the ones still to come, so a tie stays out too. This one
    // comparison is all most of a 262144-row vocabulary costs (NaN fails it and takes
    // the ranked comparison, which puts it below every number).
    let mut worst = f32::NEG_INFINITY;
    for (index, &value) in values.iter().enumerate() {
        if kept.len() == m && value <= worst {
            continue;
        }
        let candidate = Ranked::new(value, index);
        if kept.len() < m {
            kept.push(candidate);
        } else if kept.peek().is_some_and(|w| candidate < *w) {
            kept.pop();
            kept.push(candidate);
        } else {
            continue;
        }
        if kept.len() == m {
            worst = kept.peek().map_or(f32::NEG_INFINITY, |w| w.value);
        }
    }
    let mut rows: Vec<usize> = kept.into_iter().map(|r| r.index).collect();
    rows.sort_unstable();
    rows
}

/// The screened head's logits: `x.rows() × int8.rows()` values, by the arithmetic in the
/// module documentation. `x_screen` is the same input rows at one level (the screen's),
/// `x` at the int8 head's levels; `m` candidates per row.
///
/// # Panics
/// If the tiles have fewer rows than `int8` or other columns, or `x_screen` and `x` hold
/// different rows.
pub fn matmul_screened(
    tiles: &PackedQ4,
    int8: &I8Matrix,
    x_screen: &QuantizedRows,
    x: &QuantizedRows,
    m: usize,
    isa: Isa,
) -> Vec<f32> {
    let rows = int8.rows();
    assert!(
        tiles.stride() >= rows && tiles.cols() == int8.cols(),
        "q8: the screen's tiles ({} × {}) do not cover the int8 matrix ({rows} × {})",
        tiles.stride(),
        tiles.cols(),
        int8.cols()
    );
    assert_eq!(
        x_screen.rows(),
        x.rows(),
        "q8: screen and head inputs differ"
    );
    let n = x.rows();
    let stride = tiles.stride();
    let mut screen = vec![0f32; n * stride];
    super::matmul_q4(tiles, x_screen, &mut screen, isa);
    let candidates: Vec<Vec<usize>> = (0..n)
        .map(|i| top_rows(&screen[i * stride..i * stride + rows], m))
        .collect();
    let mut blocks: Vec<usize> = candidates
        .iter()
        .flatten()
        .map(|&r| r / I8_BLOCK_ROWS)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    let exact = super::matmul_i8_blocks(int8, x, &blocks, isa);
    let width = blocks.len() * I8_BLOCK_ROWS;
    // The screen's rows become the logits in place (rows of `rows`, not `stride`).
    let mut y = screen;
    for i in 1..n {
        y.copy_within(i * stride..i * stride + rows, i * rows);
    }
    y.truncate(n * rows);
    for (i, own) in candidates.iter().enumerate() {
        // Only this row's own candidates: another row's blocks are computed too, but a
        // row's logits must not depend on its neighbours.
        for &r in own {
            let at = blocks
                .binary_search(&(r / I8_BLOCK_ROWS))
                .expect("every candidate's block is computed");
            y[i * rows + r] = exact[i * width + at * I8_BLOCK_ROWS + r % I8_BLOCK_ROWS];
        }
    }
    y
}
