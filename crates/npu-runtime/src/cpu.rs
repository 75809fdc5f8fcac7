//! The CPU backend: the reference every other backend is compared against.

use crate::error::{Result, TargetError};
use crate::forward::{Forward, TapSink};
use std::sync::{Arc, OnceLock};

use crate::kernels::attention::SequenceRows;
use crate::kernels::kv::{KvCache, KvType};
use crate::kernels::q8::{self, I8Matrix, PackedQ4, QuantizedRows};
use crate::kernels::{self, matmul, Isa};
use crate::model::{
    HeadKind, Precision, TargetConfig, TargetPackage, TargetWeights, SCREEN_CANDIDATES,
};
use crate::profile::{Clock, PassProfile, Stage};

mod batch;
pub use batch::{BatchStats, Membership, PassBatcher, DEFAULT_LINGER};

/// One layer's projections repacked for the `q8` family: q, k and v stacked into one
/// matrix, gate and up into another, so each runs as one parallel region.
struct PackedLayer {
    qkv: PackedQ4,
    o: PackedQ4,
    gate_up: PackedQ4,
    down: PackedQ4,
}

/// The q8 projections of one pass: each input quantized (per row), then multiplied into
/// one output buffer that serves every projection in turn (each output is consumed
/// before the next projection), so it is allocated and zeroed once, at its largest use,
/// instead of once per projection (the q8 kernels write every element).
struct Q8Projector {
    rows: usize,
    levels: q8::Levels,
    isa: Isa,
    quantized: QuantizedRows,
    output: Vec<f32>,
}

impl Q8Projector {
    /// `input` (`rows` rows of `k`) by `w`: the `rows × w.stride()` outputs.
    fn project(&mut self, w: &PackedQ4, input: &[f32], k: usize, clock: &mut Clock) -> &[f32] {
        clock.time(Stage::Quantize, || {
            self.quantized
                .quantize_levels(input, self.rows, k, self.levels)
        });
        let len = self.rows * w.stride();
        if self.output.len() < len {
            self.output.resize(len, 0.0);
        }
        let (quantized, output, isa) = (&self.quantized, &mut self.output[..len], self.isa);
        clock.time(Stage::Projections, || {
            q8::matmul_q4(w, quantized, output, isa)
        });
        &self.output[..len]
    }
}

/// The MLP's gated activation in place into `gate`: SwiGLU, or Gemma's GeGLU.
fn gated(isa: Isa, cfg: &TargetConfig, gate: &mut [f32], up: &[f32]) {
    match cfg.variant.activation {
        crate::model::Activation::Silu => kernels::swiglu(isa, gate, up),
        crate::model::Activation::GeluTanh => kernels::geglu(isa, gate, up),
    }
}

/// The first `width` values of each of `n` rows of `stride` values: `y` itself when the
/// rows are exactly that wide (a head whose vocabulary fills its last block), else a copy.
fn leading_columns(y: Vec<f32>, n: usize, stride: usize, width: usize) -> Vec<f32> {
    match stride == width {
        true => y,
        false => gather(&y, n, stride, 0..width),
    }
}

/// Rows `range` of every one of `n` output rows of `stride` values.
fn gather(y: &[f32], n: usize, stride: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * range.len());
    for i in 0..n {
        out.extend_from_slice(&y[i * stride + range.start..i * stride + range.end]);
    }
    out
}

self_cell::self_cell!(
    /// A package together with the checked views into its mapped file, so a model can
    /// own both (the views borrow the mapping, which the `Arc` keeps in place).
    struct MappedWeights {
        owner: Arc<TargetPackage>,
        #[covariant]
        dependent: TargetWeights,
    }
);

/// How a [`CpuModel`] runs: kernel, threads, precision and head.
#[derive(Clone, Copy, Debug)]
pub struct CpuOptions {
    /// The ISA the kernels use (default: the fastest this CPU has).
    pub kernel: Isa,
    /// Threads in the model's team (default: all cores).
    pub threads: Option<usize>,
    /// The projections' arithmetic (default: `F32`, the reference).
    pub precision: Precision,
    /// The head (default: [`HeadKind::default_for`] the package and precision).
    pub head: Option<HeadKind>,
    /// The KV cache's storage type of the model's sessions (default: `F32`, the
    /// reference).
    pub kv_type: KvType,
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            kernel: Isa::detect(),
            threads: None,
            precision: Precision::F32,
            head: None,
            kv_type: KvType::F32,
        }
    }
}

