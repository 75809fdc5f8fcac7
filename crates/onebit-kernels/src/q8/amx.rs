//! The AMX variant of the `q8` family: the exact integer sums of [`super::reference`]
//! by tile instructions (`tdpbsud` for q4 codes, `tdpbssd` for the int8 head), then the
//! reference's f32 sequence per element, so it equals the reference bit for bit.
//!
//! The kernel is written once, over the [`Tiles`] trait, and runs on two
//! implementations: [`Hardware`] (a few lines of `asm!` per instruction, only where
//! [`Isa::amx`] is set) and [`Emulator`] (plain Rust with the instructions' documented
//! semantics), so its packing, blocking and epilogue are tested on every machine and the
//! only layer a machine without AMX cannot test is the `asm!` itself.
//!
//! Layout of one group step (32 columns, the scale group) for `m ≤ 16` level rows:
//! - tile A (`m × 32` bytes): the level rows' codes of the group, loaded straight from
//!   [`QuantizedRows`] with the row stride K;
//! - tiles B (8 × 64 bytes each): 16 output rows × 32 columns in the "four consecutive
//!   columns of one output row in a dword" order the dot-product instructions read. The
//!   int8 head's packing is already that order (loaded from the weights); a q4 half-block
//!   is decoded from its nibbles into a staging buffer (low nibbles are columns
//!   `8q..8q+4`, B row `2q`; high nibbles `8q+4..8q+8`, B row `2q+1`);
//! - tiles C (`m × 64` bytes): the exact group sums, stored and folded over the levels
//!   (`128 · level0 + level1`) by the f32 epilogue.
//!
//! **Overflow bound.** C is zeroed for every group, so a C element holds one level row's
//! sum over 32 columns: at most `32 · 15 · 127 = 60,960` in magnitude for q4 codes and
//! `32 · 127 · 127 = 516,128` for int8 weights. Folding two levels gives at most
//! `128 · 516,128 + 32 · 127 · 64 = 66,325,248 < 2^31`: every sum is exact in i32.

use super::{I8Matrix, Out, PackedQ4, QuantizedRows, BLOCK_ROWS, GROUP};
use super::{I8_BLOCK_ROWS, I8_GROUP_BYTES, Q4_GROUP_BYTES};
use crate::isa::Isa;

/// Level rows per tile sweep: a tile's rows.
pub const TILE_ROWS: usize = 16;
/// Bytes per tile row.
pub const TILE_ROW_BYTES: usize = 64;

/// The tile registers the kernels use, in sets that steps take in turn so that a step's
/// dot product runs while earlier steps' sums are stored and folded (a tile store waits
/// for its dot product, the unit works on its own, and a load or a zeroing waits for
/// any dot product still reading the tile it would overwrite). The int8 kernel turns
/// over two sets, the q4 kernel three B and C tiles (and an A tile per group parity).
const A_EVEN: u8 = 0;
const A_ODD: u8 = 1;
const B_EVEN: u8 = 2;
const B_ODD: u8 = 3;
const C_EVEN: u8 = 4;
const C_ODD: u8 = 5;
const B_THIRD: u8 = 6;
const C_THIRD: u8 = 7;

/// A palette-1 tile configuration: rows and bytes per row of each of the 8 tiles
/// (`ldtilecfg`'s 64-byte operand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig {
    /// Rows of each tile (0: unused).
    pub rows: [u8; 8],
    /// Bytes per row of each tile (0: unused).
    pub colsb: [u16; 8],
}

impl TileConfig {
    /// The 64-byte memory operand of `ldtilecfg`: palette 1, start row 0, then the bytes
    /// per row of tiles 0–7 (u16 at offset 16) and their rows (u8 at offset 48).
    pub fn encode(&self) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for t in 0..8 {
            bytes[16 + 2 * t..18 + 2 * t].copy_from_slice(&self.colsb[t].to_le_bytes());
            bytes[48 + t] = self.rows[t];
        }
        bytes
    }
}

/// Which operands of a tile dot product are signed (`tdpb{s,u}{s,u}d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dot {
    /// `tdpbssd`: signed A, signed B.
    Ssd,
    /// `tdpbsud`: signed A, unsigned B.
    Sud,
    /// `tdpbusd`: unsigned A, signed B.
    Usd,
    /// `tdpbuud`: unsigned A, unsigned B.
    Uud,
}

impl Dot {
    /// Every dot product.
    pub const ALL: [Dot; 4] = [Dot::Ssd, Dot::Sud, Dot::Usd, Dot::Uud];

    /// Whether A's bytes, then B's, are signed.
    pub fn signed(self) -> (bool, bool) {
        match self {
            Dot::Ssd => (true, true),
            Dot::Sud => (true, false),
            Dot::Usd => (false, true),
            Dot::Uud => (false, false),
        }
    }
}

/// The tile instructions the kernel needs. Tile registers are const parameters because
/// the instructions encode them.
///
/// # Safety
/// Every method is unsafe: memory operands must be valid for the configured shape (rows
/// at `stride` apart, `colsb` bytes each), and a tile must be configured before use.
pub trait Tiles {
    /// `ldtilecfg`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn configure(&mut self, config: &TileConfig);
    /// `tileloadd tmmT, [src + stride·row]`.
    ///
    /// # Safety
    /// `src + r·stride .. + colsb` readable for every configured row `r`.
    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize);
    /// `tilestored [dst + stride·row], tmmT`.
    ///
    /// # Safety
    /// `dst + r·stride .. + colsb` writable for every configured row `r`.
    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize);
    /// `tilezero tmmT`.
    ///
    /// # Safety
    /// The tile is configured.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tdpbssd` or `tdpbsud` (the kernel's two): C += A · B by dwords of four products.
    ///
    /// # Safety
    /// The three tiles are configured with consistent shapes.
    unsafe fn dot<const C: u8, const TA: u8, const TB: u8>(&mut self, op: Dot);

    /// The 16-lane vector arithmetic of the epilogue beside this tile unit.
    type Lanes: Lanes;
}

