//! The CPU backend: the reference every other backend is compared against.

use crate::error::{Result, TargetError};
use crate::forward::{Forward, TapSink};
use std::sync::OnceLock;

use crate::kernels::q8::{self, I8Matrix, PackedQ4, QuantizedRows};
use crate::kernels::{self, matmul, Isa};
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
    /// An int8 copy of the BF16 embedding (per-32-column scales, built at load), for
    /// tied models: close to the embedding at 1.1 bytes per weight, run by the `q8`
    /// family.
    EmbeddingInt8,
}

impl HeadKind {
    /// The default for a package at a precision: for a tied model whose head tiles were
    /// re-quantized from its embedding, the embedding (its int8 copy at `q8`); the
    /// tiles otherwise.
    pub fn default_for(config: &TargetConfig, precision: Precision) -> HeadKind {
        match (
            config.tie_word_embeddings && config.lm_head_requantized,
            precision,
        ) {
            (true, Precision::F32) => HeadKind::Embedding,
            (true, _) => HeadKind::EmbeddingInt8,
            (false, _) => HeadKind::Tiles,
        }
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            HeadKind::Tiles => "tiles",
            HeadKind::Embedding => "embedding",
            HeadKind::EmbeddingInt8 => "embedding-int8",
        }
    }
}

/// The arithmetic of the projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 activations times q4 weights ([`kernels::matmul()`]): the exact reference the
    /// fidelity tests use.
    F32,
    /// int8 activations (per row and 32-column group) times q4 weights in integer
    /// arithmetic ([`kernels::q8`]): the fastest verify passes; batch-invariant;
    /// measurably less precise than `F32` (README).
    Q8,
    /// The `q8` kernels over two int8 levels per activation (the second quantizes the
    /// first's residual, ~15-bit activations): indistinguishable from `F32` on
    /// perplexity, KL divergence and top-1 agreement; twice the integer work per row.
    Q8x2,
}

impl Precision {
    /// The default: `Q8x2`.
    pub fn auto() -> Precision {
        Precision::Q8x2
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Q8 => "q8",
            Precision::Q8x2 => "q8x2",
        }
    }

    /// The int8 levels of the integer precisions (`None` at `F32`).
    pub fn levels(self) -> Option<q8::Levels> {
        match self {
            Precision::F32 => None,
            Precision::Q8 => Some(q8::Levels::One),
            Precision::Q8x2 => Some(q8::Levels::Two),
        }
    }
}

/// One layer's projections repacked for the `q8` family: q, k and v stacked into one
/// matrix, gate and up into another, so each runs as one parallel region.
struct PackedLayer {
    qkv: PackedQ4,
    o: PackedQ4,
    gate_up: PackedQ4,
    down: PackedQ4,
}

/// Rows `range` of every one of `n` output rows of `stride` values.
fn gather(y: &[f32], n: usize, stride: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * range.len());
    for i in 0..n {
        out.extend_from_slice(&y[i * stride + range.start..i * stride + range.end]);
    }
    out
}

/// A target model on the CPU.
pub struct CpuTarget<'a> {
    config: TargetConfig,
    weights: TargetWeights<'a>,
    kernel: Isa,
    head: HeadKind,
    precision: Precision,
    /// The projections repacked for `q8` (empty at `f32`).
    packed: Vec<PackedLayer>,
    /// The head's packed forms, built on first use.
    head_tiles_q8: OnceLock<PackedQ4>,
    head_int8: OnceLock<I8Matrix>,
    cache: KvCache,
    taps: Option<(Vec<usize>, TapSink)>,
    last_hidden: Vec<f32>,
    /// Rope cos/sin per position (`[pos][head_dim / 2]`), grown on demand.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// The thread team every pass runs on: its workers spin briefly between the ~150
    /// parallel regions of a step instead of sleeping (`kernels::team`).
    team: std::sync::Arc<kernels::team::Team>,
    /// The rayon pool that repacks weights at load, so the passes' parallel loops dispatch between
    /// worker threads that are already awake instead of waking them from the caller.
    pool: std::sync::Arc<rayon::ThreadPool>,
}

