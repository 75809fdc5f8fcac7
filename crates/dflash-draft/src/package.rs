//! Loading a draft package: config, manifest, container, and every tensor checked
//! against the geometry. Nothing is decoded at load.

use std::path::{Component, Path, PathBuf};

use half::bf16;
use q4nx_format::{Container, Dtype, Q4Kind, Q4Matrix, TensorView};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::{DraftConfig, ScalarKind, SCALARS};
use crate::error::{DraftError, Result};

/// The seven projections of a draft layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Projection {
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Attention output projection.
    O,
    /// MLP gate projection.
    Gate,
    /// MLP up projection.
    Up,
    /// MLP down projection.
    Down,
}

impl Projection {
    /// All seven, in tensor-name order.
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// The tensor name inside layer `layer`.
    pub fn tensor_name(self, layer: usize) -> String {
        let local = match self {
            Projection::Q => "self_attn.q_proj",
            Projection::K => "self_attn.k_proj",
            Projection::V => "self_attn.v_proj",
            Projection::O => "self_attn.o_proj",
            Projection::Gate => "mlp.gate_proj",
            Projection::Up => "mlp.up_proj",
            Projection::Down => "mlp.down_proj",
        };
        format!("model.layers.{layer}.{local}.weight")
    }

    /// (out features N, in features K).
    pub fn shape(self, c: &DraftConfig) -> (usize, usize) {
        let (h, q, kv) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
        );
        match self {
            Projection::Q => (q, h),
            Projection::K | Projection::V => (kv, h),
            Projection::O => (h, q),
            Projection::Gate | Projection::Up => (c.intermediate_size, h),
            Projection::Down => (h, c.intermediate_size),
        }
    }
}

/// The RMSNorm gains of a draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gain {
    /// A layer's input RMSNorm gain.
    Input(usize),
    /// A layer's post-attention RMSNorm gain.
    PostAttention(usize),
    /// A layer's query RMSNorm gain.
    QNorm(usize),
    /// A layer's key RMSNorm gain.
    KNorm(usize),
    /// `hidden_norm`, applied to the fused context.
    Hidden,
    /// The final `norm`.
    Final,
}

impl Gain {
    /// The tensor name.
    pub fn tensor_name(self) -> String {
        match self {
            Gain::Input(l) => format!("model.layers.{l}.input_layernorm.weight"),
            Gain::PostAttention(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Gain::QNorm(l) => format!("model.layers.{l}.self_attn.q_norm.weight"),
            Gain::KNorm(l) => format!("model.layers.{l}.self_attn.k_norm.weight"),
            Gain::Hidden => "model.hidden_norm.weight".into(),
            Gain::Final => "model.norm.weight".into(),
        }
    }

    /// Number of gains.
    pub fn len(self, c: &DraftConfig) -> usize {
        match self {
            Gain::QNorm(_) | Gain::KNorm(_) => c.head_dim,
            _ => c.hidden_size,
        }
    }

    /// Every gain of a model with `layers` layers.
    pub fn all(layers: usize) -> Vec<Gain> {
        let mut out = Vec::new();
        for l in 0..layers {
            out.extend([
                Gain::Input(l),
                Gain::PostAttention(l),
                Gain::QNorm(l),
                Gain::KNorm(l),
            ]);
        }
        out.extend([Gain::Hidden, Gain::Final]);
        out
    }
}

/// The fusion matrix's tensor name.
pub const FUSION: &str = "model.fc.weight";
/// The manifest file.
pub const MANIFEST: &str = "MANIFEST.sha256";

/// How to load.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Check `MANIFEST.sha256` when present (reads every listed file once).
    pub verify_manifest: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            verify_manifest: true,
        }
    }
}

/// What a target must offer a draft (kept small so this crate needs no runtime).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetShape {
    /// How the target is named in messages (its directory).
    pub name: String,
    /// The target's decoder layers.
    pub num_layers: usize,
    /// The target's hidden width.
    pub hidden_size: usize,
    /// The target's vocabulary size.
    pub vocab_size: usize,
}

