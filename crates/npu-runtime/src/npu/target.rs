//! [`NpuTarget`]: the [`Forward`] trait over a device running a [`DispatchPlan`].

use super::device::Device;
use super::pack;
use super::plan::{BufferRole, DispatchPlan, PassArgs, PlanOptions};
use crate::error::{Result, TargetError};
use crate::forward::{Forward, TapSink};
use crate::model::HeadKind;
use crate::model::{TargetConfig, TargetPackage, TargetWeights};

/// A target model on a device.
pub struct NpuTarget<'a, D: Device> {
    config: TargetConfig,
    weights: TargetWeights<'a>,
    device: D,
    plan: DispatchPlan,
    position: usize,
    sink: Option<TapSink>,
    last_hidden: Vec<f32>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

impl<'a, D: Device> NpuTarget<'a, D> {
    /// Builds the plan for `package`, allocates it on `device` and uploads the packed
    /// weights.
    pub fn new(package: &'a TargetPackage, device: D, options: PlanOptions) -> Result<Self> {
        let config = package.config.clone();
        if matches!(options.head, HeadKind::EmbeddingInt8 | HeadKind::Screened) {
            return Err(TargetError::Unsupported(
                "the NPU plan has no int8 or screened head (the q8 family runs on the CPU backend); \
                 use the embedding or the tiles"
                    .into(),
            ));
        }
        if options.head == HeadKind::Embedding && !config.tie_word_embeddings {
            return Err(TargetError::Unsupported(
                "the embedding can only serve as the head of a model with tie_word_embeddings"
                    .into(),
            ));
        }
        let weights = package.weights()?;
        let mut target = NpuTarget {
            plan: DispatchPlan::build(&config, &options)?,
            config,
            weights,
            device,
            position: 0,
            sink: None,
            last_hidden: Vec::new(),
        };
        target.load_plan()?;
        Ok(target)
    }

    /// (Re)allocates the plan's buffers and uploads weights; KV content is lost, so
    /// this only runs on an empty cache.
    fn load_plan(&mut self) -> Result<()> {
        let ops: Vec<_> = self.plan.steps.iter().map(|s| s.op.clone()).collect();
        self.device.allocate(&self.plan.buffers, &ops)?;
        for (id, spec) in self.plan.buffers.iter().enumerate() {
            if spec.role == BufferRole::Weights {
                let bytes = pack::pack(
                    &self.config,
                    &self.weights,
                    spec,
                    self.plan.geometry.capacity,
                )?;
                self.device.write(id, 0, &bytes)?;
            }
        }
        Ok(())
    }

    /// The plan being run.
    pub fn plan(&self) -> &DispatchPlan {
        &self.plan
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        self.plan.options.head
    }

    fn pass(&mut self, tokens: &[u32], logits: &mut Vec<f32>) -> Result<()> {
        let n = tokens.len();
        let g = self.plan.geometry;
        let ids: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.device.write(self.plan.tokens, 0, &ids)?;
        let args = PassArgs {
            rows: n,
            position: self.position,
        };
        let ops: Vec<_> = self.plan.steps.iter().map(|s| &s.op).collect();
        self.device.run_all(&ops, &g, args)?;
        self.position += n;

        let mut bytes = vec![0u8; n * g.vocab * 4];
        self.device.read(self.plan.logits, 0, &mut bytes)?;
        logits.extend(f32s(&bytes));
        let mut bytes = vec![0u8; n * g.hidden * 4];
        self.device.read(self.plan.final_hidden, 0, &mut bytes)?;
        self.last_hidden.extend(f32s(&bytes));
        if let (Some(sink), Some(tap_rows)) = (&self.sink, self.plan.tap_rows) {
            let width = g.hidden * g.taps;
            let mut bytes = vec![0u8; n * width * 4];
            self.device.read(tap_rows, 0, &mut bytes)?;
            let rows = f32s(&bytes);
            let mut sink = sink.lock().expect("tap sink lock poisoned");
            for row in rows.chunks_exact(width) {
                sink.push_row(row);
            }
        }
        Ok(())
    }
}

impl<D: Device> Forward for NpuTarget<'_, D> {
    fn config(&self) -> &TargetConfig {
        &self.config
    }

    fn position(&self) -> usize {
        self.position
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let capacity = self.plan.geometry.capacity;
        if self.position + tokens.len() > capacity {
            return Err(TargetError::TooLong {
                position: self.position,
                n: tokens.len(),
                max: capacity,
            });
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(TargetError::TokenOutOfRange {
                token: t,
                vocab: self.config.vocab_size,
            });
        }
        self.last_hidden.clear();
        let mut logits = Vec::with_capacity(tokens.len() * self.config.vocab_size);
        // Longer passes run in chunks of max_rows: the kernels are batch invariant, so
        // the bits are those of one pass.
        for chunk in tokens.chunks(self.plan.geometry.max_rows) {
            self.pass(chunk, &mut logits)?;
        }
        Ok(logits)
    }

    fn last_hidden(&self) -> &[f32] {
        &self.last_hidden
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.position {
            return Err(TargetError::TruncateBeyond {
                len,
                position: self.position,
            });
        }
        // The KV buffers keep their rows; positions at or past `len` are never read
        // again (attention reads `..=position + i`) and are overwritten by the next pass.
        self.position = len;
        Ok(())
    }

    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> Result<()> {
        crate::forward::check_taps(&self.config, layers, &sink)?;
        if self.plan.options.taps != layers {
            self.rebuild_with_taps(layers.to_vec())?;
        }
        self.sink = Some(sink);
        Ok(())
    }

    fn clear_layer_taps(&mut self) {
        self.sink = None;
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.weights.embed_rows(&self.config, tokens)
    }

    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        // The drafter scores a few rows on the host: same kernels as the device's head.
        let kernel = crate::kernels::Isa::detect();
        self.weights
            .head_logits(&self.config, self.plan.options.head, hidden, n, kernel)
    }
}

impl<D: Device> NpuTarget<'_, D> {
    /// Taps change which rows the device copies out, so the plan is rebuilt; the
    /// committed KV rows must survive, so they (and only they) are read out and written
    /// back: nothing at all when taps are set before the first pass.
    fn rebuild_with_taps(&mut self, taps: Vec<usize>) -> Result<()> {
        let g = self.plan.geometry;
        let row_bytes = g.head_dim * 4;
        let (span, committed) = (g.capacity * row_bytes, self.position * row_bytes);
        let mut saved = Vec::new();
        for &(keys, values) in self.plan.kv.iter().filter(|_| committed > 0) {
            for id in [keys, values] {
                for kh in 0..g.num_kv_heads {
                    let mut bytes = vec![0u8; committed];
                    self.device.read(id, kh * span, &mut bytes)?;
                    saved.push(bytes);
                }
            }
        }
        let mut options = self.plan.options.clone();
        options.taps = taps;
        self.plan = DispatchPlan::build(&self.config, &options)?;
        self.load_plan()?;
        let mut saved = saved.into_iter();
        for &(keys, values) in self.plan.kv.iter().filter(|_| committed > 0) {
            for id in [keys, values] {
                for kh in 0..g.num_kv_heads {
                    let bytes = saved.next().expect("one saved range per head");
                    self.device.write(id, kh * span, &bytes)?;
                }
            }
        }
        Ok(())
    }
}