/// A target model on the CPU, shared read-only by every session over it: the checked
/// weights (mapped, plus the forms repacked at load), the head, and the one thread team
/// all its sessions' passes run on. Build it once with [`CpuModel::load`]; each
/// [`CpuModel::session`] is a [`CpuTarget`] with its own KV cache.
pub struct CpuModel {
    mapped: MappedWeights,
    config: TargetConfig,
    kernel: Isa,
    head: HeadKind,
    precision: Precision,
    kv_type: KvType,
    /// The projections repacked for `q8` (empty at `f32`).
    packed: Vec<PackedLayer>,
    /// The head's packed form for the head and precision in use, built at load.
    head_tiles_q8: Option<PackedQ4>,
    head_int8: Option<I8Matrix>,
    /// The lm_head tiles packed for a drafter's proposals when the head in use is
    /// another (the int8 or BF16 embedding): built on first use
    /// ([`CpuModel::prepare_proposals`]), so a model that never drafts never holds them.
    proposal_tiles: OnceLock<PackedQ4>,
    /// The thread team every pass runs on: its workers spin briefly between the ~150
    /// parallel regions of a step instead of sleeping (`kernels::team`). Sessions on
    /// several threads take turns on it region by region.
    team: kernels::team::Team,
}

impl CpuModel {
    /// Checks `options` against the package, repacks the projections at integer
    /// precisions (the same size as the tiles) and builds the head's form.
    pub fn load(package: Arc<TargetPackage>, options: CpuOptions) -> Result<Arc<CpuModel>> {
        let config = package.config.clone();
        let head = options
            .head
            .unwrap_or_else(|| HeadKind::default_for(&config, options.precision));
        if head != HeadKind::Tiles && !config.tie_word_embeddings {
            return Err(TargetError::Unsupported(format!(
                "head {}: the embedding can only serve as the head of a model with tie_word_embeddings ({})",
                head.name(),
                package.dir.display()
            )));
        }
        let start_error = |e: std::io::Error| {
            TargetError::Unsupported(format!("cannot start worker threads: {e}"))
        };
        // Repacking runs once, on a pool that is dropped when loading ends.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads.unwrap_or(0))
            .thread_name(|i| format!("onebit-load-{i}"))
            .build()
            .map_err(|e| TargetError::Unsupported(format!("cannot start worker threads: {e}")))?;
        let team = kernels::team::Team::new(pool.current_num_threads(), "onebit-team")
            .map_err(start_error)?;
        let mapped = MappedWeights::try_new(package, |p| p.weights())?;
        let weights = mapped.borrow_dependent();
        let integer = options.precision != Precision::F32;
        let (packed, head_tiles_q8, head_int8, screen) = pool.install(|| {
            let packed = match integer {
                false => Vec::new(),
                // Every layer in one buffer, so the projections share huge pages.
                true => PackedQ4::stack_layers(&weights.layers, |l| {
                    [
                        vec![&l.q, &l.k, &l.v],
                        vec![&l.o],
                        vec![&l.gate, &l.up],
                        vec![&l.down],
                    ]
                })
                .into_iter()
                .map(|[qkv, o, gate_up, down]| PackedLayer {
                    qkv,
                    o,
                    gate_up,
                    down,
                })
                .collect(),
            };
            let head_tiles_q8 =
                (integer && head == HeadKind::Tiles).then(|| PackedQ4::new(&weights.lm_head));
            let head_int8 =
                matches!(head, HeadKind::EmbeddingInt8 | HeadKind::Screened).then(|| {
                    I8Matrix::from_bf16(weights.embed.bytes, config.vocab_size, config.hidden_size)
                });
            // The screened head's screen is the proposals' tiles: packed now, not on the
            // first pass.
            let screen = (head == HeadKind::Screened).then(|| PackedQ4::new(&weights.lm_head));
            (packed, head_tiles_q8, head_int8, screen)
        });
        Ok(Arc::new(CpuModel {
            mapped,
            config,
            kernel: options.kernel,
            head,
            precision: options.precision,
            kv_type: options.kv_type,
            packed,
            head_tiles_q8,
            head_int8,
            proposal_tiles: screen.map_or_else(OnceLock::new, OnceLock::from),
            team,
        }))
    }

    /// A new session over this model: an empty KV cache (of the model's KV type) at
    /// position 0.
    pub fn session(self: &Arc<Self>) -> CpuTarget {
        self.session_with(self.kv_type)
    }