/// Sixteen-lane f32 and i32 vectors, as the epilogue uses them. Each operation is one
/// IEEE operation per lane (a rounded product, a fused multiply-add, a rounded sum, an
/// exact conversion), so every implementation gives the same bits: [`Portable`] with
/// plain Rust beside the emulator, [`Avx512`] (one instruction each) beside the hardware.
///
/// # Safety
/// The methods are unsafe because an implementation may need CPU features (the
/// caller's token guarantees them) and the pointer forms read or write 64 bytes.
pub trait Lanes {
    /// Sixteen f32.
    type F: Copy;
    /// Sixteen i32.
    type I: Copy;
    /// All lanes zero.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn zero() -> Self::F;
    /// Every lane `v`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn splat(v: f32) -> Self::F;
    /// Sixteen i32 from `p`.
    ///
    /// # Safety
    /// `p` readable for 64 bytes.
    unsafe fn load_i(p: *const i32) -> Self::I;
    /// Sixteen f32 from `p` (unaligned, little-endian).
    ///
    /// # Safety
    /// `p` readable for 64 bytes.
    unsafe fn load_f(p: *const u8) -> Self::F;
    /// Sixteen bf16 at `p` widened to f32 (exact).
    ///
    /// # Safety
    /// `p` readable for 32 bytes.
    unsafe fn load_bf16(p: *const u8) -> Self::F;
    /// Writes the lanes to `out`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn store(v: Self::F, out: &mut [f32; 16]);
    /// `(high << 7) + low` (exact within the module's overflow bound).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn fold(high: Self::I, low: Self::I) -> Self::I;
    /// Each lane converted to f32 (exact below 2^24, rounded to nearest above).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn to_f32(v: Self::I) -> Self::F;
    /// `a · b`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, rounded once.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `a + b`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
}

/// [`Lanes`] in plain Rust, lane by lane (beside the emulator).
#[derive(Clone, Copy, Debug)]
pub struct Portable;

impl Lanes for Portable {
    type F = [f32; 16];
    type I = [i32; 16];
    unsafe fn zero() -> [f32; 16] {
        [0.0; 16]
    }
    unsafe fn splat(v: f32) -> [f32; 16] {
        [v; 16]
    }
    unsafe fn load_i(p: *const i32) -> [i32; 16] {
        // SAFETY: the caller guarantees 64 readable bytes.
        unsafe { p.cast::<[i32; 16]>().read_unaligned() }
    }
    unsafe fn load_f(p: *const u8) -> [f32; 16] {
        // SAFETY: as above.
        unsafe { p.cast::<[f32; 16]>().read_unaligned() }
    }
    unsafe fn load_bf16(p: *const u8) -> [f32; 16] {
        // SAFETY: the caller guarantees 32 readable bytes.
        let halves = unsafe { p.cast::<[u16; 16]>().read_unaligned() };
        halves.map(|h| f32::from_bits((h as u32) << 16))
    }
    unsafe fn store(v: [f32; 16], out: &mut [f32; 16]) {
        *out = v;
    }
    unsafe fn fold(high: [i32; 16], low: [i32; 16]) -> [i32; 16] {
        std::array::from_fn(|n| (high[n] << 7) + low[n])
    }
    unsafe fn to_f32(v: [i32; 16]) -> [f32; 16] {
        v.map(|i| i as f32)
    }
    unsafe fn mul(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|n| a[n] * b[n])
    }
    unsafe fn fma(a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|n| a[n].mul_add(b[n], c[n]))
    }
    unsafe fn add(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|n| a[n] + b[n])
    }
}

