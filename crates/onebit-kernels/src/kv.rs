//! The KV cache layout: keys and values of committed positions, per layer and kv head,
//! stored at one of three precisions ([`KvType`]) in the layout the [`crate::attention`]
//! kernels read.
//!
//! Per kv head:
//! - **keys** in blocks of [`BLOCK`] positions, transposed inside a block
//!   (`[block][dim][position in block]`), so the score kernels load 16 positions of one
//!   dimension as one vector; a block is allocated when its first position is appended
//!   (memory grows with use, never for the whole context up front);
//! - **values** row-major (`[position][dim]`), grown per position;
//! - at [`KvType::Q8`], one f32 scale per position for keys (stored per block, like the
//!   keys) and one for values.
//!
//! Conversion happens once, at append: `Bf16` rounds to nearest even (`half`), `Q8`
//! quantizes each (position, kv head) vector of `head_dim` values to int8 with one scale
//! `d = max|v| / 127` ([`crate::q8::quantize_group`], over `head_dim` values). [`KvLayer::truncate`] drops
//! positions exactly: the cache then holds what appending the kept positions alone
//! would have built, byte for byte.

use half::bf16;

/// Positions per key block: the attention kernels' unit of work and of the softmax
/// partials (a constant: never derived from a thread count).
pub const BLOCK: usize = 64;

/// The precision keys and values are stored at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f32, exact.
    F32,
    /// bf16 (rounded to nearest even at append): half the bytes of f32.
    Bf16,
    /// int8 with one f32 scale per position and kv head: about a quarter of f32.
    Q8,
}

impl KvType {
    /// Every type, for tests and reports.
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::Bf16, KvType::Q8];

    /// The name the command line uses (`f32`, `bf16`, `q8`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::Bf16 => "bf16",
            KvType::Q8 => "q8",
        }
    }

    /// The type named `name` (as [`KvType::name`] spells it).
    pub fn parse(name: &str) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Bytes one position of one kv head takes (keys and values, scales included);
    /// saturates at `usize::MAX` rather than overflow (a head size from a file may be
    /// absurd, and the figure is used to size things, never to index).
    pub fn bytes_per_position(self, head_dim: usize) -> usize {
        match self {
            KvType::F32 => head_dim.saturating_mul(2 * 4),
            KvType::Bf16 => head_dim.saturating_mul(2 * 2),
            KvType::Q8 => head_dim.saturating_add(4).saturating_mul(2),
        }
    }
}

/// Elements of one store, at the layer's type.
#[derive(Clone, Debug, PartialEq)]
enum Elems {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Q8(Vec<i8>),
}

impl Elems {
    fn new(kv_type: KvType) -> Elems {
        match kv_type {
            KvType::F32 => Elems::F32(Vec::new()),
            KvType::Bf16 => Elems::Bf16(Vec::new()),
            KvType::Q8 => Elems::Q8(Vec::new()),
        }
    }
    fn len(&self) -> usize {
        match self {
            Elems::F32(v) => v.len(),
            Elems::Bf16(v) => v.len(),
            Elems::Q8(v) => v.len(),
        }
    }
    fn resize(&mut self, len: usize) {
        match self {
            Elems::F32(v) => v.resize(len, 0.0),
            Elems::Bf16(v) => v.resize(len, 0),
            Elems::Q8(v) => v.resize(len, 0),
        }
    }
    fn zero(&mut self, range: std::ops::Range<usize>) {
        match self {
            Elems::F32(v) => v[range].fill(0.0),
            Elems::Bf16(v) => v[range].fill(0),
            Elems::Q8(v) => v[range].fill(0),
        }
    }
    fn view(&self) -> ElemsRef<'_> {
        match self {
            Elems::F32(v) => ElemsRef::F32(v),
            Elems::Bf16(v) => ElemsRef::Bf16(v),
            Elems::Q8(v) => ElemsRef::Q8(v),
        }
    }
    fn byte_len(&self) -> usize {
        match self {
            Elems::F32(v) => 4 * v.len(),
            Elems::Bf16(v) => 2 * v.len(),
            Elems::Q8(v) => v.len(),
        }
    }
    /// Bytes allocated (capacity, not length).
    fn capacity_bytes(&self) -> usize {
        match self {
            Elems::F32(v) => 4 * v.capacity(),
            Elems::Bf16(v) => 2 * v.capacity(),
            Elems::Q8(v) => v.capacity(),
        }
    }
}