/// A checked draft package; tensors stay in the mapped file.
pub struct DraftModel {
    /// The package directory.
    pub dir: PathBuf,
    /// The checked `config.json`.
    pub config: DraftConfig,
    container: Container,
}

/// Joins `rel` to `dir`, refusing absolute paths, `..` and links that leave `dir`.
pub fn confined(dir: &Path, rel: &str, key: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    let escapes = p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    let bad = || DraftError::Config {
        path: dir.join("config.json").display().to_string(),
        key: key.into(),
        problem: format!("'{rel}' leaves the package directory"),
    };
    if escapes || rel.is_empty() {
        return Err(bad());
    }
    let joined = dir.join(p);
    if let (Ok(base), Ok(full)) = (dir.canonicalize(), joined.canonicalize()) {
        if !full.starts_with(base) {
            return Err(bad());
        }
    }
    Ok(joined)
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| DraftError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| DraftError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(hex::encode(h.finalize()))
}

/// Checks every `<sha256>  <file>` line of `MANIFEST.sha256`.
pub fn verify_manifest(dir: &Path) -> Result<usize> {
    let manifest = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&manifest).map_err(|e| DraftError::Io {
        path: manifest.display().to_string(),
        message: e.to_string(),
    })?;
    let mut checked = 0;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let (digest, file) =
            line.split_once(char::is_whitespace)
                .ok_or_else(|| DraftError::Config {
                    path: manifest.display().to_string(),
                    key: format!("line {}", i + 1),
                    problem: format!("'{line}' is not '<sha256>  <file>'"),
                })?;
        let file = file.trim_start().trim_start_matches('*');
        let path = confined(dir, file, MANIFEST)?;
        let actual = sha256_file(&path)?;
        if !actual.eq_ignore_ascii_case(digest) {
            return Err(DraftError::ManifestMismatch {
                path: manifest.display().to_string(),
                file: file.into(),
                expected: digest.into(),
                actual,
            });
        }
        checked += 1;
    }
    Ok(checked)
}

/// Loads and checks the draft package in `dir` (manifest verified when present).
pub fn load_draft(dir: impl AsRef<Path>) -> Result<DraftModel> {
    load_draft_with(dir, LoadOptions::default())
}