    /// A new session whose KV cache stores `kv_type`.
    pub fn session_with(self: &Arc<Self>, kv_type: KvType) -> CpuTarget {
        let c = &self.config;
        CpuTarget {
            model: self.clone(),
            state: SessionState::new(KvCache::new(
                kv_type,
                c.num_layers,
                c.num_kv_heads,
                c.head_dim,
            )),
            batcher: None,
        }
    }

    fn weights(&self) -> &TargetWeights<'_> {
        self.mapped.borrow_dependent()
    }

    /// The package the model was loaded from.
    pub fn package(&self) -> &Arc<TargetPackage> {
        self.mapped.borrow_owner()
    }

    /// The model's config.
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// The precision of the projections.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The KV type of new sessions.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        self.head
    }

    /// Threads in the model's team.
    pub fn threads(&self) -> usize {
        self.team.threads()
    }

    /// The ISA the kernels use.
    pub fn kernel(&self) -> Isa {
        self.kernel
    }

    /// Bytes of weights one pass reads (tiles without padding, embedding rows aside).
    pub fn weight_bytes_per_pass(&self) -> usize {
        let c = &self.config;
        let tiles = TargetConfig::tile_bytes(c.vocab_size, c.hidden_size);
        let head = match (self.head, &self.head_int8) {
            (HeadKind::EmbeddingInt8, Some(m)) => m.byte_len(),
            // The tiles, and at most one 16-row int8 block per candidate.
            (HeadKind::Screened, Some(m)) => {
                tiles
                    + (SCREEN_CANDIDATES * m.byte_len()
                        / m.rows().div_ceil(q8::I8_BLOCK_ROWS).max(1))
                    .min(m.byte_len())
            }
            (HeadKind::Tiles, _) => tiles,
            _ => c.vocab_size * c.hidden_size * 2,
        };
        c.layer_tile_bytes() + head
    }

    /// Embedding rows of `tokens` (`tokens.len() × hidden`); ids beyond the vocabulary are
    /// refused by name.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.weights().embed_rows(&self.config, tokens)
    }

    /// Logits of `n` final-normed hidden rows with the model's head, on its team: the
    /// one head path every session and drafter uses.
    pub fn logits(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        self.team.install(|| self.head_in_pool(hidden, n))
    }

    /// Logits to propose from, not to decide with (a drafter's picks). At the integer
    /// precisions: the package's q4 lm_head tiles over one int8 level of activations,
    /// whatever head the passes use. A round scoring 7 drafted rows streams the whole
    /// head, and the tiles are half the bytes of the int8 embedding (their picks can
    /// differ where two logits nearly tie; verification decides every token either
    /// way). At `f32`, [`CpuModel::logits`] (the reference arithmetic). On the model's
    /// team.
    pub fn proposal_logits(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let (y, stride) = self.proposal_rows(hidden, n);
        leading_columns(y, n, stride, self.config.vocab_size)
    }

    /// [`CpuModel::proposal_logits`] as computed: `n` rows of `stride` values, each
    /// row's logits first.
    fn proposal_rows(&self, hidden: &[f32], n: usize) -> (Vec<f32>, usize) {
        if self.precision.levels().is_none() {
            return (self.logits(hidden, n), self.config.vocab_size);
        }
        let tiles = self.proposal_head();
        let y = self
            .team
            .install(|| self.tiles_rows(tiles, hidden, n, q8::Levels::One));
        (y, tiles.stride())
    }

    /// `argmax` of each row's [`CpuModel::proposal_logits`] (the first index of the
    /// largest value, NaN never largest; 0 when a row has no number), without copying
    /// the logits out: what a drafter's picks need. The rows' searches run on the team.
    pub fn proposal_picks(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        let v = self.config.vocab_size;
        let (logits, stride) = self.proposal_rows(hidden, n);
        let mut picks = vec![0u32; n];
        self.team.install(|| {
            kernels::team::for_each_chunk(&mut picks, 1, |i, pick| {
                pick[0] = kernels::elementwise::first_max(
                    self.kernel,
                    &logits[i * stride..i * stride + v],
                ) as u32;
            })
        });
        picks
    }

    /// Builds the proposal head now (packing the lm_head tiles when the head in use is
    /// not already them), so a drafter's first round does not pay for it. Does nothing
    /// at `f32`.
    pub fn prepare_proposals(&self) {
        if self.precision.levels().is_some() {
            self.proposal_head();
        }
    }

    /// The packed lm_head tiles for proposals: the head's own when it is the tiles.
    fn proposal_head(&self) -> &PackedQ4 {
        match &self.head_tiles_q8 {
            Some(w) => w,
            None => self
                .proposal_tiles
                .get_or_init(|| PackedQ4::new(&self.weights().lm_head)),
        }
    }

    /// Runs `f` with the model's thread team installed on this thread, so the parallel
    /// loops of work beside its passes (a draft round) run on the same team.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        self.team.install(f)
    }

    fn project(&self, w: &q4nx_format::Q4Matrix, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * w.rows()];
        matmul(w, x, n, &mut y, self.kernel);
        y
    }

    /// Logits of `n` final-normed rows with the chosen head, inside the team.
    fn head_in_pool(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let levels = self.precision.levels().unwrap_or(q8::Levels::One);
        match (&self.head_int8, &self.head_tiles_q8) {
            (Some(int8), _) if self.head == HeadKind::Screened => {
                let x = self.quantized(hidden, n, levels);
                // The screen runs at one level: the head's own rows when they are one level.
                let one;
                let screen = match levels {
                    q8::Levels::One => &x,
                    q8::Levels::Two => {
                        one = self.quantized(hidden, n, q8::Levels::One);
                        &one
                    }
                };
                q8::matmul_screened(
                    self.proposal_head(),
                    int8,
                    screen,
                    &x,
                    SCREEN_CANDIDATES,
                    self.kernel,
                )
            }
            (Some(int8), _) => {
                let x = self.quantized(hidden, n, levels);
                q8::matmul_i8_levels(int8, &x, levels, self.kernel)
            }
            (None, Some(w)) => {
                let y = self.tiles_rows(w, hidden, n, levels);
                leading_columns(y, n, w.stride(), self.config.vocab_size)
            }
            (None, None) => {
                self.weights()
                    .head_logits(&self.config, self.head, hidden, n, self.kernel)
            }
        }
    }

    /// `n` hidden rows quantized at `levels`.
    fn quantized(&self, hidden: &[f32], n: usize, levels: q8::Levels) -> QuantizedRows {
        let mut x = QuantizedRows::default();
        x.quantize_levels(hidden, n, self.config.hidden_size, levels);
        x
    }

    /// `n` rows of packed q4 tiles `w` times the hidden rows at `levels`: each row
    /// `w.stride()` values, the matrix's rows first.
    fn tiles_rows(&self, w: &PackedQ4, hidden: &[f32], n: usize, levels: q8::Levels) -> Vec<f32> {
        q8::matmul_q4_levels(w, &self.quantized(hidden, n, levels), levels, self.kernel)
    }
}