/// A read-only view of a store's elements.
#[derive(Clone, Copy, Debug)]
pub enum ElemsRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements as their bits.
    Bf16(&'a [u16]),
    /// int8 codes (scaled by the view's scales).
    Q8(&'a [i8]),
}

impl ElemsRef<'_> {
    /// Element `i` widened to f32 (exact: bf16 and int8 are subsets of f32), before
    /// any q8 scale.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            ElemsRef::F32(v) => v[i],
            ElemsRef::Bf16(v) => f32::from_bits((v[i] as u32) << 16),
            ElemsRef::Q8(v) => v[i] as f32,
        }
    }
    /// Elements in the store.
    pub fn len(&self) -> usize {
        match self {
            ElemsRef::F32(v) => v.len(),
            ElemsRef::Bf16(v) => v.len(),
            ElemsRef::Q8(v) => v.len(),
        }
    }
    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One kv head's stores.
#[derive(Clone, Debug, PartialEq)]
struct HeadStore {
    /// `[block][dim][BLOCK]`.
    keys: Elems,
    /// `[position][dim]`.
    values: Elems,
    /// Q8: `[block][BLOCK]` key scales; empty otherwise.
    key_scales: Vec<f32>,
    /// Q8: `[position]` value scales; empty otherwise.
    value_scales: Vec<f32>,
}

/// A read-only view of one kv head of a layer: what the attention kernels read.
#[derive(Clone, Copy, Debug)]
pub struct KvHeadView<'a> {
    /// Values per key or value vector.
    pub head_dim: usize,
    /// Positions held.
    pub len: usize,
    /// Keys, `[block][dim][BLOCK]` (whole blocks: the last one zero past `len`).
    pub keys: ElemsRef<'a>,
    /// Values, `[position][dim]`.
    pub values: ElemsRef<'a>,
    /// Q8: key scales `[block][BLOCK]` (whole blocks); empty otherwise.
    pub key_scales: &'a [f32],
    /// Q8: value scales `[position]`; empty otherwise.
    pub value_scales: &'a [f32],
}

impl KvHeadView<'_> {
    /// The stored key of position `t`, dimension `d`, widened (before any scale).
    #[inline(always)]
    pub fn key(&self, t: usize, d: usize) -> f32 {
        self.keys
            .get((t / BLOCK) * self.head_dim * BLOCK + d * BLOCK + t % BLOCK)
    }
    /// The stored value of position `t`, dimension `d`, widened (before any scale).
    #[inline(always)]
    pub fn value(&self, t: usize, d: usize) -> f32 {
        self.values.get(t * self.head_dim + d)
    }
    /// The key vector of position `t` as f32 (scale applied: `d · q` at q8).
    pub fn key_f32(&self, t: usize) -> Vec<f32> {
        let s = if self.key_scales.is_empty() {
            1.0
        } else {
            self.key_scales[t]
        };
        (0..self.head_dim).map(|d| self.key(t, d) * s).collect()
    }
    /// The value vector of position `t` as f32 (scale applied at q8).
    pub fn value_f32(&self, t: usize) -> Vec<f32> {
        let s = if self.value_scales.is_empty() {
            1.0
        } else {
            self.value_scales[t]
        };
        (0..self.head_dim).map(|d| self.value(t, d) * s).collect()
    }
}

impl<'a> KvHeadView<'a> {
    /// The keys of positions `range` as f32 rows (`[position][dim]`), each element what
    /// [`KvHeadView::key_f32`] gives (exact at f32 and bf16, `d · q` at q8): the
    /// row-major form a per-row kernel such as [`crate::attend`] reads. Replaces the
    /// contents of `out`.
    ///
    /// # Panics
    /// If `range` reaches past [`KvHeadView::len`].
    pub fn keys_rows_into(&self, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "kv: keys of positions {range:?} asked of a head holding {}",
            self.len
        );
        let hd = self.head_dim;
        out.clear();
        out.resize(range.len() * hd, 0.0);
        for (row, t) in out.chunks_exact_mut(hd).zip(range) {
            let base = (t / BLOCK) * hd * BLOCK + t % BLOCK;
            match (self.keys, self.key_scales.is_empty()) {
                (ElemsRef::F32(k), _) => row
                    .iter_mut()
                    .enumerate()
                    .for_each(|(d, o)| *o = k[base + d * BLOCK]),
                (keys, true) => row
                    .iter_mut()
                    .enumerate()
                    .for_each(|(d, o)| *o = keys.get(base + d * BLOCK)),
                (keys, false) => {
                    let s = self.key_scales[t];
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(d, o)| *o = keys.get(base + d * BLOCK) * s)
                }
            }
        }
    }

    /// The values of positions `range` as f32 rows (`[position][dim]`), each element
    /// what [`KvHeadView::value_f32`] gives: borrowed from the store at f32 (values are
    /// kept row-major), widened into a new vector at bf16 and q8.
    ///
    /// # Panics
    /// If `range` reaches past [`KvHeadView::len`].
    pub fn values_rows(&self, range: std::ops::Range<usize>) -> std::borrow::Cow<'a, [f32]> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "kv: values of positions {range:?} asked of a head holding {}",
            self.len
        );
        let hd = self.head_dim;
        let elems = range.start * hd..range.end * hd;
        match self.values {
            ElemsRef::F32(v) => std::borrow::Cow::Borrowed(&v[elems]),
            values => {
                let scales = self.value_scales;
                std::borrow::Cow::Owned(
                    elems
                        .map(|i| match scales.is_empty() {
                            true => values.get(i),
                            false => values.get(i) * scales[i / hd],
                        })
                        .collect(),
                )
            }
        }
    }
}

