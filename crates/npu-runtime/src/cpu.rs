//! The CPU backend: the reference every other backend is compared against.

use rayon::prelude::*;

use crate::error::{Result, TargetError};
use crate::forward::{Forward, TapSink};
use crate::kernels::{self, matmul, Kernel};
use crate::model::{TargetConfig, TargetPackage, TargetWeights};

/// Keys and values of committed positions, per layer and kv head
/// (`[layer][kv_head] -> positions × head_dim`).
struct KvCache {
    keys: Vec<Vec<Vec<f32>>>,
    values: Vec<Vec<Vec<f32>>>,
    len: usize,
}

impl KvCache {
    fn new(layers: usize, kv_heads: usize) -> KvCache {
        KvCache {
            keys: vec![vec![Vec::new(); kv_heads]; layers],
            values: vec![vec![Vec::new(); kv_heads]; layers],
            len: 0,
        }
    }
    fn truncate(&mut self, len: usize, head_dim: usize) {
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for head in layer {
                head.truncate(len * head_dim);
            }
        }
        self.len = len;
    }
}

/// Which weights score hidden rows into logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadKind {
    /// The package's `lm_head.weight` q4_1 tiles (what FastFlowLM's runtime uses).
    Tiles,
    /// The dense BF16 embedding, for tied models: exact where the tiles are a lossy
    /// re-quantization (3x the bytes of the tiles).
    Embedding,
}

impl HeadKind {
    /// The default for a package: the embedding when the model is tied and its head
    /// tiles were re-quantized from it, the tiles otherwise.
    pub fn default_for(config: &TargetConfig) -> HeadKind {
        if config.tie_word_embeddings && config.lm_head_requantized {
            HeadKind::Embedding
        } else {
            HeadKind::Tiles
        }
    }
}

/// A target model on the CPU.
pub struct CpuTarget<'a> {
    config: TargetConfig,
    weights: TargetWeights<'a>,
    kernel: Kernel,
    head: HeadKind,
    cache: KvCache,
    taps: Option<(Vec<usize>, TapSink)>,
    last_hidden: Vec<f32>,
    /// Rope cos/sin per position (`[pos][head_dim / 2]`), grown on demand.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// The pool every pass runs inside, so the passes' parallel loops dispatch between
    /// worker threads that are already awake instead of waking them from the caller.
    pool: std::sync::Arc<rayon::ThreadPool>,
}

impl<'a> CpuTarget<'a> {
    /// A target over a checked package, with the fastest kernel this CPU has.
    pub fn new(package: &'a TargetPackage) -> Result<CpuTarget<'a>> {
        Self::with_kernel(package, Kernel::detect())
    }

    /// A target with an explicit kernel (tests compare kernels).
    pub fn with_kernel(package: &'a TargetPackage, kernel: Kernel) -> Result<CpuTarget<'a>> {
        Self::with_options(package, kernel, None)
    }

    /// A target with an explicit kernel and worker-thread count (default: all cores).
    pub fn with_options(
        package: &'a TargetPackage,
        kernel: Kernel,
        threads: Option<usize>,
    ) -> Result<CpuTarget<'a>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .thread_name(|i| format!("onebit-cpu-{i}"))
            .build()
            .map_err(|e| TargetError::Unsupported(format!("cannot start worker threads: {e}")))?;
        let config = package.config.clone();
        let weights = package.weights()?;
        Ok(CpuTarget {
            cache: KvCache::new(config.num_layers, config.num_kv_heads),
            config,
            weights,
            kernel,
            head: HeadKind::default_for(&package.config),
            taps: None,
            last_hidden: Vec::new(),
            rope_cos: Vec::new(),
            rope_sin: Vec::new(),
            pool: std::sync::Arc::new(pool),
        })
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        self.head
    }

    /// Chooses the head; the embedding is refused for untied models.
    pub fn set_head(&mut self, head: HeadKind) -> Result<()> {
        if head == HeadKind::Embedding && !self.config.tie_word_embeddings {
            return Err(TargetError::Unsupported(
                "the embedding can only serve as the head of a model with tie_word_embeddings"
                    .into(),
            ));
        }
        self.head = head;
        Ok(())
    }

    /// Worker threads of this target's pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The matmul kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Bytes of weights one pass reads (tiles without padding, embedding rows aside).
    pub fn weight_bytes_per_pass(&self) -> usize {
        let tile_bytes = |n: usize, k: usize| n.div_ceil(32) * 32 * k * 5 / 8;
        let c = &self.config;
        let per_layer = tile_bytes(c.q_dim(), c.hidden_size)
            + 2 * tile_bytes(c.kv_dim(), c.hidden_size)
            + tile_bytes(c.hidden_size, c.q_dim())
            + 2 * tile_bytes(c.intermediate_size, c.hidden_size)
            + tile_bytes(c.hidden_size, c.intermediate_size);
        let head = match self.head {
            HeadKind::Tiles => tile_bytes(c.vocab_size, c.hidden_size),
            HeadKind::Embedding => c.vocab_size * c.hidden_size * 2,
        };
        per_layer * c.num_layers + head
    }

    fn ensure_rope(&mut self, positions: usize) {
        let half = self.config.head_dim / 2;
        let have = self.rope_cos.len() / half.max(1);
        for p in have..positions {
            let (c, s) = kernels::rope_table(self.config.rope_theta, self.config.head_dim, p);
            self.rope_cos.extend(c);
            self.rope_sin.extend(s);
        }
    }

    fn project(&self, w: &q4nx_format::Q4Matrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * w.rows()];
        matmul(w, x, n, &mut y, self.kernel);
        y
    }
}