/// What a pass reads and writes besides the shared model: one sequence's KV cache, its
/// layer taps, rope tables and last hidden rows. Kept apart from [`CpuTarget`] so a
/// [`PassBatcher`] can take several sessions' states into one pass.
pub(crate) struct SessionState {
    cache: KvCache,
    taps: Option<(Vec<usize>, TapSink)>,
    last_hidden: Vec<f32>,
    /// Rope cos/sin per position (`[pos][head_dim / 2]`), grown on demand.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// The same at the sliding-window layers' own base (`rope_local_base_freq`; empty
    /// for a model without one).
    rope_local_cos: Vec<f32>,
    rope_local_sin: Vec<f32>,
    /// The stages' times of the passes since profiling was turned on (boxed: a session
    /// that never profiles carries a pointer, not the table).
    profile: Option<Box<PassProfile>>,
}

impl SessionState {
    fn new(cache: KvCache) -> SessionState {
        SessionState {
            cache,
            taps: None,
            last_hidden: Vec::new(),
            rope_cos: Vec::new(),
            rope_sin: Vec::new(),
            rope_local_cos: Vec::new(),
            rope_local_sin: Vec::new(),
            profile: None,
        }
    }

    /// What a session holds while its state is away in a batched pass: nothing (a
    /// cache of no layers allocates nothing).
    fn away() -> SessionState {
        SessionState::new(KvCache::new(KvType::F32, 0, 0, 0))
    }

    fn ensure_rope(&mut self, cfg: &TargetConfig, positions: usize) {
        let half = cfg.head_dim / 2;
        let have = self.rope_cos.len() / half.max(1);
        for p in have..positions {
            let (c, s) = kernels::rope_table(cfg.rope_theta, cfg.head_dim, p);
            self.rope_cos.extend(c);
            self.rope_sin.extend(s);
            if let Some(local) = cfg.variant.rope_local_theta {
                let (c, s) = kernels::rope_table(local, cfg.head_dim, p);
                self.rope_local_cos.extend(c);
                self.rope_local_sin.extend(s);
            }
        }
    }