/// [`Lanes`] as AVX-512 registers (beside the hardware tile unit, which implies AVX-512).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub struct Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512_lanes {
    use super::{Avx512, Lanes};
    use std::arch::x86_64::*;

    impl Lanes for Avx512 {
        type F = __m512;
        type I = __m512i;
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn zero() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn splat(v: f32) -> __m512 {
            _mm512_set1_ps(v)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_i(p: *const i32) -> __m512i {
            // SAFETY: the caller guarantees 64 readable bytes.
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_f(p: *const u8) -> __m512 {
            // SAFETY: as above.
            unsafe { _mm512_loadu_ps(p.cast()) }
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_bf16(p: *const u8) -> __m512 {
            // SAFETY: the caller guarantees 32 readable bytes.
            let h = unsafe { _mm256_loadu_si256(p.cast()) };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn store(v: __m512, out: &mut [f32; 16]) {
            // SAFETY: `out` is 64 writable bytes.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) }
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn fold(high: __m512i, low: __m512i) -> __m512i {
            _mm512_add_epi32(_mm512_slli_epi32::<7>(high), low)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn to_f32(v: __m512i) -> __m512 {
            _mm512_cvtepi32_ps(v)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
    }
}

/// A plain-Rust model of the tile unit: eight 16 × 64-byte tiles and the configuration,
/// with the semantics of the instructions as Intel's SDM defines them (bytes past a row's
/// `colsb` and rows past a tile's `rows` read as and are written as zero; dword sums wrap).
/// A shape the hardware would fault on panics here.
#[derive(Clone, Debug)]
pub struct Emulator {
    config: Option<TileConfig>,
    tiles: [[[u8; TILE_ROW_BYTES]; TILE_ROWS]; 8],
}

impl Default for Emulator {
    fn default() -> Emulator {
        Emulator {
            config: None,
            tiles: [[[0; TILE_ROW_BYTES]; TILE_ROWS]; 8],
        }
    }
}

impl Emulator {
    /// A tile's configured shape (rows, bytes per row).
    ///
    /// # Panics
    /// If no configuration is loaded or the tile is unused in it (the hardware faults).
    fn shape(&self, tile: u8) -> (usize, usize) {
        let config = self
            .config
            .expect("amx emulator: tile used before ldtilecfg");
        let (rows, colsb) = (
            config.rows[tile as usize] as usize,
            config.colsb[tile as usize] as usize,
        );
        assert!(
            rows > 0 && colsb > 0,
            "amx emulator: tile {tile} is not configured"
        );
        (rows, colsb)
    }

    /// A tile's bytes (all 16 rows of 64; zero outside the configured shape).
    pub fn tile(&self, tile: u8) -> &[[u8; TILE_ROW_BYTES]; TILE_ROWS] {
        &self.tiles[tile as usize]
    }

    /// The dword dot product `DPB*D` of the SDM: four byte products of one A dword and
    /// one B dword, each byte sign- or zero-extended as `op` says, summed.
    fn dword_dot(op: Dot, a: [u8; 4], b: [u8; 4]) -> i32 {
        let (a_signed, b_signed) = op.signed();
        let widen = |v: u8, signed: bool| if signed { v as i8 as i32 } else { v as i32 };
        (0..4)
            .map(|i| widen(a[i], a_signed) * widen(b[i], b_signed))
            .sum()
    }
}

impl Tiles for Emulator {
    type Lanes = Portable;

    unsafe fn configure(&mut self, config: &TileConfig) {
        for t in 0..8 {
            assert!(
                config.rows[t] as usize <= TILE_ROWS && config.colsb[t] as usize <= TILE_ROW_BYTES,
                "amx emulator: tile {t} larger than 16 × 64 bytes"
            );
        }
        // ldtilecfg zeroes every tile.
        self.tiles = [[[0; TILE_ROW_BYTES]; TILE_ROWS]; 8];
        self.config = Some(*config);
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        let tile = &mut self.tiles[T as usize];
        *tile = [[0; TILE_ROW_BYTES]; TILE_ROWS];
        for (r, row) in tile.iter_mut().enumerate().take(rows) {
            // SAFETY: the caller guarantees the configured rows are readable.
            let bytes = unsafe { std::slice::from_raw_parts(src.add(r * stride), colsb) };
            row[..colsb].copy_from_slice(bytes);
        }
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        for (r, row) in self.tiles[T as usize].iter().enumerate().take(rows) {
            // SAFETY: the caller guarantees the configured rows are writable.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst.add(r * stride), colsb) };
            bytes.copy_from_slice(&row[..colsb]);
        }
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.shape(T);
        self.tiles[T as usize] = [[0; TILE_ROW_BYTES]; TILE_ROWS];
    }

    unsafe fn dot<const C: u8, const TA: u8, const TB: u8>(&mut self, op: Dot) {
        let (c_rows, c_colsb) = self.shape(C);
        let (a_rows, a_colsb) = self.shape(TA);
        let (b_rows, b_colsb) = self.shape(TB);
        assert!(
            a_colsb % 4 == 0 && a_colsb / 4 == b_rows && c_rows == a_rows && c_colsb == b_colsb,
            "amx emulator: inconsistent shapes C {c_rows}x{c_colsb}, A {a_rows}x{a_colsb}, \
             B {b_rows}x{b_colsb}"
        );
        let (a, b) = (self.tiles[TA as usize], self.tiles[TB as usize]);
        let mut c = [[0u8; TILE_ROW_BYTES]; TILE_ROWS];
        for (m, c_row) in c.iter_mut().enumerate().take(c_rows) {
            let old = &self.tiles[C as usize][m];
            for n in 0..c_colsb / 4 {
                let mut acc = i32::from_le_bytes(old[4 * n..4 * n + 4].try_into().unwrap());
                for k in 0..a_colsb / 4 {
                    let a_dword = a[m][4 * k..4 * k + 4].try_into().unwrap();
                    let b_dword = b[k][4 * n..4 * n + 4].try_into().unwrap();
                    acc = acc.wrapping_add(Self::dword_dot(op, a_dword, b_dword));
                }
                c_row[4 * n..4 * n + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
        self.tiles[C as usize] = c;
    }
}

/// The tile unit itself, through `asm!`. Only [`Hardware::new`] makes one, from an
/// [`Isa`] with the `amx` bit (which detection sets only after the OS granted the tile
/// state), so no safe code can reach a tile instruction on a CPU or OS without AMX.
#[cfg(target_arch = "x86_64")]
#[derive(Debug)]
pub struct Hardware {
    _private: (),
}

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// The configuration this thread last loaded (`ldtilecfg` costs about 100 ns, and a
    /// pass makes thousands of kernel calls with one shape). The tile state is the
    /// thread's own and survives context switches (the kernel saves it), and nothing but
    /// this module loads or releases tiles.
    static LOADED: std::cell::Cell<Option<TileConfig>> = const { std::cell::Cell::new(None) };
}

#[cfg(target_arch = "x86_64")]
impl Hardware {
    /// The tile unit, if `isa` has AMX.
    pub fn new(isa: Isa) -> Option<Hardware> {
        isa.amx().then_some(Hardware { _private: () })
    }
}

#[cfg(target_arch = "x86_64")]
impl Tiles for Hardware {
    type Lanes = Avx512;

    unsafe fn configure(&mut self, config: &TileConfig) {
        if LOADED.get() == Some(*config) {
            return;
        }
        let bytes = config.encode();
        // SAFETY: a `Hardware` exists only when AMX is usable; the operand is 64 bytes.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) bytes.as_ptr(), options(nostack, readonly));
        }
        LOADED.set(Some(*config));
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        // SAFETY: the caller guarantees the configured rows are readable.
        unsafe {
            std::arch::asm!(
                "tileloadd tmm{t}, [{src} + {stride}*1]",
                t = const T, src = in(reg) src, stride = in(reg) stride,
                options(nostack, preserves_flags),
            );
        }
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        // SAFETY: the caller guarantees the configured rows are writable.
        unsafe {
            std::arch::asm!(
                "tilestored [{dst} + {stride}*1], tmm{t}",
                t = const T, dst = in(reg) dst, stride = in(reg) stride,
                options(nostack, preserves_flags),
            );
        }
    }

    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: AMX is usable and the tile configured (the caller).
        unsafe { std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
    }

    unsafe fn dot<const C: u8, const TA: u8, const TB: u8>(&mut self, op: Dot) {
        // SAFETY: AMX is usable and the shapes consistent (the caller).
        unsafe {
            match op {
                Dot::Ssd => std::arch::asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}",
                    c = const C, a = const TA, b = const TB, options(nostack, nomem)),
                Dot::Sud => std::arch::asm!("tdpbsud tmm{c}, tmm{a}, tmm{b}",
                    c = const C, a = const TA, b = const TB, options(nostack, nomem)),
                Dot::Usd => std::arch::asm!("tdpbusd tmm{c}, tmm{a}, tmm{b}",
                    c = const C, a = const TA, b = const TB, options(nostack, nomem)),
                Dot::Uud => std::arch::asm!("tdpbuud tmm{c}, tmm{a}, tmm{b}",
                    c = const C, a = const TA, b = const TB, options(nostack, nomem)),
            }
        }
    }
}

/// Runs one full-size (16 × 64-byte) dot product `c + a · b` on `tiles` and returns the
/// result: the instruction-level check of an implementation (the emulator against its
/// definition, the hardware against the emulator).
pub fn dot_tiles<T: Tiles>(
    tiles: &mut T,
    op: Dot,
    a: &[[u8; TILE_ROW_BYTES]; TILE_ROWS],
    b: &[[u8; TILE_ROW_BYTES]; TILE_ROWS],
    c: &[[u8; TILE_ROW_BYTES]; TILE_ROWS],
) -> [[u8; TILE_ROW_BYTES]; TILE_ROWS] {
    let config = TileConfig {
        rows: [16, 16, 16, 16, 0, 0, 0, 0],
        colsb: [64, 64, 64, 64, 0, 0, 0, 0],
    };
    let mut out = [[0u8; TILE_ROW_BYTES]; TILE_ROWS];
    // SAFETY: every buffer is 16 rows of 64 bytes, the configured shape.
    unsafe {
        tiles.configure(&config);
        tiles.load::<0>(a.as_ptr().cast(), TILE_ROW_BYTES);
        tiles.load::<1>(b.as_ptr().cast(), TILE_ROW_BYTES);
        tiles.load::<2>(c.as_ptr().cast(), TILE_ROW_BYTES);
        tiles.dot::<2, 0, 1>(op);
        tiles.store::<2>(out.as_mut_ptr().cast(), TILE_ROW_BYTES);
    }
    out
}

/// Input rows per sweep: eight input rows' accumulators (two 16-lane halves each for
/// q4) stay in vector registers.
const SWEEP_INPUTS: usize = 8;

/// One C tile's sums: 16 level rows of 16 outputs.
type Sums = [[i32; 16]; TILE_ROWS];

/// A decoded q4 half-block group in B-tile order: 8 rows of 64 bytes.
type Stage = [[u8; TILE_ROW_BYTES]; GROUP / 4];

/// How many groups ahead the first sweep of a q4 block asks for its weights.
const PREFETCH_GROUPS: usize = 8;

/// Steps a q4 sweep keeps in flight.
const DEPTH: usize = 3;

/// Decoded B tiles in memory: one per step in flight and the one decoded ahead of them
/// (a tile load of freshly stored bytes waits for the stores to complete, so a step's
/// weights are decoded an iteration before its tile is loaded).
const STAGES: usize = DEPTH + 1;

/// Decoded weights and stored sums: 64-byte aligned so tile loads and stores touch
/// whole lines. Sums are folded an iteration after their tile is stored, for the same
/// reason as [`STAGES`].
#[repr(C, align(64))]
struct Scratch {
    b: [Stage; STAGES],
    c: [Sums; 2],
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            b: [[[0; TILE_ROW_BYTES]; GROUP / 4]; STAGES],
            c: [[[0; 16]; TILE_ROWS]; 2],
        }
    }
}

/// The A tiles of a call, staged once per matmul for all its tasks: for each sweep of
/// up to [`SWEEP_INPUTS`] input rows and each group, 16 rows of 32 codes (the sweep's
/// level rows, then zero rows). Every tile then has one shape whatever the row count,
/// so a thread loads its tile configuration once (it costs about 100 ns) rather than
/// for every sweep of a different height.
pub(super) struct StagedRows {
    data: Vec<u8>,
    groups: usize,
}

/// Bytes of one staged A tile.
const A_TILE_BYTES: usize = TILE_ROWS * GROUP;

impl StagedRows {
    /// Stages `x` into `buffer`'s allocation (reused from call to call).
    pub(super) fn new(x: &QuantizedRows, mut buffer: Vec<u8>) -> StagedRows {
        let (k, groups, levels) = (x.cols(), x.cols() / GROUP, x.levels().count());
        let sweeps = x.rows().div_ceil(SWEEP_INPUTS);
        buffer.clear();
        buffer.resize(sweeps * groups * A_TILE_BYTES, 0);
        for (s, sweep) in buffer.chunks_exact_mut(groups * A_TILE_BYTES).enumerate() {
            let first = s * SWEEP_INPUTS * levels;
            let count = (x.level_rows() - first).min(SWEEP_INPUTS * levels);
            for (g, tile) in sweep.chunks_exact_mut(A_TILE_BYTES).enumerate() {
                for (r, row) in tile.chunks_exact_mut(GROUP).take(count).enumerate() {
                    let codes = &x.codes(first + r)[g * GROUP..(g + 1) * GROUP];
                    for (dst, &c) in row.iter_mut().zip(codes) {
                        *dst = c as u8;
                    }
                }
            }
        }
        debug_assert_eq!(k, groups * GROUP);
        StagedRows {
            data: buffer,
            groups,
        }
    }

    /// Sweep `s`'s A tile of group `g` (16 rows of 32 bytes).
    fn tile(&self, s: usize, g: usize) -> &[u8; A_TILE_BYTES] {
        let at = (s * self.groups + g) * A_TILE_BYTES;
        self.data[at..at + A_TILE_BYTES].try_into().expect("a tile")
    }

    /// The buffer, for reuse.
    pub(super) fn into_buffer(self) -> Vec<u8> {
        self.data
    }
}

/// The one configuration the kernels use: A tiles 16 × 32 bytes, B tiles 8 × 64, C
/// tiles 16 × 64.
fn config() -> TileConfig {
    let mut c = TileConfig {
        rows: [0; 8],
        colsb: [0; 8],
    };
    for (tile, rows, colsb) in [
        (A_EVEN, TILE_ROWS, GROUP),
        (A_ODD, TILE_ROWS, GROUP),
        (B_EVEN, GROUP / 4, TILE_ROW_BYTES),
        (B_ODD, GROUP / 4, TILE_ROW_BYTES),
        (C_EVEN, TILE_ROWS, TILE_ROW_BYTES),
        (C_ODD, TILE_ROWS, TILE_ROW_BYTES),
        (B_THIRD, GROUP / 4, TILE_ROW_BYTES),
        (C_THIRD, TILE_ROWS, TILE_ROW_BYTES),
    ] {
        c.rows[tile as usize] = rows as u8;
        c.colsb[tile as usize] = colsb as u16;
    }
    c
}

/// Decodes half `h` of a q4 group's nibbles (16 output rows) into B-tile order: low
/// nibbles of quad `q` are columns `8q..8q+4` (B row `2q`), high nibbles `8q+4..8q+8`
/// (row `2q+1`).
#[inline(always)]
fn decode_q4_half(p: &[u8], h: usize, stage: &mut Stage) {
    for q in 0..GROUP / 8 {
        let nibbles: &[u8; 64] = p[(4 * h + q) * 64..(4 * h + q + 1) * 64]
            .try_into()
            .expect("64 bytes");
        for t in 0..64 {
            stage[2 * q][t] = nibbles[t] & 0x0f;
            stage[2 * q + 1][t] = nibbles[t] >> 4;
        }
    }
}

/// Decodes step `j`'s weights (half `j mod 2` of group `j / 2`) into `stage`.
#[inline(always)]
fn decode_q4_step(w: &PackedQ4, b: usize, s: usize, j: usize, stage: &mut Stage) {
    let (g, h) = (j / 2, j % 2);
    let bytes = w.group_bytes(b, g);
    // The first sweep streams the block's weights: ask for them a few groups ahead, as
    // the AVX-512 VNNI kernel does (harmless past the matrix's end).
    #[cfg(target_arch = "x86_64")]
    if s == 0 && h == 0 {
        crate::prefetch_bytes(
            bytes
                .as_ptr()
                .wrapping_add(PREFETCH_GROUPS * Q4_GROUP_BYTES),
            Q4_GROUP_BYTES,
        );
    }
    let _ = s;
    decode_q4_half(bytes, h, stage);
}

/// Issues step `j` of a q4 sweep: its group's A tile (on the group's first half), its
/// decoded B tile (`stage`) and its dot product, into the tiles of its turn (`j mod 3`;
/// A by the group's parity).
///
/// # Safety
/// `tiles` usable and configured by [`config`].
#[inline(always)]
unsafe fn issue_q4<T: Tiles>(
    tiles: &mut T,
    staged: &StagedRows,
    s: usize,
    j: usize,
    stage: &Stage,
) {
    let (g, h) = (j / 2, j % 2);
    let a = staged.tile(s, g);
    let first = h == 0;
    // SAFETY: the caller's guarantees.
    unsafe {
        match (j % DEPTH, g % 2) {
            (0, 0) => q4_step::<T, A_EVEN, B_EVEN, C_EVEN>(tiles, a, first, stage),
            (0, _) => q4_step::<T, A_ODD, B_EVEN, C_EVEN>(tiles, a, first, stage),
            (1, 0) => q4_step::<T, A_EVEN, B_ODD, C_ODD>(tiles, a, first, stage),
            (1, _) => q4_step::<T, A_ODD, B_ODD, C_ODD>(tiles, a, first, stage),
            (_, 0) => q4_step::<T, A_EVEN, B_THIRD, C_THIRD>(tiles, a, first, stage),
            (_, _) => q4_step::<T, A_ODD, B_THIRD, C_THIRD>(tiles, a, first, stage),
        }
    }
}

/// One q4 step on the given tiles: A loaded when `load_a`, then `C = A · B`.
///
/// # Safety
/// `tiles` usable and configured by [`config`].
#[inline(always)]
unsafe fn q4_step<T: Tiles, const TA: u8, const TB: u8, const TC: u8>(
    tiles: &mut T,
    a: &[u8; A_TILE_BYTES],
    load_a: bool,
    stage: &Stage,
) {
    // SAFETY: `a` is 16 rows of 32 bytes, `stage` 8 rows of 64: the configured shapes.
    unsafe {
        if load_a {
            tiles.load::<TA>(a.as_ptr(), GROUP);
        }
        tiles.load::<TB>(stage.as_ptr().cast(), TILE_ROW_BYTES);
        tiles.zero::<TC>();
        tiles.dot::<TC, TA, TB>(Dot::Sud);
    }
}

/// Stores step `j`'s C tile into `c`.
///
/// # Safety
/// `tiles` usable and configured by [`config`].
#[inline(always)]
unsafe fn retire<T: Tiles>(tiles: &mut T, j: usize, c: &mut Sums) {
    let c = c.as_mut_ptr().cast();
    // SAFETY: `c` is 16 rows of 64 bytes, the C tiles' shape.
    unsafe {
        match j % DEPTH {
            0 => tiles.store::<C_EVEN>(c, TILE_ROW_BYTES),
            1 => tiles.store::<C_ODD>(c, TILE_ROW_BYTES),
            _ => tiles.store::<C_THIRD>(c, TILE_ROW_BYTES),
        }
    }
}

/// Calls `$f::<T, O, L>` for the sweep's input count `O` (1 to [`SWEEP_INPUTS`]) and
/// the level count `L`, so the accumulators are fixed-size arrays the compiler keeps in
/// registers.
macro_rules! by_shape {
    ($f:ident, $inputs:expr, $levels:expr, ($($arg:expr),*)) => {
        match ($levels, $inputs) {
            (1, 1) => $f::<T, 1, 1>($($arg),*),
            (1, 2) => $f::<T, 2, 1>($($arg),*),
            (1, 3) => $f::<T, 3, 1>($($arg),*),
            (1, 4) => $f::<T, 4, 1>($($arg),*),
            (1, 5) => $f::<T, 5, 1>($($arg),*),
            (1, 6) => $f::<T, 6, 1>($($arg),*),
            (1, 7) => $f::<T, 7, 1>($($arg),*),
            (1, _) => $f::<T, 8, 1>($($arg),*),
            (_, 1) => $f::<T, 1, 2>($($arg),*),
            (_, 2) => $f::<T, 2, 2>($($arg),*),
            (_, 3) => $f::<T, 3, 2>($($arg),*),
            (_, 4) => $f::<T, 4, 2>($($arg),*),
            (_, 5) => $f::<T, 5, 2>($($arg),*),
            (_, 6) => $f::<T, 6, 2>($($arg),*),
            (_, 7) => $f::<T, 7, 2>($($arg),*),
            (_, _) => $f::<T, 8, 2>($($arg),*),
        }
    };
}

/// One 32-row q4 block for every input row, by `tiles`: the AMX variant's whole logic.
///
/// # Safety
/// `tiles` must be usable (an [`Emulator`], or [`Hardware`] made from a detected token);
/// `staged` is `x` staged.
#[inline(always)]
pub(super) unsafe fn block_q4<T: Tiles>(
    tiles: &mut T,
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    out: &mut Out<'_>,
) {
    // SAFETY: the caller's `tiles` is usable.
    unsafe { tiles.configure(&config()) };
    let mut scratch = Scratch::new();
    for s in 0..x.rows().div_ceil(SWEEP_INPUTS) {
        let inputs = x.rows() - s * SWEEP_INPUTS;
        // SAFETY: configured above.
        unsafe {
            by_shape!(
                q4_sweep,
                inputs,
                x.levels().count(),
                (tiles, w, b, x, staged, s, &mut scratch, out)
            )
        }
    }
}

/// Sweep `s` (`O` input rows of `L` levels) of a q4 block.
///
/// # Safety
/// As [`block_q4`], with the tiles configured.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_sweep<T: Tiles, const O: usize, const L: usize>(
    tiles: &mut T,
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    s: usize,
    scratch: &mut Scratch,
    out: &mut Out<'_>,
) {
    let groups = x.cols() / GROUP;
    let (_, scales, sums, _) = x.raw();
    let o0 = s * SWEEP_INPUTS;
    // Input `o`'s first level row: its scale and float sum per group.
    let dx: [&[f32]; O] = std::array::from_fn(|o| &scales[L * (o0 + o) * groups..][..groups]);
    let sx: [&[f32]; O] = std::array::from_fn(|o| &sums[L * (o0 + o) * groups..][..groups]);
    // SAFETY (every `Lanes` call below): the caller's tiles come with the lanes' CPU
    // features; every pointer form reads inside a tile's sums or the group's bytes.
    let mut y = [[unsafe { <T::Lanes as Lanes>::zero() }; 2]; O];
    // Steps: both halves of every group in turn. In the iteration of step j, step
    // j + DEPTH is decoded, step j + DEPTH - 1 issued, step j stored and step j - 1
    // folded.
    let steps = 2 * groups;
    for j in 0..DEPTH.min(steps) {
        decode_q4_step(w, b, s, j, &mut scratch.b[j % STAGES]);
    }
    for j in 0..(DEPTH - 1).min(steps) {
        // SAFETY: configured by the caller.
        unsafe { issue_q4(tiles, staged, s, j, &scratch.b[j % STAGES]) };
    }
    for g in 0..groups {
        // Half by half, each a constant so the accumulators stay in registers.
        for (h, half) in [(0, 0), (1, 1)] {
            let j = 2 * g + h;
            if j + DEPTH < steps {
                decode_q4_step(w, b, s, j + DEPTH, &mut scratch.b[(j + DEPTH) % STAGES]);
            }
            let next = j + DEPTH - 1;
            if next < steps {
                // SAFETY: as above.
                unsafe { issue_q4(tiles, staged, s, next, &scratch.b[next % STAGES]) };
            }
            let [c0, c1] = &mut scratch.c;
            let (stored, folded) = if j % 2 == 0 { (c0, &*c1) } else { (c1, &*c0) };
            // SAFETY: as above.
            unsafe { retire(tiles, j, stored) };
            // SAFETY: see above; step j - 1 is the other half: of this group, or of the
            // previous one.
            unsafe {
                if half == 1 {
                    let p = &w.group_bytes(b, g)[512..640];
                    q4_epilogue::<T::Lanes, O, L, 0>(&mut y, folded, p, dx, sx, g);
                } else if g > 0 {
                    let p = &w.group_bytes(b, g - 1)[512..640];
                    q4_epilogue::<T::Lanes, O, L, 1>(&mut y, folded, p, dx, sx, g - 1);
                }
            }
        }
    }
    if groups > 0 {
        let last = &scratch.c[(steps - 1) % 2];
        let p = &w.group_bytes(b, groups - 1)[512..640];
        // SAFETY: as above.
        unsafe { q4_epilogue::<T::Lanes, O, L, 1>(&mut y, last, p, dx, sx, groups - 1) };
    }
    debug_assert_eq!(BLOCK_ROWS, 32);
    for (o, yo) in y.iter().enumerate() {
        let row: &mut [f32; 32] = out.row_mut(o0 + o).try_into().expect("a 32-row block");
        let (low, high) = row.split_at_mut(16);
        // SAFETY: see above.
        unsafe {
            <T::Lanes as Lanes>::store(yo[0], low.try_into().expect("16"));
            <T::Lanes as Lanes>::store(yo[1], high.try_into().expect("16"));
        }
    }
}

/// Half `H` of a q4 group's epilogue: for every input `o`,
/// `y += fma(m, sx, (d · dx) · isum)`, the reference's sequence, `isum` folded from the
/// stored sums `c`; `dm` is the group's 32 bf16 scales then 32 bf16 mins.
///
/// # Safety
/// The lanes' CPU features are present.
#[inline(always)]
unsafe fn q4_epilogue<V: Lanes, const O: usize, const L: usize, const H: usize>(
    y: &mut [[V::F; 2]; O],
    c: &Sums,
    dm: &[u8],
    dx: [&[f32]; O],
    sx: [&[f32]; O],
    g: usize,
) {
    assert!(dm.len() >= 128);
    // SAFETY: the caller's features; `dm` holds both halves' 32-byte scales and mins,
    // and every `c` row is 64 bytes.
    unsafe {
        let d = V::load_bf16(dm[32 * H..].as_ptr());
        let m = V::load_bf16(dm[64 + 32 * H..].as_ptr());
        for o in 0..O {
            let isum = folded_sum::<V, L>(c, o);
            let scale = V::mul(d, V::splat(dx[o][g]));
            let t = V::fma(m, V::splat(sx[o][g]), V::mul(scale, V::to_f32(isum)));
            y[o][H] = V::add(y[o][H], t);
        }
    }
}

/// Sweep input `o`'s exact sum over its `L` level rows in `c`: `128 · level0 + level1`
/// (the reference's `isum · 128 + part`; exact, see the module's overflow bound).
///
/// # Safety
/// The lanes' CPU features are present.
#[inline(always)]
unsafe fn folded_sum<V: Lanes, const L: usize>(c: &Sums, o: usize) -> V::I {
    // SAFETY: the caller's features; every `c` row is 64 bytes.
    unsafe {
        let mut isum = V::load_i(c[L * o].as_ptr());
        for l in 1..L {
            isum = V::fold(isum, V::load_i(c[L * o + l].as_ptr()));
        }
        isum
    }
}

/// Issues an int8 group's dot product into one parity's C tile: B straight from the
/// packed weights (already in B-tile order).
///
/// # Safety
/// `tiles` usable and configured by [`config`]; `weights` is 8 rows of 64 bytes.
#[inline(always)]
unsafe fn issue_i8<T: Tiles, const TA: u8, const TB: u8, const C: u8>(
    tiles: &mut T,
    a: &[u8; A_TILE_BYTES],
    weights: &[u8],
) {
    debug_assert!(weights.len() >= 512);
    // SAFETY: the caller's guarantees; `a` is 16 rows of 32 bytes.
    unsafe {
        tiles.load::<TA>(a.as_ptr(), GROUP);
        tiles.load::<TB>(weights.as_ptr(), TILE_ROW_BYTES);
        tiles.zero::<C>();
        tiles.dot::<C, TA, TB>(Dot::Ssd);
    }
}

/// One 16-row int8 block for every input row, by `tiles` (rows past the matrix's end,
/// where the share ends, are not written).
///
/// # Safety
/// As [`block_q4`].
#[inline(always)]
pub(super) unsafe fn block_i8<T: Tiles>(
    tiles: &mut T,
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    out: &mut Out<'_>,
) {
    // SAFETY: the caller's `tiles` is usable.
    unsafe { tiles.configure(&config()) };
    let mut c: [Sums; 2] = [[[0; 16]; TILE_ROWS]; 2];
    for s in 0..x.rows().div_ceil(SWEEP_INPUTS) {
        let inputs = x.rows() - s * SWEEP_INPUTS;
        // SAFETY: configured above.
        unsafe {
            by_shape!(
                i8_sweep,
                inputs,
                x.levels().count(),
                (tiles, w, b, x, staged, s, &mut c, out)
            )
        }
    }
}

/// Sweep `s` (`O` input rows of `L` levels) of an int8 block.
///
/// # Safety
/// As [`block_q4`], with the tiles configured.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn i8_sweep<T: Tiles, const O: usize, const L: usize>(
    tiles: &mut T,
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    s: usize,
    c: &mut [Sums; 2],
    out: &mut Out<'_>,
) {
    let groups = x.cols() / GROUP;
    let (_, scales, _, _) = x.raw();
    let o0 = s * SWEEP_INPUTS;
    let dx: [&[f32]; O] = std::array::from_fn(|o| &scales[L * (o0 + o) * groups..][..groups]);
    let issue = |tiles: &mut T, g: usize| {
        let p = w.group_bytes(b, g);
        debug_assert_eq!(p.len(), I8_GROUP_BYTES);
        let a = staged.tile(s, g);
        // SAFETY: configured by the caller; B is the group's first 512 bytes.
        unsafe {
            if g.is_multiple_of(2) {
                issue_i8::<T, A_EVEN, B_EVEN, C_EVEN>(tiles, a, p)
            } else {
                issue_i8::<T, A_ODD, B_ODD, C_ODD>(tiles, a, p)
            }
        }
    };
    // SAFETY (every `Lanes` call below): as in `q4_sweep`.
    let mut y = [unsafe { <T::Lanes as Lanes>::zero() }; O];
    issue(tiles, 0);
    for g in 0..groups {
        if g + 1 < groups {
            issue(tiles, g + 1);
        }
        let c = &mut c[g % 2];
        // SAFETY: configured; `c` is 16 rows of 64 bytes.
        unsafe {
            if g.is_multiple_of(2) {
                tiles.store::<C_EVEN>(c.as_mut_ptr().cast(), TILE_ROW_BYTES)
            } else {
                tiles.store::<C_ODD>(c.as_mut_ptr().cast(), TILE_ROW_BYTES)
            }
        }
        let p = w.group_bytes(b, g);
        // SAFETY: see above; the group's 16 f32 scales follow its 512 code bytes.
        unsafe {
            let dw = <T::Lanes as Lanes>::load_f(p[512..576].as_ptr());
            for o in 0..O {
                let isum = folded_sum::<T::Lanes, L>(c, o);
                let scale = <T::Lanes as Lanes>::mul(dw, <T::Lanes as Lanes>::splat(dx[o][g]));
                let isum = <T::Lanes as Lanes>::to_f32(isum);
                y[o] = <T::Lanes as Lanes>::fma(scale, isum, y[o]);
            }
        }
    }
    let valid = out.width().min(I8_BLOCK_ROWS);
    for (o, yo) in y.iter().enumerate() {
        let mut lanes = [0f32; 16];
        // SAFETY: see above.
        unsafe { <T::Lanes as Lanes>::store(*yo, &mut lanes) };
        out.row_mut(o0 + o).copy_from_slice(&lanes[..valid]);
    }
}

std::thread_local! {
    /// The staged A tiles' allocation, reused by the calls this thread makes.
    static STAGING: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` with `x` staged (in this thread's reused buffer).
fn with_staged<R>(x: &QuantizedRows, f: impl FnOnce(&StagedRows) -> R) -> R {
    let staged = StagedRows::new(x, STAGING.take());
    let result = f(&staged);
    STAGING.set(staged.into_buffer());
    result
}

/// `y = W · x` for q4 weights by the AMX variant's logic on `tiles()` (one per task).
///
/// # Safety
/// The tiles `tiles` makes are usable, and `block` is [`block_q4`] on them (compiled for
/// some target).
unsafe fn matmul_q4_on<T: Tiles>(
    w: &PackedQ4,
    x: &QuantizedRows,
    y: &mut [f32],
    tiles: impl Fn() -> T + Sync,
    block: unsafe fn(&mut T, &PackedQ4, usize, &QuantizedRows, &StagedRows, &mut Out<'_>),
) {
    super::check_q4_shapes(w, x, y);
    if x.rows() == 0 {
        return;
    }
    with_staged(x, |staged| {
        crate::team::for_each_column_block(y, w.stride(), BLOCK_ROWS, |b, mut out| {
            // SAFETY: the caller's guarantees.
            unsafe { block(&mut tiles(), w, b, x, staged, &mut out) }
        })
    });
}

/// `y = W · x` for the int8 matrix on `tiles()`, eight blocks a task (as the other
/// variants).
///
/// # Safety
/// As [`matmul_q4_on`], with [`block_i8`].
unsafe fn matmul_i8_on<T: Tiles>(
    w: &I8Matrix,
    x: &QuantizedRows,
    y: &mut [f32],
    tiles: impl Fn() -> T + Sync,
    block: unsafe fn(&mut T, &I8Matrix, usize, &QuantizedRows, &StagedRows, &mut Out<'_>),
) {
    super::check_i8_shapes(w, x, y);
    if x.rows() == 0 {
        return;
    }
    let width = super::I8_TASK_BLOCKS * I8_BLOCK_ROWS;
    with_staged(x, |staged| {
        crate::team::for_each_column_block(y, w.rows(), width, |t, mut out| {
            let mut tiles = tiles();
            for j in 0..out.width().div_ceil(I8_BLOCK_ROWS) {
                let b = t * super::I8_TASK_BLOCKS + j;
                let mut out = out.columns(j * I8_BLOCK_ROWS, (j + 1) * I8_BLOCK_ROWS);
                // SAFETY: the caller's guarantees.
                unsafe { block(&mut tiles, w, b, x, staged, &mut out) }
            }
        })
    });
}

/// [`block_q4`] on the hardware, compiled with AVX-512 so the epilogue's 16-lane loops
/// become single vector instructions.
///
/// # Safety
/// `tiles` came from [`Hardware::new`] (so AVX-512 is present too).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn block_q4_hardware(
    tiles: &mut Hardware,
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    out: &mut Out<'_>,
) {
    // SAFETY: the caller's guarantees.
    unsafe { block_q4(tiles, w, b, x, staged, out) }
}

/// [`block_i8`] on the hardware (see [`block_q4_hardware`]).
///
/// # Safety
/// As [`block_q4_hardware`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn block_i8_hardware(
    tiles: &mut Hardware,
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    staged: &StagedRows,
    out: &mut Out<'_>,
) {
    // SAFETY: the caller's guarantees.
    unsafe { block_i8(tiles, w, b, x, staged, out) }
}

/// [`super::matmul_q4`] on the tile unit, whatever the row count. [`super::matmul_q4`]
/// does not choose it: on the AMX machine measured (see `pays`) the q4 tile kernel at
/// best tied AVX-512 VNNI (one thread) and lost with two (a layer at 8 input rows:
/// 243 µs against 212, at 16: 382 against 346), because a group's sums must leave the
/// tiles for the f32 epilogue every 32 columns. It stays tested bit for bit, and the
/// kernels bench measures it, so another AMX CPU can be judged.
///
/// # Panics
/// If `isa` has no AMX, or as [`super::matmul_q4`].
#[cfg(target_arch = "x86_64")]
pub fn matmul_q4_hardware(isa: Isa, w: &PackedQ4, x: &QuantizedRows, y: &mut [f32]) {
    Hardware::new(isa).expect("q8 amx: a token without AMX");
    let tiles = || Hardware::new(isa).expect("checked above");
    // SAFETY: AMX (and AVX-512, which the amx bit implies) is usable.
    unsafe { matmul_q4_on(w, x, y, tiles, block_q4_hardware) }
}

/// [`super::matmul_i8`] on the tile unit.
///
/// # Panics
/// If `isa` has no AMX, or as [`super::matmul_i8`].
#[cfg(target_arch = "x86_64")]
pub(super) fn matmul_i8_hardware(isa: Isa, w: &I8Matrix, x: &QuantizedRows, y: &mut [f32]) {
    Hardware::new(isa).expect("q8 amx: a token without AMX");
    let tiles = || Hardware::new(isa).expect("checked above");
    // SAFETY: as above.
    unsafe { matmul_i8_on(w, x, y, tiles, block_i8_hardware) }
}

/// [`super::matmul_q4`] by the AMX variant's logic on the [`Emulator`]: what tests run on
/// every machine (slow; for tests only).
///
/// # Panics
/// As [`super::matmul_q4`].
pub fn matmul_q4_emulated(w: &PackedQ4, x: &QuantizedRows, y: &mut [f32]) {
    // SAFETY: the emulator is always usable.
    unsafe { matmul_q4_on(w, x, y, Emulator::default, block_q4::<Emulator>) }
}

/// [`super::matmul_i8`] by the AMX variant's logic on the [`Emulator`] (tests only).
///
/// # Panics
/// As [`super::matmul_i8`].
pub fn matmul_i8_emulated(w: &I8Matrix, x: &QuantizedRows, y: &mut [f32]) {
    // SAFETY: the emulator is always usable.
    unsafe { matmul_i8_on(w, x, y, Emulator::default, block_i8::<Emulator>) }
}

/// Whether the AMX variant serves an int8-head call of `level_rows` level rows. Below a
/// full tile (eight input rows at two levels) the AVX-512 VNNI variant, which gives the
/// same bits, is faster: a group's tile work (loads, the dot product, the store of the
/// sums for the per-group f32 epilogue) costs the same whatever the rows. Measured on
/// an AMX Xeon VM (2 vCPUs; SmolLM2's head, a quarter of its rows; fastest of 60
/// interleaved runs): 2/4/8/16 input rows took 167/236/315/473 µs on two threads
/// against VNNI's 180/226/420/732.
pub(super) fn pays(level_rows: usize) -> bool {
    level_rows >= MIN_LEVEL_ROWS
}

/// See [`pays`].
const MIN_LEVEL_ROWS: usize = 16;
