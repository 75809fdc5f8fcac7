//! `DFlashHead`: a DFlash draft as a [`DraftHead`].
//!
//! It reads the target's tap sink (one row of `taps x hidden` per position a pass ran,
//! rejected verify rows included). At `draft()` it folds the sink rows its
//! [`DraftKvCache`] does not hold yet — only committed ones, since the sink was trimmed
//! after every verify — and drafts the block `[last token, mask, ...]` with the cached
//! draft forward, scoring only the k rows the round asks for with the target's head (a
//! DFlash 2 draft's picks are its candidate selector's walk over those rows' soft-capped
//! head logits, which the hooks' `logits` give).
//! `commit_rows(m)` trims the sink back to its size at `draft()` time plus the `m`
//! positions the round kept; after a plain step there is nothing to trim.

use dflash_draft::{draft_block, DraftHooks, DraftKvCache, DraftOutput, DraftWeights};
use npu_runtime::TapSink;

use crate::head::DraftHead;

/// A DFlash draft head.
pub struct DFlashHead<'w, 'a> {
    weights: &'w DraftWeights<'a>,
    hooks: Box<dyn DraftHooks + 'w>,
    sink: TapSink,
    cache: DraftKvCache,
    /// Sink rows at the last `draft()`, until its round is committed.
    mark: Option<usize>,
    error: Option<String>,
    last_output: Option<DraftOutput>,
}

impl<'w, 'a> DFlashHead<'w, 'a> {
    /// A head over `weights`, reading `sink` (which the target writes through
    /// `set_layer_taps(&config.target_layer_ids, sink)`), embedding and scoring with `hooks`.
    pub fn new(
        weights: &'w DraftWeights<'a>,
        hooks: Box<dyn DraftHooks + 'w>,
        sink: TapSink,
    ) -> DFlashHead<'w, 'a> {
        DFlashHead {
            cache: DraftKvCache::for_weights(weights),
            weights,
            hooks,
            sink,
            mark: None,
            error: None,
            last_output: None,
        }
    }

    /// The full output of the last draft (for checks against a scratch forward).
    pub fn last_output(&self) -> Option<&DraftOutput> {
        self.last_output.as_ref()
    }

    /// Marks a round another drafter proposed (a chained drafter's lookup round): its
    /// verify pass's rejected tap rows are trimmed at `commit_rows`, as after a round
    /// of this head's own.
    pub fn mark_round(&mut self) {
        self.mark = Some(self.sink.lock().expect("tap sink lock poisoned").rows());
    }

    /// Committed positions folded into the draft cache.
    pub fn cached_rows(&self) -> usize {
        self.cache.len()
    }
}

impl DraftHead for DFlashHead<'_, '_> {
    fn needs_last_hidden(&self) -> bool {
        false
    }

    fn draft(&mut self, pos: usize, last_token: u32, k: usize) -> Option<Vec<u32>> {
        self.error = None;
        let c = &self.weights.config;
        let (rows, new_rows) = {
            let sink = self.sink.lock().expect("tap sink lock poisoned");
            let rows = sink.rows();
            // A sink of `rows` rows holds positions 0..rows; the last token runs at
            // `rows`, so its drafts start at rows + 1.
            if pos != rows + 1 {
                self.error = Some(format!(
                    "drafting at position {pos} over {rows} committed rows"
                ));
                return None;
            }
            let folded = self.cache.len().min(rows);
            (rows, sink.rows_slice(folded..rows).to_vec())
        };
        let n_new = rows - self.cache.len().min(rows);
        let mut block = vec![last_token];
        block.extend(std::iter::repeat_n(c.mask_token_id, c.block_size - 1));
        // Only the k rows the round verifies are scored with the target's head.
        match draft_block(
            self.weights,
            &mut self.cache,
            &new_rows,
            n_new,
            &block,
            rows,
            self.hooks.as_ref(),
            k,
        ) {
            Ok(out) => {
                self.mark = Some(rows);
                let drafts = out.tokens.clone();
                self.last_output = Some(out);
                Some(drafts)
            }
            Err(e) => {
                self.error = Some(e.to_string());
                None
            }
        }
    }

    fn commit_rows(&mut self, m: usize) {
        if let Some(mark) = self.mark.take() {
            self.sink
                .lock()
                .expect("tap sink lock poisoned")
                .truncate(mark + m);
        }
    }

    fn reset(&mut self) {
        self.cache = DraftKvCache::for_weights(self.weights);
        self.mark = None;
        self.error = None;
    }

    fn error(&self) -> Option<String> {
        self.error.clone()
    }

    fn proposer(&self) -> &'static str {
        "dflash"
    }
}
