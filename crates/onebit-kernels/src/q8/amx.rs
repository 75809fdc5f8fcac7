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

use super::{bf16_at, I8Matrix, Out, PackedQ4, QuantizedRows, BLOCK_ROWS, GROUP};
use super::{I8_BLOCK_ROWS, I8_GROUP_BYTES};
use crate::isa::Isa;

/// Level rows per tile sweep: a tile's rows.
pub const TILE_ROWS: usize = 16;
/// Bytes per tile row.
pub const TILE_ROW_BYTES: usize = 64;

/// The tile registers the kernel uses.
const A: u8 = 0;
const B0: u8 = 1;
const B1: u8 = 2;
const C0: u8 = 3;
const C1: u8 = 4;

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
    /// What the kernel uses for `m` level rows: A `m × 32`, B0 and B1 `8 × 64`, C0 and
    /// C1 `m × 64`.
    fn for_level_rows(m: usize) -> TileConfig {
        debug_assert!((1..=TILE_ROWS).contains(&m));
        let mut c = TileConfig {
            rows: [0; 8],
            colsb: [0; 8],
        };
        let m = m as u8;
        let depth = (GROUP / 4) as u8;
        for (tile, rows, colsb) in [
            (A, m, GROUP as u16),
            (B0, depth, 64),
            (B1, depth, 64),
            (C0, m, 64),
            (C1, m, 64),
        ] {
            c.rows[tile as usize] = rows;
            c.colsb[tile as usize] = colsb;
        }
        c
    }

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

/// Staging for a decoded q4 half-block and the stored sums: 64-byte aligned so tile loads
/// and stores touch whole lines.
#[repr(C, align(64))]
struct Scratch {
    /// B tiles of both halves: 8 rows of 64 bytes each.
    b: [[[u8; TILE_ROW_BYTES]; GROUP / 4]; 2],
    /// C tiles of both halves: up to 16 level rows of 16 sums.
    c: [[[i32; 16]; TILE_ROWS]; 2],
}

impl Scratch {
    fn new() -> Box<Scratch> {
        Box::new(Scratch {
            b: [[[0; TILE_ROW_BYTES]; GROUP / 4]; 2],
            c: [[[0; 16]; TILE_ROWS]; 2],
        })
    }
}

/// The level rows of `x` in sweeps of at most [`TILE_ROWS`] (whole input rows each):
/// `(first level row, level rows)`.
fn sweeps(x: &QuantizedRows) -> impl Iterator<Item = (usize, usize)> {
    let n = x.level_rows();
    // A whole number of input rows per sweep (16 is a multiple of every level count).
    (0..n)
        .step_by(TILE_ROWS)
        .map(move |i0| (i0, TILE_ROWS.min(n - i0)))
}

/// `128^(L-1-l)`-weighted sum of input row `o`'s level rows in `c` (exact; see the
/// module's overflow bound).
#[inline(always)]
fn folded(c: &[[i32; 16]; TILE_ROWS], o: usize, levels: usize, n: usize) -> i32 {
    let mut sum = c[levels * o][n];
    for l in 1..levels {
        sum = (sum << 7) + c[levels * o + l][n];
    }
    sum
}

