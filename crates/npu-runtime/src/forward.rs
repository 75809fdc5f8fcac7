//! The interface between the speculative loop and backends.

use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::model::TargetConfig;

/// Rows of tap features: one row of `taps × hidden` f32 per position a pass ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TapRows {
    width: usize,
    data: Vec<f32>,
}

impl TapRows {
    /// An empty sink for rows of `width` values.
    pub fn new(width: usize) -> TapRows {
        TapRows {
            width,
            data: Vec::new(),
        }
    }
    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }
    /// Number of rows held.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }
    /// Rows `range` as one slice.
    pub fn rows_slice(&self, range: std::ops::Range<usize>) -> &[f32] {
        &self.data[range.start * self.width..range.end * self.width]
    }
    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.data.truncate(rows * self.width);
    }
    /// Appends one row.
    pub fn push_row(&mut self, row: &[f32]) {
        assert_eq!(row.len(), self.width, "tap row width");
        self.data.extend_from_slice(row);
    }
}

/// Shared between the target (which appends) and a drafter (which reads and trims).
pub type TapSink = Arc<Mutex<TapRows>>;

/// What every backend's `set_layer_taps` checks first: the layers exist, and the sink
/// holds rows of the new width (an empty sink is re-shaped; one holding rows of
/// another width is refused).
pub(crate) fn check_taps(config: &TargetConfig, layers: &[usize], sink: &TapSink) -> Result<()> {
    if let Some(&bad) = layers.iter().find(|&&l| l >= config.num_layers) {
        return Err(crate::TargetError::TapLayer {
            layer: bad,
            layers: config.num_layers,
        });
    }
    let width = layers.len() * config.hidden_size;
    let mut s = sink.lock().expect("tap sink lock poisoned");
    if s.width() != width {
        if s.rows() > 0 {
            return Err(crate::TargetError::Unsupported(format!(
                "tap sink holds rows of width {}, but {} taps of hidden {} make {width}",
                s.width(),
                layers.len(),
                config.hidden_size
            )));
        }
        *s = TapRows::new(width);
    }
    Ok(())
}

/// A target model run by some backend.
///
/// Positions: after `forward` of n tokens from position `p`, the cache holds `p + n`
/// positions; `truncate(len)` rolls it back to exactly `len`.
pub trait Forward {
    /// The model's configuration.
    fn config(&self) -> &TargetConfig;
    /// Committed positions in the KV cache.
    fn position(&self) -> usize;
    /// Runs `tokens` at positions `position() ..`, appends them to the cache and
    /// returns logits for every one of them (`tokens.len() × vocab`, row-major).
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// [`Forward::forward`] when only the last token's logits are wanted (a prefill):
    /// returns `vocab` values (none for no tokens). The cache, taps and hidden rows are
    /// as after `forward`; backends that can skip the head for the other rows do.
    fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut logits = self.forward(tokens)?;
        let vocab = self.config().vocab_size;
        logits.drain(..logits.len().saturating_sub(vocab));
        Ok(logits)
    }
    /// A prefill in chunks of at most `chunk` tokens (bounded activation and attention
    /// memory), with `cancel` checked before each chunk: the last token's logits, as
    /// [`Forward::forward_last`] of the whole prompt gives them, bit for bit, whatever
    /// the chunk size (every kernel is batch-invariant). If `cancel` is set, returns
    /// [`TargetError::Cancelled`](crate::TargetError::Cancelled); the cache then holds
    /// the chunks already run (`position()`; `truncate` rolls them back).
    fn prefill(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<Vec<f32>> {
        self.prefill_with(tokens, chunk, &mut |_| {
            !cancel.load(std::sync::atomic::Ordering::Relaxed)
        })
    }
    /// [`Forward::prefill`] with a callback instead of a flag: `go_on(position)` is asked
    /// before each chunk (the cache holds `position` positions then) and the prefill
    /// stops with [`TargetError::Cancelled`](crate::TargetError::Cancelled) when it says no.
    fn prefill_with(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        go_on: &mut dyn FnMut(usize) -> bool,
    ) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        for part in tokens.chunks(chunk.max(1)) {
            let position = self.position();
            if !go_on(position) {
                return Err(crate::TargetError::Cancelled { position });
            }
            logits = self.forward_last(part)?;
        }
        Ok(logits)
    }
    /// The final-normed hidden rows of the last pass (`n × hidden`).
    fn last_hidden(&self) -> &[f32];
    /// Rolls the KV cache back to `len` positions.
    fn truncate(&mut self, len: usize) -> Result<()>;
    /// From now on every pass appends to `sink` one row per position: the
    /// concatenation, in the given order, of `hidden_states[layer + 1]` (the residual
    /// stream after that layer; for the last layer, the final-normed state, as
    /// transformers returns it). Rejected verify rows are written too: trimming is
    /// the caller's job.
    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> Result<()>;
    /// Stops writing tap rows.
    fn clear_layer_taps(&mut self);
    /// Embedding rows of `tokens` (`tokens.len() × hidden`).
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Logits of final-normed hidden rows (`n × hidden` → `n × vocab`).
    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32>;
}