    /// The rope tables of layer `l` (cos, sin): the local base's on a sliding-window
    /// layer of a model that has one.
    fn rope_of(&self, cfg: &TargetConfig, l: usize) -> (&[f32], &[f32]) {
        match cfg.window_of(l).is_some() && cfg.variant.rope_local_theta.is_some() {
            true => (&self.rope_local_cos, &self.rope_local_sin),
            false => (&self.rope_cos, &self.rope_sin),
        }
    }
}

/// One session's rows in a pass: the tokens it runs at its next positions, and whether
/// it wants every row's logits or only the last row's (a prefill chunk).
pub(crate) struct PassPart<'a> {
    pub(crate) state: &'a mut SessionState,
    pub(crate) tokens: &'a [u32],
    pub(crate) all_logits: bool,
}

/// A part that passed its checks: where its rows sit in the pass and where it starts.
struct Placed {
    part: usize,
    rows: std::ops::Range<usize>,
    p0: usize,
}

impl CpuModel {
    /// One pass over the rows of every part (each a session at its own position), inside
    /// the team: the projections, norms and head run once over all the rows; rope, the
    /// KV append and attention run per part against that part's own cache. Every kernel
    /// is batch invariant (a row's bits never depend on the rows beside it), so each
    /// part gets exactly the logits a pass of its rows alone would give. A part refused
    /// (too long, a token outside the vocabulary) gets its error and leaves the others
    /// running; the answers come back in the parts' order.
    pub(crate) fn pass(
        &self,
        parts: &mut [PassPart<'_>],
        clock: &mut Clock,
    ) -> Vec<Result<Vec<f32>>> {
        let cfg = &self.config;
        let mut answers: Vec<Option<Result<Vec<f32>>>> = parts.iter().map(|_| None).collect();
        let mut placed: Vec<Placed> = Vec::with_capacity(parts.len());
        let mut x = Vec::new();
        let mut n = 0;
        for (i, part) in parts.iter_mut().enumerate() {
            let p0 = part.state.cache.len();
            let k = part.tokens.len();
            if p0.saturating_add(k) > cfg.max_positions {
                answers[i] = Some(Err(TargetError::TooLong {
                    position: p0,
                    n: k,
                    max: cfg.max_positions,
                }));
                continue;
            }
            match clock.time(Stage::Embed, || self.embed(part.tokens)) {
                Err(e) => answers[i] = Some(Err(e)),
                Ok(_) if k == 0 => {
                    part.state.last_hidden.clear();
                    answers[i] = Some(Ok(Vec::new()));
                }
                Ok(rows) => {
                    x.extend_from_slice(&rows);
                    part.state.ensure_rope(cfg, p0 + k);
                    placed.push(Placed {
                        part: i,
                        rows: n..n + k,
                        p0,
                    });
                    n += k;
                }
            }
        }
        if n > 0 {
            for (part, logits) in self.layers(parts, &placed, x, clock) {
                answers[part] = Some(Ok(logits));
            }
        }
        answers
            .into_iter()
            .map(|a| a.expect("every part of a pass is answered"))
            .collect()
    }

    /// The layers and head over the placed parts' rows `x` (embedded): each placed
    /// part's logits.
    fn layers(
        &self,
        parts: &mut [PassPart<'_>],
        placed: &[Placed],
        mut x: Vec<f32>,
        clock: &mut Clock,
    ) -> Vec<(usize, Vec<f32>)> {
        let cfg = &self.config;
        let n = placed.last().map_or(0, |p| p.rows.end);
        let (h, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_eps);
        let scale = cfg.attention_scale();
        let last = cfg.num_layers - 1;
        // The layers any part taps (the residual stream after them is kept for it).
        let mut tapped = vec![false; cfg.num_layers];
        for p in placed {
            if let Some((layers, _)) = &parts[p.part].state.taps {
                for &l in layers {
                    tapped[l] = true;
                }
            }
        }
        let mut tap_values: Vec<Option<Vec<f32>>> = vec![None; cfg.num_layers];
        let mut normed = vec![0f32; n * h];
        let isa = self.kernel;
        // At q8: each projection's input rows quantized once, outputs per stacked part.
        let mut projector = Q8Projector {
            rows: n,
            levels: self.precision.levels().unwrap_or(q8::Levels::One),
            isa,
            quantized: QuantizedRows::default(),
            output: Vec::new(),
        };
        let (qd, kvd) = (cfg.q_dim(), cfg.num_kv_heads * hd);

        for (l, layer) in self.weights().layers.iter().enumerate() {
            clock.time(Stage::Norms, || {
                kernels::rms_norm(&x, &layer.input_norm, eps, &mut normed)
            });
            let (mut q, mut k, v) = match self.packed.get(l) {
                Some(p) => {
                    let y = projector.project(&p.qkv, &normed, h, clock);
                    let s = p.qkv.stride();
                    clock.time(Stage::Activation, || {
                        (
                            gather(y, n, s, p.qkv.part(0)),
                            gather(y, n, s, p.qkv.part(1)),
                            gather(y, n, s, p.qkv.part(2)),
                        )
                    })
                }
                None => clock.time(Stage::Projections, || {
                    (
                        self.project(&layer.q, &normed, n),
                        self.project(&layer.k, &normed, n),
                        self.project(&layer.v, &normed, n),
                    )
                }),
            };
            // Rope and the KV append per part, each at its own positions into its own
            // cache; then causal attention of every part's rows in one region, row i of
            // a part seeing its positions 0..=p0+i (`kernels::attention`: the same bits
            // for a row whatever the rows around it, the split or the threads).
            for placed in placed {
                let state = &mut *parts[placed.part].state;
                let rows = placed.rows.clone();
                let (q, k) = (
                    &mut q[rows.start * qd..rows.end * qd],
                    &mut k[rows.start * kvd..rows.end * kvd],
                );
                let rope = clock.start(Stage::Rope);
                let (cos, sin) = state.rope_of(cfg, l);
                kernels::norm_and_rope(
                    q,
                    cfg.num_heads,
                    hd,
                    layer.q_norm.as_deref(),
                    eps,
                    placed.p0,
                    cos,
                    sin,
                );
                kernels::norm_and_rope(
                    k,
                    cfg.num_kv_heads,
                    hd,
                    layer.k_norm.as_deref(),
                    eps,
                    placed.p0,
                    cos,
                    sin,
                );
                clock.stop(rope);
                let v = &v[rows.start * kvd..rows.end * kvd];
                clock.time(Stage::KvAppend, || {
                    state.cache.layer_mut(l).append(k, v, rows.len())
                });
            }
            let attention = clock.start(Stage::Attention);
            let sequences: Vec<SequenceRows<'_>> = placed
                .iter()
                .map(|p| SequenceRows {
                    layer: parts[p.part].state.cache.layer(l),
                    rows: p.rows.clone(),
                    p0: p.p0,
                    // A sliding-window layer's rows see only the last `window` positions.
                    window: cfg.window_of(l),
                })
                .collect();
            let mut attn = vec![0f32; n * qd];
            kernels::attention::attention_many(
                isa,
                &sequences,
                &q,
                cfg.num_heads,
                scale,
                &mut attn,
            );
            clock.stop(attention);
            let projected_o;
            let o: &[f32] = match self.packed.get(l) {
                Some(p) => {
                    // `h` is every q/k/v input's width, a multiple of 32 (checked at
                    // load), so o's and down's outputs carry no padding rows.
                    debug_assert_eq!(p.o.stride(), h);
                    projector.project(&p.o, &attn, qd, clock)
                }
                None => {
                    projected_o =
                        clock.time(Stage::Projections, || self.project(&layer.o, &attn, n));
                    &projected_o
                }
            };
            let o_normed;
            let o: &[f32] = match &layer.post_attn_norm {
                // Gemma norms the attention output before adding it to the residual.
                Some(g) => {
                    let mut y = vec![0f32; n * h];
                    clock.time(Stage::Norms, || kernels::rms_norm(o, g, eps, &mut y));
                    o_normed = y;
                    &o_normed
                }
                None => o,
            };
            clock.time(Stage::Residual, || {
                for (xv, ov) in x.iter_mut().zip(o) {
                    *xv += ov;
                }
            });
            clock.time(Stage::Norms, || {
                kernels::rms_norm(&x, &layer.post_norm, eps, &mut normed)
            });
            let projected_down;
            let down: &[f32] = match self.packed.get(l) {
                Some(p) => {
                    let y = projector.project(&p.gate_up, &normed, h, clock);
                    let s = p.gate_up.stride();
                    let gate = clock.time(Stage::Activation, || {
                        let mut gate = gather(y, n, s, p.gate_up.part(0));
                        let up = gather(y, n, s, p.gate_up.part(1));
                        gated(self.kernel, cfg, &mut gate, &up);
                        gate
                    });
                    debug_assert_eq!(p.down.stride(), h);
                    projector.project(&p.down, &gate, cfg.intermediate_size, clock)
                }
                None => {
                    let (mut gate, up) = clock.time(Stage::Projections, || {
                        (
                            self.project(&layer.gate, &normed, n),
                            self.project(&layer.up, &normed, n),
                        )
                    });
                    clock.time(Stage::Activation, || {
                        gated(self.kernel, cfg, &mut gate, &up)
                    });
                    projected_down =
                        clock.time(Stage::Projections, || self.project(&layer.down, &gate, n));
                    &projected_down
                }
            };
            let down_normed;
            let down: &[f32] = match &layer.post_ffn_norm {
                // Gemma norms the MLP output before adding it to the residual.
                Some(g) => {
                    let mut y = vec![0f32; n * h];
                    clock.time(Stage::Norms, || kernels::rms_norm(down, g, eps, &mut y));
                    down_normed = y;
                    &down_normed
                }
                None => down,
            };
            clock.time(Stage::Residual, || {
                for (xv, dv) in x.iter_mut().zip(down) {
                    *xv += dv;
                }
            });
            if l != last && tapped[l] {
                tap_values[l] = Some(x.clone());
            }
        }
        let mut final_hidden = vec![0f32; n * h];
        clock.time(Stage::Norms, || {
            kernels::rms_norm(&x, &self.weights().final_norm, eps, &mut final_hidden)
        });
        // Each part's tap rows: the concatenation, in its taps' order, of the tapped
        // layers' rows (the last layer's tap is the final-normed row).
        for placed in placed {
            let Some((layers, sink)) = &parts[placed.part].state.taps else {
                continue;
            };
            let mut sink = sink.lock().expect("tap sink lock poisoned");
            let mut row = Vec::with_capacity(layers.len() * h);
            for i in placed.rows.clone() {
                row.clear();
                for &l in layers {
                    let values = match l == last {
                        true => &final_hidden,
                        false => tap_values[l].as_ref().expect("a tapped layer is kept"),
                    };
                    row.extend_from_slice(&values[i * h..(i + 1) * h]);
                }
                sink.push_row(&row);
            }
        }
        self.heads(parts, placed, final_hidden, clock)
    }

    /// The logits each placed part asked for (all its rows, or its last), from one head
    /// pass over those rows; each part keeps its final-normed rows as `last_hidden`.
    fn heads(
        &self,
        parts: &mut [PassPart<'_>],
        placed: &[Placed],
        final_hidden: Vec<f32>,
        clock: &mut Clock,
    ) -> Vec<(usize, Vec<f32>)> {
        let h = self.config.hidden_size;
        let vocab = self.config.vocab_size;
        let wanted: Vec<std::ops::Range<usize>> = placed
            .iter()
            .map(|p| match parts[p.part].all_logits {
                true => p.rows.clone(),
                false => p.rows.end - 1..p.rows.end,
            })
            .collect();
        if let [only] = placed {
            // One part (every unbatched pass): no copies.
            let rows = wanted[0].clone();
            let logits = clock.time(Stage::Head, || {
                self.head_in_pool(&final_hidden[rows.start * h..rows.end * h], rows.len())
            });
            parts[only.part].state.last_hidden = final_hidden;
            return vec![(only.part, logits)];
        }
        let mut head_input = Vec::new();
        for rows in &wanted {
            head_input.extend_from_slice(&final_hidden[rows.start * h..rows.end * h]);
        }
        let m = head_input.len() / h;
        let logits = clock.time(Stage::Head, || self.head_in_pool(&head_input, m));
        let mut at = 0;
        placed
            .iter()
            .zip(&wanted)
            .map(|(p, rows)| {
                let count = rows.len() * vocab;
                let state = &mut *parts[p.part].state;
                state.last_hidden = final_hidden[p.rows.start * h..p.rows.end * h].to_vec();
                at += count;
                (p.part, logits[at - count..at].to_vec())
            })
            .collect()
    }
}

/// One session over a [`CpuModel`]: the per-sequence state (KV cache, layer taps, rope
/// tables, the last pass's hidden rows). `'static` and `Send`, so a server can move it to
/// a worker thread; any number of sessions share one model. A session that joined a
/// [`PassBatcher`] runs each pass together with the other sessions' waiting rows.
pub struct CpuTarget {
    model: Arc<CpuModel>,
    state: SessionState,
    batcher: Option<Arc<PassBatcher>>,
}

impl CpuTarget {
    /// A session over a new model of `package` with default options (the fastest
    /// kernel, all cores, `f32`).
    pub fn new(package: &Arc<TargetPackage>) -> Result<CpuTarget> {
        Self::with_options(package, CpuOptions::default())
    }

    /// A session over a new model of `package` with `options`.
    pub fn with_options(package: &Arc<TargetPackage>, options: CpuOptions) -> Result<CpuTarget> {
        Ok(CpuModel::load(package.clone(), options)?.session())
    }

    /// The shared model this session runs.
    pub fn model(&self) -> &Arc<CpuModel> {
        &self.model
    }

    /// The precision of the projections.
    pub fn precision(&self) -> Precision {
        self.model.precision
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        self.model.head
    }

    /// The KV cache's storage type.
    pub fn kv_type(&self) -> KvType {
        self.state.cache.kv_type()
    }

    /// Bytes the KV cache holds (it grows with the positions, a key block at a time).
    pub fn kv_bytes(&self) -> usize {
        self.state.cache.byte_len()
    }

    /// Bytes the KV cache has allocated (a truncation keeps them for reuse).
    pub fn kv_capacity_bytes(&self) -> usize {
        self.state.cache.capacity_bytes()
    }

    /// Empties the KV cache (position 0) and gives its memory back.
    pub fn release_kv(&mut self) {
        self.state.cache.release();
    }

    /// Threads in the model's team.
    pub fn threads(&self) -> usize {
        self.model.threads()
    }

    /// The matmul kernel in use.
    pub fn kernel(&self) -> Isa {
        self.model.kernel
    }

    /// Bytes of weights one pass reads (tiles without padding, embedding rows aside).
    pub fn weight_bytes_per_pass(&self) -> usize {
        self.model.weight_bytes_per_pass()
    }

    /// From now on this session's passes go through `batcher`, sharing each pass with
    /// the other member sessions' waiting rows (same bits as passes of its own).
    /// Refused when the batcher runs another model.
    pub fn join(&mut self, batcher: Arc<PassBatcher>) -> Result<()> {
        if !Arc::ptr_eq(batcher.model(), &self.model) {
            return Err(TargetError::Unsupported(
                "a session can only share passes with sessions over the same model".into(),
            ));
        }
        self.batcher = Some(batcher);
        Ok(())
    }

    /// The batcher this session's passes go through, if it joined one.
    pub fn batcher(&self) -> Option<&Arc<PassBatcher>> {
        self.batcher.as_ref()
    }

    /// Profiles the passes from now on (`true`) or stops (`false`, dropping what was
    /// gathered); [`CpuTarget::take_profile`] reads it. A batched pass is timed in the
    /// profile of the first session in it.
    pub fn set_profiling(&mut self, on: bool) {
        self.state.profile = on.then(Box::default);
    }

    /// The stages' times of the passes since profiling began or since the last call,
    /// then starts afresh (`None` when not profiling).
    pub fn take_profile(&mut self) -> Option<PassProfile> {
        self.state.profile.as_deref_mut().map(std::mem::take)
    }

    fn run(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if let Some(batcher) = &self.batcher {
            return batcher.submit(&mut self.state, tokens, all_logits);
        }
        let model = self.model.clone();
        model
            .team
            .install(|| model.pass_alone(&mut self.state, tokens, all_logits))
    }
}

impl CpuModel {
    /// One session's pass on its own (inside the team), timed into its profile.
    fn pass_alone(
        &self,
        state: &mut SessionState,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>> {
        let mut clock = Clock::new(state.profile.take().map(|p| *p));
        let mut parts = [PassPart {
            state,
            tokens,
            all_logits,
        }];
        let [answer] = <[_; 1]>::try_from(self.pass(&mut parts, &mut clock))
            .unwrap_or_else(|_| unreachable!("one part, one answer"));
        // A refused or empty pass is not a pass; its partial times are dropped with it.
        let counted = answer.is_ok() && !tokens.is_empty();
        parts[0].state.profile = clock.finish(counted).map(Box::new);
        answer
    }
}

impl Forward for CpuTarget {
    fn config(&self) -> &TargetConfig {
        &self.model.config
    }

    fn position(&self) -> usize {
        self.state.cache.len()
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, true)
    }

    fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, false)
    }

    fn last_hidden(&self) -> &[f32] {
        &self.state.last_hidden
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        let cache = &mut self.state.cache;
        if len > cache.len() {
            return Err(TargetError::TruncateBeyond {
                len,
                position: cache.len(),
            });
        }
        cache.truncate(len);
        Ok(())
    }

    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> Result<()> {
        crate::forward::check_taps(&self.model.config, layers, &sink)?;
        self.state.taps = Some((layers.to_vec(), sink));
        Ok(())
    }

    fn clear_layer_taps(&mut self) {
        self.state.taps = None;
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.model.embed(tokens)
    }

    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        self.model.logits(hidden, n)
    }
}