/// One 32-row q4 block for every input row, by `tiles`: the AMX variant's whole logic.
///
/// # Safety
/// `tiles` must be usable (an [`Emulator`], or [`Hardware`] made from a detected token).
#[inline(always)]
pub(super) unsafe fn block_q4<T: Tiles>(
    tiles: &mut T,
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    out: &mut Out<'_>,
) {
    let (k, groups, levels) = (x.cols(), x.cols() / GROUP, x.levels().count());
    let (codes, scales, sums, _) = x.raw();
    let mut scratch = Scratch::new();
    for (i0, m) in sweeps(x) {
        assert!((i0 + m) * k <= codes.len(), "q8 amx: sweep past the codes");
        let inputs = m / levels;
        // SAFETY: the caller's `tiles` is usable; the shapes are the configured ones.
        unsafe { tiles.configure(&TileConfig::for_level_rows(m)) };
        let mut y = [[[0f32; 16]; 2]; TILE_ROWS];
        for g in 0..groups {
            let p = w.group_bytes(b, g);
            for (h, stage) in scratch.b.iter_mut().enumerate() {
                for q in 0..GROUP / 8 {
                    let nibbles = &p[(4 * h + q) * 64..(4 * h + q + 1) * 64];
                    for (t, &byte) in nibbles.iter().enumerate() {
                        stage[2 * q][t] = byte & 0x0f;
                        stage[2 * q + 1][t] = byte >> 4;
                    }
                }
            }
            // SAFETY: A is `m` rows of 32 codes at stride K inside `codes` (asserted
            // above); B and C are the scratch's own buffers, 8 × 64 and m × 64 bytes.
            unsafe {
                tiles.load::<A>(codes.as_ptr().add(i0 * k + g * GROUP).cast(), k);
                tiles.load::<B0>(scratch.b[0].as_ptr().cast(), TILE_ROW_BYTES);
                tiles.load::<B1>(scratch.b[1].as_ptr().cast(), TILE_ROW_BYTES);
                tiles.zero::<C0>();
                tiles.zero::<C1>();
                tiles.dot::<C0, A, B0>(Dot::Sud);
                tiles.dot::<C1, A, B1>(Dot::Sud);
                tiles.store::<C0>(scratch.c[0].as_mut_ptr().cast(), TILE_ROW_BYTES);
                tiles.store::<C1>(scratch.c[1].as_mut_ptr().cast(), TILE_ROW_BYTES);
            }
            for (h, c) in scratch.c.iter().enumerate() {
                let d: [f32; 16] = std::array::from_fn(|n| bf16_at(p, 512 + 32 * h + 2 * n));
                let mins: [f32; 16] = std::array::from_fn(|n| bf16_at(p, 576 + 32 * h + 2 * n));
                for (o, yo) in y.iter_mut().enumerate().take(inputs) {
                    let first = (i0 + levels * o) * groups + g;
                    let (dx, sx) = (scales[first], sums[first]);
                    for n in 0..16 {
                        let isum = folded(c, o, levels, n) as f32;
                        let scale = d[n] * dx;
                        yo[h][n] += mins[n].mul_add(sx, scale * isum);
                    }
                }
            }
        }
        debug_assert_eq!(BLOCK_ROWS, 32);
        for (o, yo) in y.iter().enumerate().take(inputs) {
            let row = out.row_mut(i0 / levels + o);
            row[..16].copy_from_slice(&yo[0]);
            row[16..32].copy_from_slice(&yo[1]);
        }
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
    out: &mut Out<'_>,
) {
    let (k, groups, levels) = (x.cols(), x.cols() / GROUP, x.levels().count());
    let (codes, scales, _, _) = x.raw();
    let mut c = [[0i32; 16]; TILE_ROWS];
    let valid = out.width().min(I8_BLOCK_ROWS);
    for (i0, m) in sweeps(x) {
        assert!((i0 + m) * k <= codes.len(), "q8 amx: sweep past the codes");
        let inputs = m / levels;
        // SAFETY: the caller's `tiles` is usable.
        unsafe { tiles.configure(&TileConfig::for_level_rows(m)) };
        let mut y = [[0f32; 16]; TILE_ROWS];
        for g in 0..groups {
            let p = w.group_bytes(b, g);
            debug_assert_eq!(p.len(), I8_GROUP_BYTES);
            // SAFETY: A as in `block_q4`; B is the group's first 512 bytes (8 rows of
            // 64), already in dword order; C is `c`, m × 64 bytes.
            unsafe {
                tiles.load::<A>(codes.as_ptr().add(i0 * k + g * GROUP).cast(), k);
                tiles.load::<B0>(p.as_ptr(), TILE_ROW_BYTES);
                tiles.zero::<C0>();
                tiles.dot::<C0, A, B0>(Dot::Ssd);
                tiles.store::<C0>(c.as_mut_ptr().cast(), TILE_ROW_BYTES);
            }
            let dw: [f32; 16] = std::array::from_fn(|n| {
                f32::from_le_bytes(p[512 + 4 * n..516 + 4 * n].try_into().unwrap())
            });
            for (o, yo) in y.iter_mut().enumerate().take(inputs) {
                let dx = scales[(i0 + levels * o) * groups + g];
                for n in 0..16 {
                    let scale = dw[n] * dx;
                    yo[n] = scale.mul_add(folded(&c, o, levels, n) as f32, yo[n]);
                }
            }
        }
        for (o, yo) in y.iter().enumerate().take(inputs) {
            out.row_mut(i0 / levels + o).copy_from_slice(&yo[..valid]);
        }
    }
}

/// The hardware variant, compiled with AVX-512 so the epilogue's 16-lane loops become
/// single vector instructions.
///
/// # Safety
/// `isa` has AMX (hence AVX-512).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn block_q4_hardware(
    isa: Isa,
    w: &PackedQ4,
    b: usize,
    x: &QuantizedRows,
    out: &mut Out<'_>,
) {
    let mut tiles = Hardware::new(isa).expect("q8 amx: a token without AMX");
    // SAFETY: `tiles` exists, so AMX is usable.
    unsafe { block_q4(&mut tiles, w, b, x, out) }
}

/// [`block_q4_hardware`] for the int8 head.
///
/// # Safety
/// `isa` has AMX (hence AVX-512).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn block_i8_hardware(
    isa: Isa,
    w: &I8Matrix,
    b: usize,
    x: &QuantizedRows,
    out: &mut Out<'_>,
) {
    let mut tiles = Hardware::new(isa).expect("q8 amx: a token without AMX");
    // SAFETY: as above.
    unsafe { block_i8(&mut tiles, w, b, x, out) }
}

/// [`super::matmul_q4`] by the AMX variant's logic on the [`Emulator`]: what tests run on
/// every machine (slow; for tests only).
///
/// # Panics
/// As [`super::matmul_q4`].
pub fn matmul_q4_emulated(w: &PackedQ4, x: &QuantizedRows, y: &mut [f32]) {
    super::check_q4_shapes(w, x, y);
    crate::team::for_each_column_block(y, w.stride(), BLOCK_ROWS, |b, mut out| {
        let mut tiles = Emulator::default();
        // SAFETY: the emulator is always usable.
        unsafe { block_q4(&mut tiles, w, b, x, &mut out) }
    });
}

/// [`super::matmul_i8`] by the AMX variant's logic on the [`Emulator`] (tests only).
///
/// # Panics
/// As [`super::matmul_i8`].
pub fn matmul_i8_emulated(w: &I8Matrix, x: &QuantizedRows, y: &mut [f32]) {
    super::check_i8_shapes(w, x, y);
    crate::team::for_each_column_block(y, w.rows(), I8_BLOCK_ROWS, |b, mut out| {
        let mut tiles = Emulator::default();
        // SAFETY: the emulator is always usable.
        unsafe { block_i8(&mut tiles, w, b, x, &mut out) }
    });
}

/// Whether the AMX variant serves a call of `level_rows` level rows: below this the
/// AVX-512 VNNI variant (same bits) is faster, as a tile sweep of one or two rows pays
/// the decode, load and store of a whole tile for a sliver of it.
pub(super) fn pays(level_rows: usize) -> bool {
    level_rows >= MIN_LEVEL_ROWS
}

/// See [`pays`].
const MIN_LEVEL_ROWS: usize = 4;
