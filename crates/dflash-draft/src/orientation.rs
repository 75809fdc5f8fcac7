//! Which way round is the fusion matrix stored? Judged from the weights' own
//! statistics: the correlation of log-magnitudes between neighbours one and 32 rows
//! apart, and one and 32 columns apart, in the declared reading and in a plain
//! row-major reading of the same bytes. In the right reading the two row figures agree
//! with each other and so do the two column figures; a wrong reading mixes rows and
//! columns inside 32-element runs, so its figures contradict each other. Only this
//! agreement pattern is used, never particular numbers, so the check carries over to
//! other packages.

use half::bf16;

use crate::error::Result;
use crate::package::DraftModel;

/// The correlations of one reading: `[next row, 32 rows on, next column, 32 columns on]`.
pub type Figures = [f64; 4];

/// Both readings and the verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Orientation {
    /// Figures of the declared (block-column) reading.
    pub declared: Figures,
    /// Figures of a plain row-major reading of the same bytes.
    pub plain: Figures,
}

/// Whether two neighbour correlations tell the same story.
fn agree(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.25 * a.abs().max(b.abs()) + 0.04
}

fn consistent(f: &Figures) -> bool {
    agree(f[0], f[1]) && agree(f[2], f[3])
}

impl Orientation {
    /// The declared reading's row figures agree and its column figures agree.
    pub fn declared_consistent(&self) -> bool {
        consistent(&self.declared)
    }
    /// The plain reading is self-consistent too (then the statistics cannot tell).
    pub fn plain_consistent(&self) -> bool {
        consistent(&self.plain)
    }
    /// The declared order is the right one: it agrees and the plain reading contradicts itself.
    pub fn confirms_declared_order(&self) -> bool {
        self.declared_consistent() && !self.plain_consistent()
    }
}

/// Pearson correlation of `log|W|` between element (r, c) and (r + dr, c + dc).
fn neighbour_correlation(logs: &[f64], rows: usize, cols: usize, dr: usize, dc: usize) -> f64 {
    let (mut n, mut sx, mut sy, mut sxx, mut syy, mut sxy) = (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for r in 0..rows.saturating_sub(dr) {
        for c in 0..cols.saturating_sub(dc) {
            let (x, y) = (logs[r * cols + c], logs[(r + dr) * cols + c + dc]);
            n += 1.0;
            sx += x;
            sy += y;
            sxx += x * x;
            syy += y * y;
            sxy += x * y;
        }
    }
    let cov = sxy / n - (sx / n) * (sy / n);
    let var = (sxx / n - (sx / n).powi(2)) * (syy / n - (sy / n).powi(2));
    if var <= 0.0 {
        0.0
    } else {
        cov / var.sqrt()
    }
}

fn figures(values: impl Iterator<Item = f32>, rows: usize, cols: usize) -> Figures {
    let logs: Vec<f64> = values.map(|v| (v.abs() as f64 + 1e-12).ln()).collect();
    [
        neighbour_correlation(&logs, rows, cols, 1, 0),
        neighbour_correlation(&logs, rows, cols, 32, 0),
        neighbour_correlation(&logs, rows, cols, 0, 1),
        neighbour_correlation(&logs, rows, cols, 0, 32),
    ]
}

/// Computes both readings of the draft's fusion matrix.
pub fn fusion_orientation(draft: &DraftModel) -> Result<Orientation> {
    let (h, w) = (draft.config.hidden_size, draft.config.context_width());
    let declared = figures(draft.decode_fusion()?.into_iter(), h, w);
    let stored = draft.fusion_stored()?;
    let plain = figures(
        stored
            .chunks_exact(2)
            .map(|p| bf16::from_le_bytes([p[0], p[1]]).to_f32()),
        h,
        w,
    );
    Ok(Orientation { declared, plain })
}
