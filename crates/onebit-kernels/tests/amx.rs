//! The AMX tile emulator against a direct definition of each instruction, and (where
//! this CPU has AMX) the hardware against the emulator. The kernels' equality with the
//! reference, emulated and real, is in `q8.rs`.

use onebit_kernels::q8::amx::{dot_tiles, Dot, Emulator, TileConfig, Tiles};
use onebit_kernels::Isa;
use proptest::prelude::*;

type Tile = [[u8; 64]; 16];

fn tile_from(bytes: &[u8]) -> Tile {
    std::array::from_fn(|r| std::array::from_fn(|c| bytes[64 * r + c]))
}

/// `C + A·B` as a matrix product: A is 16 × 64 bytes (the K axis along the row), B's
/// logical K × N matrix has element `(kk, n)` at byte `4n + kk mod 4` of row `kk / 4`;
/// sums in i64, then wrapped to i32 as the dword accumulator wraps.
fn defined(op: Dot, a: &Tile, b: &Tile, c: &Tile) -> Tile {
    // The instructions' operand types, stated here (from Intel's SDM) rather than read
    // from `Dot::signed`, which the emulator uses: a wrong entry there must show.
    let (a_signed, b_signed) = match op {
        Dot::Ssd => (true, true),   // tdpbssd
        Dot::Sud => (true, false),  // tdpbsud
        Dot::Usd => (false, true),  // tdpbusd
        Dot::Uud => (false, false), // tdpbuud
    };
    let value = |v: u8, signed: bool| if signed { v as i8 as i64 } else { v as i64 };
    let mut out = [[0u8; 64]; 16];
    for m in 0..16 {
        for n in 0..16 {
            let mut sum = i32::from_le_bytes(c[m][4 * n..4 * n + 4].try_into().unwrap()) as i64;
            for kk in 0..64 {
                sum += value(a[m][kk], a_signed) * value(b[kk / 4][4 * n + kk % 4], b_signed);
            }
            out[m][4 * n..4 * n + 4].copy_from_slice(&(sum as i32).to_le_bytes());
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Each of the four dot products on random tiles (accumulators included, so the
    /// dword sums wrap now and then).
    #[test]
    fn emulated_dot_products_equal_their_definition(
        a in proptest::collection::vec(any::<u8>(), 1024),
        b in proptest::collection::vec(any::<u8>(), 1024),
        c in proptest::collection::vec(any::<u8>(), 1024),
    ) {
        let (a, b, c) = (tile_from(&a), tile_from(&b), tile_from(&c));
        for op in Dot::ALL {
            let got = dot_tiles(&mut Emulator::default(), op, &a, &b, &c);
            prop_assert_eq!(got, defined(op, &a, &b, &c), "{:?}", op);
        }
    }
}

/// A tile's configured shape bounds what loads read and stores write; the rest reads
/// as zero, and a dot product over a partial shape leaves the rows and columns past it
/// zero.
#[test]
fn emulated_partial_shapes_read_and_write_only_the_configured_bytes() {
    let config = TileConfig {
        rows: [5, 3, 5, 0, 0, 0, 0, 0],
        colsb: [12, 28, 28, 0, 0, 0, 0, 0],
    };
    let source: Vec<u8> = (0..16 * 100).map(|i| (i * 7 + 3) as u8).collect();
    let mut t = Emulator::default();
    let mut stored = vec![0xEEu8; 16 * 100];
    // SAFETY: `source` and `stored` hold 16 rows of 100 bytes, more than configured.
    unsafe {
        t.configure(&config);
        t.load::<0>(source.as_ptr(), 100);
        t.load::<1>(source.as_ptr(), 100);
        t.zero::<2>();
        t.dot::<2, 0, 1>(Dot::Ssd);
        t.store::<0>(stored.as_mut_ptr(), 100);
    }
    for r in 0..16 {
        for c in 0..64 {
            let inside = r < 5 && c < 12;
            let want = if inside { source[100 * r + c] } else { 0 };
            assert_eq!(t.tile(0)[r][c], want, "A tile byte ({r}, {c})");
        }
    }
    for (at, &v) in stored.iter().enumerate() {
        let (r, c) = (at / 100, at % 100);
        let want = if r < 5 && c < 12 { source[at] } else { 0xEE };
        assert_eq!(v, want, "stored byte ({r}, {c})");
    }
    let mut a = [[0u8; 64]; 16];
    let mut b = [[0u8; 64]; 16];
    for r in 0..5 {
        a[r][..12].copy_from_slice(&source[100 * r..100 * r + 12]);
    }
    for r in 0..3 {
        b[r][..28].copy_from_slice(&source[100 * r..100 * r + 28]);
    }
    assert_eq!(
        *t.tile(2),
        defined(Dot::Ssd, &a, &b, &[[0; 64]; 16]),
        "partial dot product (zero past the configured 5 rows × 7 dwords)"
    );
}

/// The hardware's four dot products equal the emulator's on random tiles, where this
/// CPU has AMX (skipped by name elsewhere).
#[cfg(target_arch = "x86_64")]
#[test]
fn hardware_tiles_equal_the_emulator() {
    use onebit_kernels::q8::amx::Hardware;
    let Some(mut hardware) = Hardware::new(Isa::detect()) else {
        test_support::skip!(
            "hardware_tiles_equal_the_emulator",
            "this CPU or OS has no usable AMX ({})",
            Isa::detect().name()
        );
        return;
    };
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut random = || -> Tile {
        std::array::from_fn(|_| {
            std::array::from_fn(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
        })
    };
    for _ in 0..32 {
        let (a, b, c) = (random(), random(), random());
        for op in Dot::ALL {
            assert_eq!(
                dot_tiles(&mut hardware, op, &a, &b, &c),
                dot_tiles(&mut Emulator::default(), op, &a, &b, &c),
                "{op:?}"
            );
        }
    }
}