/// The keys and values of one layer: every kv head, the same positions.
#[derive(Clone, Debug, PartialEq)]
pub struct KvLayer {
    kv_type: KvType,
    head_dim: usize,
    len: usize,
    heads: Vec<HeadStore>,
}

impl KvLayer {
    /// An empty layer of `kv_heads` heads of `head_dim` values.
    pub fn new(kv_type: KvType, kv_heads: usize, head_dim: usize) -> KvLayer {
        KvLayer {
            kv_type,
            head_dim,
            len: 0,
            heads: (0..kv_heads)
                .map(|_| HeadStore {
                    keys: Elems::new(kv_type),
                    values: Elems::new(kv_type),
                    key_scales: Vec::new(),
                    value_scales: Vec::new(),
                })
                .collect(),
        }
    }

    /// The storage type.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Kv heads.
    pub fn kv_heads(&self) -> usize {
        self.heads.len()
    }
    /// Values per head vector.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Appends `n` positions: `keys` and `values` are `n` rows of `kv_heads · head_dim`
    /// (head `h` of row `i` at `i · kv_heads · head_dim + h · head_dim`).
    ///
    /// # Panics
    /// If the slices are not `n` such rows.
    pub fn append(&mut self, keys: &[f32], values: &[f32], n: usize) {
        let (hd, heads) = (self.head_dim, self.heads.len());
        let width = heads * hd;
        assert_eq!(keys.len(), n * width, "kv: keys are not n rows");
        assert_eq!(values.len(), n * width, "kv: values are not n rows");
        let mut codes = vec![0i8; hd];
        for i in 0..n {
            let t = self.len + i;
            let (block, slot) = (t / BLOCK, t % BLOCK);
            for (h, store) in self.heads.iter_mut().enumerate() {
                let k = &keys[i * width + h * hd..i * width + (h + 1) * hd];
                let v = &values[i * width + h * hd..i * width + (h + 1) * hd];
                if slot == 0 {
                    store.keys.resize((block + 1) * hd * BLOCK);
                    if self.kv_type == KvType::Q8 {
                        store.key_scales.resize((block + 1) * BLOCK, 0.0);
                    }
                }
                let at = |d: usize| block * hd * BLOCK + d * BLOCK + slot;
                match &mut store.keys {
                    Elems::F32(s) => k.iter().enumerate().for_each(|(d, &x)| s[at(d)] = x),
                    Elems::Bf16(s) => k
                        .iter()
                        .enumerate()
                        .for_each(|(d, &x)| s[at(d)] = bf16::from_f32(x).to_bits()),
                    Elems::Q8(s) => {
                        store.key_scales[t] = crate::q8::quantize_group(k, &mut codes);
                        codes.iter().enumerate().for_each(|(d, &c)| s[at(d)] = c);
                    }
                }
                match &mut store.values {
                    Elems::F32(s) => s.extend_from_slice(v),
                    Elems::Bf16(s) => s.extend(v.iter().map(|&x| bf16::from_f32(x).to_bits())),
                    Elems::Q8(s) => {
                        store
                            .value_scales
                            .push(crate::q8::quantize_group(v, &mut codes));
                        s.extend_from_slice(&codes);
                    }
                }
            }
        }
        self.len += n;
    }