/// [`load_draft`] with options.
pub fn load_draft_with(dir: impl AsRef<Path>, options: LoadOptions) -> Result<DraftModel> {
    let dir = dir.as_ref().to_path_buf();
    let label = dir.display().to_string();
    if !dir.is_dir() {
        return Err(DraftError::NotAPackage {
            path: label,
            message: "no such directory".into(),
        });
    }
    let config_path = dir.join("config.json");
    if !config_path.exists() {
        return Err(DraftError::NotAPackage {
            path: label,
            message: "no config.json".into(),
        });
    }
    let text = std::fs::read_to_string(&config_path).map_err(|e| DraftError::Io {
        path: config_path.display().to_string(),
        message: e.to_string(),
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| DraftError::Config {
        path: config_path.display().to_string(),
        key: "(file)".into(),
        problem: format!("is not valid JSON: {e}"),
    })?;
    let config = DraftConfig::from_json(&config_path.display().to_string(), &json)?;
    let weights = confined(&dir, &config.weights, "weights")?;
    if options.verify_manifest && dir.join(MANIFEST).exists() {
        verify_manifest(&dir)?;
    }
    let container = Container::open(&weights)?;
    let model = DraftModel {
        dir,
        config,
        container,
    };
    model.check()?;
    Ok(model)
}

impl DraftModel {
    fn path(&self) -> &str {
        self.container.path()
    }

    /// The weight file's path, for messages.
    pub(crate) fn weights_path(&self) -> &str {
        self.container.path()
    }

    /// The mapped weight file.
    pub(crate) fn container(&self) -> &Container {
        &self.container
    }

    fn tensor_err(&self, tensor: &str, problem: String) -> DraftError {
        DraftError::Tensor {
            path: self.path().into(),
            tensor: tensor.into(),
            problem,
        }
    }

    fn bf16_tensor(&self, name: &str, shape: &[usize]) -> Result<TensorView<'_>> {
        let t = self.container.tensor(name)?;
        if t.dtype != Dtype::BF16 {
            return Err(self.tensor_err(name, format!("has dtype {}, expected BF16", t.dtype)));
        }
        if t.shape != shape {
            return Err(
                self.tensor_err(name, format!("has shape {:?}, expected {shape:?}", t.shape))
            );
        }
        Ok(t)
    }

    /// Every check of the package; see the crate docs.
    fn check(&self) -> Result<()> {
        let c = &self.config;
        let mut expected: Vec<String> = Vec::new();
        for l in 0..c.num_layers {
            for p in Projection::ALL {
                self.projection(l, p)?;
                expected.push(p.tensor_name(l));
            }
        }
        for g in Gain::all(c.num_layers) {
            let t = self.bf16_tensor(&g.tensor_name(), &[g.len(c)])?;
            if let Some(bad) = t
                .to_f32()?
                .into_iter()
                .find(|v| !v.is_finite() || v.abs() > 1e4)
            {
                return Err(
                    self.tensor_err(t.name, format!("holds {bad}, not a finite, bounded gain"))
                );
            }
            expected.push(g.tensor_name());
        }
        self.fusion_view()?;
        expected.push(FUSION.into());
        for (name, key, kind) in SCALARS {
            self.check_scalar(name, key, kind)?;
            expected.push(name.into());
        }
        expected.extend(self.check_v2()?);
        if let Some(extra) = self
            .container
            .tensors()
            .find(|t| !expected.iter().any(|e| e == t.name))
        {
            return Err(self.tensor_err(
                extra.name,
                match self.config.v2 {
                    None => "is not part of a DFlash draft (a package built for another architecture?)".into(),
                    Some(_) => "is not part of a DFlash 2 draft (a package built for another architecture?)".into(),
                },
            ));
        }
        Ok(())
    }

    fn check_scalar(&self, name: &str, key: &str, kind: ScalarKind) -> Result<()> {
        let t = self.container.tensor(name)?;
        let want = self.config.scalar_value(key);
        let found: Vec<f64> = match kind {
            ScalarKind::Ints => {
                if t.dtype != Dtype::I64 {
                    return Err(
                        self.tensor_err(name, format!("has dtype {}, expected I64", t.dtype))
                    );
                }
                t.to_i64()?.into_iter().map(|v| v as f64).collect()
            }
            ScalarKind::Float => {
                if t.dtype != Dtype::F32 {
                    return Err(
                        self.tensor_err(name, format!("has dtype {}, expected F32", t.dtype))
                    );
                }
                t.to_f32()?.into_iter().map(|v| v as f64).collect()
            }
        };
        if t.shape != [want.len()] || found != want {
            return Err(DraftError::ScalarMismatch {
                path: self.path().into(),
                tensor: name.into(),
                key: key.into(),
                found: format!("{found:?} (shape {:?})", t.shape),
                expected: format!("{want:?}"),
            });
        }
        Ok(())
    }

    /// The checked tile view of one projection.
    pub fn projection(&self, layer: usize, which: Projection) -> Result<Q4Matrix<'_>> {
        let name = which.tensor_name(layer);
        let (n, k) = which.shape(&self.config);
        let t = self.container.tensor(&name)?;
        if t.dtype != Dtype::I8 {
            return Err(self.tensor_err(
                &name,
                format!("has dtype {}, expected I8 (q4_1 tiles)", t.dtype),
            ));
        }
        Ok(Q4Matrix::from_tensor(&t, n, k, Q4Kind::Q4_1)?)
    }

    fn fusion_view(&self) -> Result<TensorView<'_>> {
        let c = &self.config;
        let (h, w) = (c.hidden_size, c.context_width());
        let t = self.container.tensor(FUSION)?;
        if t.dtype == Dtype::BF16 && t.shape == [h, w] {
            return Err(self.tensor_err(
                FUSION,
                format!(
                    "is plain row-major [{h}, {w}]; NPU packages store it as [{}, {w}, 32] (blocks of 32 rows, column by column); \
                     import z-lab drafts with `onebit convert-draft`",
                    h / 32
                ),
            ));
        }
        self.bf16_tensor(FUSION, &[h / 32, w, 32])
    }

    /// Decodes one projection to row-major N x K f32.
    pub fn decode_projection(&self, layer: usize, which: Projection) -> Result<Vec<f32>> {
        Ok(self.projection(layer, which)?.decode())
    }

    /// Decodes one norm gain.
    pub fn decode_gain(&self, gain: Gain) -> Result<Vec<f32>> {
        Ok(self
            .bf16_tensor(&gain.tensor_name(), &[gain.len(&self.config)])?
            .to_f32()?)
    }

    /// The fusion matrix as stored (`[hidden/32][taps*hidden][32]` bf16).
    pub fn fusion_stored(&self) -> Result<&[u8]> {
        Ok(self.fusion_view()?.bytes)
    }

    /// Decodes the fusion matrix to row-major `hidden x taps*hidden`:
    /// stored element `[b][c][r]` is `W[b * 32 + r][c]`.
    pub fn decode_fusion(&self) -> Result<Vec<f32>> {
        let (h, w) = (self.config.hidden_size, self.config.context_width());
        let stored = self.fusion_stored()?;
        let mut out = vec![0f32; h * w];
        for (i, pair) in stored.chunks_exact(2).enumerate() {
            let (b, rest) = (i / (w * 32), i % (w * 32));
            let (col, r) = (rest / 32, rest % 32);
            out[(b * 32 + r) * w + col] = bf16::from_le_bytes([pair[0], pair[1]]).to_f32();
        }
        Ok(out)
    }

    /// Tensors in the container.
    pub fn tensor_count(&self) -> usize {
        self.container.len()
    }

    /// Bytes of the weight file.
    pub fn file_bytes(&self) -> usize {
        self.container.file_len()
    }

    /// The generation: `DFlash` or `DFlash 2`.
    pub fn generation(&self) -> &'static str {
        match self.config.v2 {
            None => "DFlash",
            Some(_) => "DFlash 2",
        }
    }

    /// The upstream inventory line (for DFlash 2, its convolution and selector geometry
    /// after it).
    pub fn inventory_line(&self) -> String {
        let c = &self.config;
        let taps: Vec<String> = c.target_layer_ids.iter().map(|t| t.to_string()).collect();
        let v2 = match &c.v2 {
            None => String::new(),
            Some(d) => format!(
                "; DFlash 2: conv {} taps, groups of {}; selector rank {}, top-{}; softcap {}, output multiplier {}",
                d.conv_kernel_size,
                d.conv_group_size,
                d.selector_rank,
                d.selector_top_k,
                d.final_logit_softcapping
                    .map_or("none".to_string(), |v| v.to_string()),
                d.output_multiplier
            ),
        };
        format!(
            "{} tensors, {} bytes; {} layers, hidden {}, intermediate {}, {} heads / {} kv x {}, block {}, taps {}",
            self.tensor_count(),
            self.file_bytes(),
            c.num_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.block_size,
            taps.join(" ")
        ) + &v2
    }

    /// Checks that this draft can run against a target.
    pub fn check_target(&self, target: &TargetShape) -> Result<()> {
        let c = &self.config;
        let bad = |problem: String| DraftError::Pairing {
            target: target.name.clone(),
            problem,
        };
        if let Some(&l) = c.target_layer_ids.iter().find(|&&l| l >= target.num_layers) {
            return Err(bad(format!(
                "target_layer_ids names layer {l}, but the target has {} layers",
                target.num_layers
            )));
        }
        if c.mask_token_id as usize >= target.vocab_size {
            return Err(bad(format!(
                "mask_token_id {} is not below the target's vocabulary of {}",
                c.mask_token_id, target.vocab_size
            )));
        }
        if let (Some(_), Some(vocab)) = (&c.v2, c.vocab_size) {
            if vocab != target.vocab_size {
                return Err(bad(format!(
                    "the DFlash 2 selector's codebooks have {vocab} rows, but the target's vocabulary has {} tokens",
                    target.vocab_size
                )));
            }
        }
        if c.hidden_size != target.hidden_size {
            return Err(bad(format!(
                "the draft's hidden size {} differs from the target's {} (taps and embeddings would not fit)",
                c.hidden_size, target.hidden_size
            )));
        }
        Ok(())
    }
}
