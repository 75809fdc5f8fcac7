//! The q4_1 tile codec against tiles written byte by byte from the documented layout.

use half::bf16;
use proptest::prelude::*;
use q4nx_format::{encode_q4_1, Q4Kind, Q4Matrix, TILE_BYTES};

/// Known-answer formulas for every stored field of an N x K matrix.
fn d_of(row: usize, group: usize) -> f32 {
    bf16::from_f32(0.01 + 0.001 * ((row * 7 + group * 3) % 23) as f32).to_f32()
}
fn m_of(row: usize, group: usize) -> f32 {
    bf16::from_f32(-0.05 - 0.002 * ((row * 5 + group) % 19) as f32).to_f32()
}
fn q_of(row: usize, col: usize) -> u8 {
    // 7 is odd, so every 16 consecutive columns hold all 16 codes (0 and 15 included).
    ((col * 7 + row * 3 + (col / 16) * row) % 16) as u8
}

/// Writes tiles straight from the layout description in `docs/formats.md`, without
/// any code of the crate: d and m group-major, nibbles `[row group][column][byte]`.
fn hand_built_tiles(n: usize, k: usize) -> Vec<u8> {
    let (rbs, cbs) = (n.div_ceil(32), k.div_ceil(256));
    let mut out = vec![0u8; rbs * cbs * TILE_BYTES];
    for rb in 0..rbs {
        for cb in 0..cbs {
            let tile = &mut out[(rb * cbs + cb) * TILE_BYTES..][..TILE_BYTES];
            for r in 0..32 {
                let row = rb * 32 + r;
                for g in 0..8 {
                    let col0 = cb * 256 + g * 32;
                    if row >= n || col0 >= k {
                        continue;
                    }
                    let idx = g * 32 + r;
                    let group = col0 / 32;
                    tile[2 * idx..2 * idx + 2]
                        .copy_from_slice(&bf16::from_f32(d_of(row, group)).to_bits().to_le_bytes());
                    tile[512 + 2 * idx..512 + 2 * idx + 2]
                        .copy_from_slice(&bf16::from_f32(m_of(row, group)).to_bits().to_le_bytes());
                }
                for c in 0..256 {
                    let col = cb * 256 + c;
                    if row >= n || col >= k {
                        continue;
                    }
                    let byte = 1024 + (r / 16) * 2048 + c * 8 + (r % 16) / 2;
                    let q = q_of(row, col);
                    tile[byte] |= if r % 2 == 0 { q } else { q << 4 };
                }
            }
        }
    }
    out
}

fn expected(row: usize, col: usize) -> f32 {
    d_of(row, col / 32) * q_of(row, col) as f32 + m_of(row, col / 32)
}

#[test]
fn decodes_hand_built_tiles_element_by_element() {
    // Aligned, K not a multiple of 256, N not a multiple of 32, both.
    for (n, k) in [(64, 512), (32, 96), (45, 256), (70, 608), (1, 32)] {
        let bytes = hand_built_tiles(n, k);
        let m = Q4Matrix::from_bytes("hand", &bytes, n, k, Q4Kind::Q4_1).unwrap();
        let all = m.decode();
        for row in 0..n {
            for col in 0..k {
                let want = expected(row, col);
                assert_eq!(
                    all[row * k + col].to_bits(),
                    want.to_bits(),
                    "{n}x{k} at ({row},{col})"
                );
                assert_eq!(m.get(row, col).to_bits(), want.to_bits());
            }
        }
        // A row range matches the same rows of the full decode.
        if n > 3 {
            assert_eq!(m.decode_rows(2..n - 1), all[2 * k..(n - 1) * k].to_vec());
        }
        // Padding decodes to zero in whole tiles.
        let last = m.decode_tile(n.div_ceil(32) - 1, k.div_ceil(256) - 1);
        for r in 0..32 {
            for c in 0..256 {
                let (row, col) = (
                    (n.div_ceil(32) - 1) * 32 + r,
                    (k.div_ceil(256) - 1) * 256 + c,
                );
                if row >= n || col >= k {
                    assert_eq!(last[r * 256 + c], 0.0);
                }
            }
        }
        // The encoder writes exactly the hand-built bytes for these representable values.
        let values: Vec<f32> = (0..n * k).map(|i| expected(i / k, i % k)).collect();
        let has_full_range = (0..n).all(|r| {
            (0..k.div_ceil(32)).all(|g| {
                let qs: Vec<u8> = (g * 32..(g * 32 + 32).min(k)).map(|c| q_of(r, c)).collect();
                qs.contains(&0) && qs.contains(&15)
            })
        });
        assert!(has_full_range);
        assert!(
            encode_q4_1(&values, n, k).unwrap() == bytes,
            "{n}x{k}: encoder bytes differ"
        );
    }
}

#[test]
fn q4_0_tiles_read_signed_nibbles() {
    // One tile, d = 0.5 everywhere, nibble pattern 0..15 along the columns of row 0.
    let mut tile = vec![0u8; TILE_BYTES];
    for g in 0..8 {
        tile[2 * (g * 32)..2 * (g * 32) + 2]
            .copy_from_slice(&bf16::from_f32(0.5).to_bits().to_le_bytes());
        // A non-zero min must be ignored for Q4_0.
        tile[512 + 2 * (g * 32)..512 + 2 * (g * 32) + 2]
            .copy_from_slice(&bf16::from_f32(9.0).to_bits().to_le_bytes());
    }
    for c in 0..256 {
        tile[1024 + c * 8] = (c % 16) as u8;
    }
    let m = Q4Matrix::from_bytes("q4_0", &tile, 1, 256, Q4Kind::Q4_0).unwrap();
    let row = m.decode();
    for (c, &value) in row.iter().enumerate() {
        let q = (c % 16) as i32;
        let signed = if q >= 8 { q - 16 } else { q };
        assert_eq!(value, 0.5 * signed as f32, "col {c}");
    }
    let as_q4_1 = Q4Matrix::from_bytes("q4_1", &tile, 1, 256, Q4Kind::Q4_1).unwrap();
    assert_eq!(as_q4_1.get(0, 3), 0.5 * 3.0 + 9.0);
}