impl<'a> CpuTarget<'a> {
    /// A target over a checked package, with the fastest kernel this CPU has.
    pub fn new(package: &'a TargetPackage) -> Result<CpuTarget<'a>> {
        Self::with_kernel(package, Isa::detect())
    }

    /// A target with an explicit kernel (tests compare kernels).
    pub fn with_kernel(package: &'a TargetPackage, kernel: Isa) -> Result<CpuTarget<'a>> {
        Self::with_options(package, kernel, None)
    }

    /// A target with an explicit kernel and worker-thread count (default: all cores).
    pub fn with_options(
        package: &'a TargetPackage,
        kernel: Isa,
        threads: Option<usize>,
    ) -> Result<CpuTarget<'a>> {
        Self::with_precision(package, kernel, threads, Precision::F32)
    }

    /// A target with an explicit kernel, worker-thread count and precision. At `Q8` the
    /// projections are repacked once here (the same size as the tiles).
    pub fn with_precision(
        package: &'a TargetPackage,
        kernel: Isa,
        threads: Option<usize>,
        precision: Precision,
    ) -> Result<CpuTarget<'a>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .thread_name(|i| format!("onebit-cpu-{i}"))
            .build()
            .map_err(|e| TargetError::Unsupported(format!("cannot start worker threads: {e}")))?;
        let team = kernels::team::Team::new(pool.current_num_threads(), "onebit-team")
            .map_err(|e| TargetError::Unsupported(format!("cannot start worker threads: {e}")))?;
        let config = package.config.clone();
        let weights = package.weights()?;
        let packed = match precision {
            Precision::F32 => Vec::new(),
            Precision::Q8 | Precision::Q8x2 => pool.install(|| {
                weights
                    .layers
                    .iter()
                    .map(|l| PackedLayer {
                        qkv: PackedQ4::stack(&[&l.q, &l.k, &l.v]),
                        o: PackedQ4::new(&l.o),
                        gate_up: PackedQ4::stack(&[&l.gate, &l.up]),
                        down: PackedQ4::new(&l.down),
                    })
                    .collect()
            }),
        };
        let target = CpuTarget {
            cache: KvCache::new(config.num_layers, config.num_kv_heads),
            config,
            weights,
            kernel,
            head: HeadKind::default_for(&package.config, precision),
            precision,
            packed,
            head_tiles_q8: OnceLock::new(),
            head_int8: OnceLock::new(),
            taps: None,
            last_hidden: Vec::new(),
            rope_cos: Vec::new(),
            rope_sin: Vec::new(),
            team: std::sync::Arc::new(team),
            pool: std::sync::Arc::new(pool),
        };
        // Build the head's packed form now, so the first pass is not slower.
        target.pool.install(|| target.prepare_head());
        Ok(target)
    }