    /// Keeps the first `len` positions (no-op if `len >= self.len()`). The result equals,
    /// byte for byte, a layer that was only ever given those positions.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let hd = self.head_dim;
        let blocks = len.div_ceil(BLOCK);
        for store in &mut self.heads {
            store.keys.resize(blocks * hd * BLOCK);
            store.values.resize(len * hd);
            store.value_scales.truncate(len);
            if self.kv_type == KvType::Q8 {
                store.key_scales.resize(blocks * BLOCK, 0.0);
            }
            // Zero the dropped slots of the last kept block, as a fresh block is.
            let slot = len % BLOCK;
            if slot != 0 {
                let base = (blocks - 1) * hd * BLOCK;
                for d in 0..hd {
                    store
                        .keys
                        .zero(base + d * BLOCK + slot..base + (d + 1) * BLOCK);
                }
                if self.kv_type == KvType::Q8 {
                    store.key_scales[(blocks - 1) * BLOCK + slot..].fill(0.0);
                }
            }
        }
        self.len = len;
    }

    /// A view of kv head `h`.
    pub fn head(&self, h: usize) -> KvHeadView<'_> {
        let s = &self.heads[h];
        KvHeadView {
            head_dim: self.head_dim,
            len: self.len,
            keys: s.keys.view(),
            values: s.values.view(),
            key_scales: &s.key_scales,
            value_scales: &s.value_scales,
        }
    }

    /// Bytes held (keys, values and scales; allocated blocks, not capacity).
    pub fn byte_len(&self) -> usize {
        self.heads
            .iter()
            .map(|s| {
                s.keys.byte_len()
                    + s.values.byte_len()
                    + 4 * (s.key_scales.len() + s.value_scales.len())
            })
            .sum()
    }

    /// Bytes allocated (keys, values and scales at their capacity: what the process
    /// holds, which [`KvLayer::truncate`] keeps for reuse).
    pub fn capacity_bytes(&self) -> usize {
        self.heads
            .iter()
            .map(|s| {
                s.keys.capacity_bytes()
                    + s.values.capacity_bytes()
                    + 4 * (s.key_scales.capacity() + s.value_scales.capacity())
            })
            .sum()
    }

    /// Empties the layer and gives its memory back (a fresh layer of the same shape).
    pub fn release(&mut self) {
        *self = KvLayer::new(self.kv_type, self.heads.len(), self.head_dim);
    }

    /// Elements allocated for keys of head `h` (whole blocks), for tests.
    pub fn key_elements(&self, h: usize) -> usize {
        self.heads[h].keys.len()
    }
}

/// A model's KV cache: one [`KvLayer`] per layer.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    layers: Vec<KvLayer>,
}

impl KvCache {
    /// An empty cache.
    pub fn new(kv_type: KvType, layers: usize, kv_heads: usize, head_dim: usize) -> KvCache {
        KvCache {
            layers: (0..layers)
                .map(|_| KvLayer::new(kv_type, kv_heads, head_dim))
                .collect(),
        }
    }
    /// The storage type.
    pub fn kv_type(&self) -> KvType {
        self.layers.first().map_or(KvType::F32, KvLayer::kv_type)
    }
    /// Positions every layer holds (a pass appends to each layer in turn).
    pub fn len(&self) -> usize {
        self.layers.iter().map(KvLayer::len).min().unwrap_or(0)
    }
    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Layer `l`.
    pub fn layer(&self, l: usize) -> &KvLayer {
        &self.layers[l]
    }
    /// Layer `l`, to append to.
    pub fn layer_mut(&mut self, l: usize) -> &mut KvLayer {
        &mut self.layers[l]
    }
    /// Keeps the first `len` positions of every layer.
    pub fn truncate(&mut self, len: usize) {
        self.layers.iter_mut().for_each(|l| l.truncate(len));
    }
    /// Bytes held by every layer.
    pub fn byte_len(&self) -> usize {
        self.layers.iter().map(KvLayer::byte_len).sum()
    }
    /// Bytes allocated by every layer (truncated positions included).
    pub fn capacity_bytes(&self) -> usize {
        self.layers.iter().map(KvLayer::capacity_bytes).sum()
    }
    /// Empties every layer and gives the memory back.
    pub fn release(&mut self) {
        self.layers.iter_mut().for_each(KvLayer::release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` rows of 2 heads × 8 values, distinct per position.
    fn rows(first: usize, n: usize) -> Vec<f32> {
        (0..n * 16)
            .map(|i| (first * 16 + i) as f32 * 0.01)
            .collect()
    }

    #[test]
    fn release_gives_the_memory_back_and_truncate_keeps_it() {
        for kv_type in [KvType::F32, KvType::Bf16, KvType::Q8] {
            let mut cache = KvCache::new(kv_type, 2, 2, 8);
            assert_eq!(cache.capacity_bytes(), 0, "{kv_type:?}: a new cache");
            for l in 0..2 {
                cache.layer_mut(l).append(&rows(0, 40), &rows(1, 40), 40);
            }
            let held = cache.capacity_bytes();
            assert!(held >= cache.byte_len() && held > 0, "{kv_type:?}");
            cache.truncate(0);
            assert_eq!(cache.capacity_bytes(), held, "{kv_type:?}: truncate keeps");
            cache.release();
            assert_eq!((cache.len(), cache.capacity_bytes()), (0, 0), "{kv_type:?}");
            // A released cache is a new one: the same positions give the same bytes.
            let mut fresh = KvCache::new(kv_type, 2, 2, 8);
            for c in [&mut cache, &mut fresh] {
                for l in 0..2 {
                    c.layer_mut(l).append(&rows(3, 5), &rows(4, 5), 5);
                }
            }
            assert_eq!(cache, fresh, "{kv_type:?}");
        }
    }
}