#[test]
fn grid_checks_name_the_geometry() {
    let bytes = vec![0u8; 2 * TILE_BYTES];
    let err = Q4Matrix::from_bytes("w", &bytes, 64, 300, Q4Kind::Q4_1).unwrap_err();
    assert!(
        err.to_string()
            .contains("not the q4_1 tile grid of 64 x 300"),
        "{err}"
    );
    assert!(Q4Matrix::from_bytes("w", &bytes, 64, 256, Q4Kind::Q4_1).is_ok());
    assert!(Q4Matrix::from_bytes("w", &bytes, 33, 200, Q4Kind::Q4_1).is_ok());
    assert!(Q4Matrix::from_bytes("w", &[], 0, 0, Q4Kind::Q4_1).is_err());
}

/// A row-major matrix whose every 32-column group is `d * q + m` with bf16 d > 0 and
/// m and codes covering 0 and 15 (the shape of FastFlowLM's lossless fixtures).
fn representable() -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..70, 1usize..12).prop_flat_map(|(n, groups)| {
        let k = groups * 32;
        let params = prop::collection::vec(
            (1u16..2000, -3000i16..3000, 0usize..32, 0usize..31),
            n * groups,
        );
        let codes = prop::collection::vec(0u8..16, n * k);
        (Just(n), Just(k), params, codes).prop_map(move |(n, k, params, mut codes)| {
            let mut values = vec![0f32; n * k];
            for r in 0..n {
                for g in 0..k / 32 {
                    let (dq, mq, lo, hi_off) = params[r * (k / 32) + g];
                    let d = bf16::from_f32(dq as f32 * 1e-4).to_f32();
                    let m = bf16::from_f32(mq as f32 * 1e-3).to_f32();
                    let hi = (lo + 1 + hi_off) % 32;
                    codes[r * k + g * 32 + lo] = 0;
                    codes[r * k + g * 32 + hi] = 15;
                    for c in g * 32..g * 32 + 32 {
                        values[r * k + c] = d * codes[r * k + c] as f32 + m;
                    }
                }
            }
            (n, k, values)
        })
    })
}

/// The largest error q4_1 may make on a group spanning `[lo, hi]`, from the format's
/// definition alone (not from the quantizer under test): 16 levels `m + q·d` with
/// `m ≈ lo` and `d ≈ (hi − lo)/15`, both stored BF16 (8 significant bits, so each is
/// within a relative u = 2⁻⁸ of its exact value). Inside the stored range a value is at
/// most half a step from a level; the range's ends move by the BF16 rounding: the low
/// end by at most u·|lo|, the high end by at most u·(hi − m). A few f32 roundings in
/// encode and decode are covered by 1e-6 of the magnitude.
fn q4_1_bound(lo: f32, hi: f32) -> f32 {
    let u = 2f32.powi(-8);
    let (lo64, hi64) = (lo as f64, hi as f64);
    let span = hi64 - lo64 + u as f64 * lo64.abs(); // hi - m at most
    let half_step = span * (1.0 + u as f64) / 30.0;
    let low_end = u as f64 * lo64.abs();
    let high_end = u as f64 * span;
    let f32_slack = 1e-6 * lo64.abs().max(hi64.abs());
    (half_step + low_end + high_end + f32_slack) as f32
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn encode_decode_is_exact_for_representable_matrices((n, k, values) in representable()) {
        let tiles = encode_q4_1(&values, n, k).unwrap();
        let m = Q4Matrix::from_bytes("p", &tiles, n, k, Q4Kind::Q4_1).unwrap();
        let back = m.decode();
        for (i, (a, b)) in values.iter().zip(&back).enumerate() {
            prop_assert_eq!(a.to_bits(), b.to_bits(), "element {}", i);
        }
    }

    #[test]
    fn encode_decode_is_within_half_a_step(
        n in 1usize..40,
        groups in 1usize..10,
        seed in prop::collection::vec(-1000.0f32..1000.0, 1..64),
        scale in 1e-3f32..10.0,
    ) {
        let k = groups * 32;
        let values: Vec<f32> = (0..n * k)
            .map(|i| seed[i % seed.len()] * scale * 1e-3 * (1.0 + (i % 7) as f32 * 0.1))
            .collect();
        let tiles = encode_q4_1(&values, n, k).unwrap();
        let back = Q4Matrix::from_bytes("p", &tiles, n, k, Q4Kind::Q4_1).unwrap().decode();
        for r in 0..n {
            for g in 0..groups {
                let group = &values[r * k + g * 32..r * k + g * 32 + 32];
                let lo = group.iter().cloned().fold(f32::INFINITY, f32::min);
                let hi = group.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let bound = q4_1_bound(lo, hi);
                for c in 0..32 {
                    let i = r * k + g * 32 + c;
                    prop_assert!((values[i] - back[i]).abs() <= bound,
                        "row {} col {}: {} -> {} (bound {})", r, g * 32 + c, values[i], back[i], bound);
                }
            }
        }
    }
}