    /// The precision of the projections.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    fn prepare_head(&self) {
        match (self.head, self.precision) {
            (HeadKind::EmbeddingInt8, _) => {
                self.int8_head();
            }
            (HeadKind::Tiles, Precision::Q8 | Precision::Q8x2) => {
                self.q8_tiles_head();
            }
            _ => {}
        }
    }

    /// The int8 copy of the embedding (built on first use).
    fn int8_head(&self) -> &I8Matrix {
        self.head_int8.get_or_init(|| {
            I8Matrix::from_bf16(
                self.weights.embed.bytes,
                self.config.vocab_size,
                self.config.hidden_size,
            )
        })
    }

    /// The head tiles repacked for the q8 family (built on first use).
    fn q8_tiles_head(&self) -> &PackedQ4 {
        self.head_tiles_q8
            .get_or_init(|| PackedQ4::new(&self.weights.lm_head))
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        self.head
    }

    /// Chooses the head; the embedding is refused for untied models.
    pub fn set_head(&mut self, head: HeadKind) -> Result<()> {
        if head != HeadKind::Tiles && !self.config.tie_word_embeddings {
            return Err(TargetError::Unsupported(
                "the embedding can only serve as the head of a model with tie_word_embeddings"
                    .into(),
            ));
        }
        self.head = head;
        let pool = self.pool.clone();
        pool.install(|| self.prepare_head());
        Ok(())
    }

    /// Worker threads of this target's pool.
    pub fn threads(&self) -> usize {
        self.team.threads()
    }

    /// The matmul kernel in use.
    pub fn kernel(&self) -> Isa {
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
            HeadKind::EmbeddingInt8 => self.int8_head().byte_len(),
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
    fn forward_in_pool(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
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
        let mut quantized = QuantizedRows::default();
        let isa = self.kernel;
        // At q8: each projection's input rows quantized once, outputs per stacked part.
        let levels = self.precision.levels().unwrap_or(q8::Levels::One);
        let q8_project = |w: &PackedQ4, input: &[f32], k: usize, quantized: &mut QuantizedRows| {
            quantized.quantize_levels(input, n, k, levels);
            q8::matmul_q4_levels(w, quantized, levels, isa)
        };

        for (l, layer) in self.weights.layers.iter().enumerate() {
            kernels::rms_norm(&x, &layer.input_norm, eps, &mut normed);
            let (mut q, mut k, v) = match self.packed.get(l) {
                Some(p) => {
                    let y = q8_project(&p.qkv, &normed, h, &mut quantized);
                    let s = p.qkv.stride();
                    (
                        gather(&y, n, s, p.qkv.part(0)),
                        gather(&y, n, s, p.qkv.part(1)),
                        gather(&y, n, s, p.qkv.part(2)),
                    )
                }
                None => (
                    self.project(&layer.q, &normed, n),
                    self.project(&layer.k, &normed, n),
                    self.project(&layer.v, &normed, n),
                ),
            };
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
            kernels::team::for_each_chunk(&mut attn, hd, |idx, out| {
                let scores = &mut Vec::new();
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
            let o = match self.packed.get(l) {
                Some(p) => q8_project(&p.o, &attn, cfg.q_dim(), &mut quantized),
                None => self.project(&layer.o, &attn, n),
            };
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }
            kernels::rms_norm(&x, &layer.post_norm, eps, &mut normed);
            let down = match self.packed.get(l) {
                Some(p) => {
                    let y = q8_project(&p.gate_up, &normed, h, &mut quantized);
                    let s = p.gate_up.stride();
                    let mut gate = gather(&y, n, s, p.gate_up.part(0));
                    let up = gather(&y, n, s, p.gate_up.part(1));
                    kernels::swiglu(&mut gate, &up);
                    q8_project(&p.down, &gate, cfg.intermediate_size, &mut quantized)
                }
                None => {
                    let mut gate = self.project(&layer.gate, &normed, n);
                    let up = self.project(&layer.up, &normed, n);
                    kernels::swiglu(&mut gate, &up);
                    self.project(&layer.down, &gate, n)
                }
            };
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
        let logits = if all_logits {
            self.head_in_pool(&final_hidden, n)
        } else {
            self.head_in_pool(&final_hidden[(n - 1) * h..], 1)
        };
        self.last_hidden = final_hidden;
        Ok(logits)
    }

    /// Logits of `n` final-normed rows with the chosen head, inside the pool.
    fn head_in_pool(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let (v, h) = (self.config.vocab_size, self.config.hidden_size);
        let levels = self.precision.levels().unwrap_or(q8::Levels::One);
        let quantize = || {
            let mut x = QuantizedRows::default();
            x.quantize_levels(hidden, n, h, levels);
            x
        };
        match (self.head, self.precision) {
            (HeadKind::EmbeddingInt8, _) => {
                q8::matmul_i8_levels(self.int8_head(), &quantize(), levels, self.kernel)
            }
            (HeadKind::Tiles, Precision::Q8 | Precision::Q8x2) => {
                let w = self.q8_tiles_head();
                let y = q8::matmul_q4_levels(w, &quantize(), levels, self.kernel);
                gather(&y, n, w.stride(), 0..v)
            }
            (head, _) => self
                .weights
                .head_logits(&self.config, head, hidden, n, self.kernel),
        }
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
        let team = self.team.clone();
        team.install(|| self.forward_in_pool(tokens, true))
    }

    fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let team = self.team.clone();
        team.install(|| self.forward_in_pool(tokens, false))
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
        self.team.install(|| self.head_in_pool(hidden, n))
    }
}