impl CpuTarget<'_> {
    fn forward_in_pool(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let n = tokens.len();
        let p0 = self.cache.len;
        if p0 + n > self.config.max_positions {
            return Err(TargetError::TooLong {
                position: p0,
                n,
                max: self.config.max_positions,
            });
        }
        let mut x = self.embed(tokens)?;
        if n == 0 {
            self.last_hidden.clear();
            return Ok(Vec::new());
        }
        self.ensure_rope(p0 + n);
        let cfg = &self.config;
        let (h, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_eps);
        let group = cfg.num_heads / cfg.num_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let last = cfg.num_layers - 1;
        let taps: Vec<usize> = self
            .taps
            .as_ref()
            .map(|(l, _)| l.clone())
            .unwrap_or_default();
        let mut tap_values: Vec<Vec<f32>> = vec![Vec::new(); taps.len()];
        let mut normed = vec![0f32; n * h];

        for (l, layer) in self.weights.layers.iter().enumerate() {
            kernels::rms_norm(&x, &layer.input_norm, eps, &mut normed);
            let mut q = self.project(&layer.q, &normed, n);
            let mut k = self.project(&layer.k, &normed, n);
            let v = self.project(&layer.v, &normed, n);
            kernels::norm_and_rope(
                &mut q,
                cfg.num_heads,
                hd,
                layer.q_norm.as_deref(),
                eps,
                p0,
                &self.rope_cos,
                &self.rope_sin,
            );
            kernels::norm_and_rope(
                &mut k,
                cfg.num_kv_heads,
                hd,
                layer.k_norm.as_deref(),
                eps,
                p0,
                &self.rope_cos,
                &self.rope_sin,
            );
            for i in 0..n {
                for kh in 0..cfg.num_kv_heads {
                    let at = i * cfg.kv_dim() + kh * hd;
                    self.cache.keys[l][kh].extend_from_slice(&k[at..at + hd]);
                    self.cache.values[l][kh].extend_from_slice(&v[at..at + hd]);
                }
            }
            // Causal attention: row i sees positions 0..=p0+i. One task per (row, head).
            let mut attn = vec![0f32; n * cfg.q_dim()];
            let (keys, values) = (&self.cache.keys[l], &self.cache.values[l]);
            attn.par_chunks_mut(hd)
                .enumerate()
                .for_each_init(Vec::new, |scores, (idx, out)| {
                    let (i, head) = (idx / cfg.num_heads, idx % cfg.num_heads);
                    let kh = head / group;
                    let query = &q[i * cfg.q_dim() + head * hd..i * cfg.q_dim() + (head + 1) * hd];
                    kernels::attend(
                        query,
                        &keys[kh],
                        &values[kh],
                        p0 + i + 1,
                        scale,
                        scores,
                        out,
                    );
                });
            let o = self.project(&layer.o, &attn, n);
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }
            kernels::rms_norm(&x, &layer.post_norm, eps, &mut normed);
            let mut gate = self.project(&layer.gate, &normed, n);
            let up = self.project(&layer.up, &normed, n);
            kernels::swiglu(&mut gate, &up);
            let down = self.project(&layer.down, &gate, n);
            for (xv, dv) in x.iter_mut().zip(&down) {
                *xv += dv;
            }
            for (t, &tap) in taps.iter().enumerate() {
                if tap == l && l != last {
                    tap_values[t] = x.clone();
                }
            }
        }
        self.cache.len = p0 + n;
        let mut final_hidden = vec![0f32; n * h];
        kernels::rms_norm(&x, &self.weights.final_norm, eps, &mut final_hidden);
        for (t, &tap) in taps.iter().enumerate() {
            if tap == last {
                tap_values[t] = final_hidden.clone();
            }
        }
        if let Some((_, sink)) = &self.taps {
            let mut sink = sink.lock().expect("tap sink lock poisoned");
            let mut row = Vec::with_capacity(taps.len() * h);
            for i in 0..n {
                row.clear();
                for values in &tap_values {
                    row.extend_from_slice(&values[i * h..(i + 1) * h]);
                }
                sink.push_row(&row);
            }
        }
        let logits = self.lm_head(&final_hidden, n);
        self.last_hidden = final_hidden;
        Ok(logits)
    }
}

impl Forward for CpuTarget<'_> {
    fn config(&self) -> &TargetConfig {
        &self.config
    }

    fn position(&self) -> usize {
        self.cache.len
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let pool = self.pool.clone();
        pool.install(|| self.forward_in_pool(tokens))
    }

    fn last_hidden(&self) -> &[f32] {
        &self.last_hidden
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.cache.len {
            return Err(TargetError::TruncateBeyond {
                len,
                position: self.cache.len,
            });
        }
        self.cache.truncate(len, self.config.head_dim);
        Ok(())
    }

    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> Result<()> {
        crate::forward::check_taps(&self.config, layers, &sink)?;
        self.taps = Some((layers.to_vec(), sink));
        Ok(())
    }

    fn clear_layer_taps(&mut self) {
        self.taps = None;
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.weights.embed_rows(&self.config, tokens)
    }

    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        self.pool.install(|| {
            self.weights
                .head_logits(&self.config, self.head, hidden, n, self.kernel)
        })
    }
}
