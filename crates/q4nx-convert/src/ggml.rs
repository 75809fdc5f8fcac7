//! ggml block formats: dequantization (bit-exact with gguf-py's numpy code) and
//! gguf-py's Q4_1 quantizer, which FastFlowLM's converter uses to re-quantize.
//!
//! Bit-exactness matters: the converter must write the same bytes as the Python
//! reference, so every formula below evaluates in `f32` in the same order as
//! gguf-py (`(d * sc) * q - (dmin * m)` for Q4_K, and so on), and Rust never
//! contracts `a * b + c` into a fused multiply-add.

use half::f16;

use crate::gguf::GgmlType;

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One ggml Q4_1 block as stored: f16 scale and min, 32 codes 0..15.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4_1Block {
    /// Scale.
    pub d: f16,
    /// Minimum: value = d · q + m.
    pub m: f16,
    /// 32 four-bit codes, two per byte (ggml's order: low nibbles are elements 0..16).
    pub q: [u8; 32],
}

impl Q4_1Block {
    /// Parses a 20-byte block (element j in the low nibble of byte j, element
    /// j + 16 in its high nibble).
    pub fn from_bytes(b: &[u8]) -> Q4_1Block {
        let mut q = [0u8; 32];
        for j in 0..16 {
            q[j] = b[4 + j] & 0x0f;
            q[j + 16] = b[4 + j] >> 4;
        }
        Q4_1Block {
            d: f16::from_le_bytes([b[0], b[1]]),
            m: f16::from_le_bytes([b[2], b[3]]),
            q,
        }
    }
}

/// One ggml Q4_0 block: f16 scale and 32 signed codes -8..7.
pub fn q4_0_block(b: &[u8]) -> (f16, [i8; 32]) {
    let mut q = [0i8; 32];
    for j in 0..16 {
        q[j] = (b[2 + j] & 0x0f) as i8 - 8;
        q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
    }
    (f16::from_le_bytes([b[0], b[1]]), q)
}

/// gguf-py's `Q4_1.quantize_blocks` for one block of 32 values: `d = (max - min) / 15`,
/// `id = 1 / d` (0 when d is 0), `q = clamp(trunc((x - min) * id + 0.5), 0, 15)`,
/// then d and min rounded to f16.
pub fn quantize_q4_1_block(x: &[f32; 32]) -> Q4_1Block {
    let mut lo = x[0];
    let mut hi = x[0];
    for &v in &x[1..] {
        // numpy's max/min propagate NaN; model weights are finite, and NaN then
        // yields NaN d and m as in numpy.
        if v.is_nan() || lo.is_nan() {
            lo = f32::NAN;
        } else if v < lo {
            lo = v;
        }
        if v.is_nan() || hi.is_nan() {
            hi = f32::NAN;
        } else if v > hi {
            hi = v;
        }
    }
    let d = (hi - lo) / 15.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut q = [0u8; 32];
    for (qi, &v) in q.iter_mut().zip(x) {
        let t = ((v - lo) * id + 0.5).trunc();
        // numpy: float -> uint8 (values here are 0..=15.x), then clip.
        *qi = if t.is_nan() {
            0
        } else {
            t.clamp(0.0, 255.0) as u8
        }
        .min(15);
    }
    Q4_1Block {
        d: f16::from_f32(d),
        m: f16::from_f32(lo),
        q,
    }
}

/// Dequantizes `bytes` of ggml type `ty` to f32, as gguf-py's `dequantize` does.
/// Returns `None` for types without a dequantizer here (Q2_K, Q3_K, Q8_1, Q8_K, ints).
/// `bytes.len()` must be a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let (elems, size) = ty.block();
    debug_assert_eq!(bytes.len() % size, 0);
    let mut out = Vec::with_capacity(bytes.len() / size * elems);
    let blocks = bytes.chunks_exact(size);
    match ty {
        GgmlType::F32 => out.extend(blocks.map(|b| f32::from_le_bytes(b.try_into().unwrap()))),
        GgmlType::F16 => out.extend(blocks.map(|b| f16_at(b, 0))),
        GgmlType::BF16 => {
            out.extend(blocks.map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()))
        }
        GgmlType::Q4_0 => {
            for b in blocks {
                let (d, q) = q4_0_block(b);
                let d = d.to_f32();
                out.extend(q.iter().map(|&q| d * q as f32));
            }
        }
        GgmlType::Q4_1 => {
            for b in blocks {
                let blk = Q4_1Block::from_bytes(b);
                let (d, m) = (blk.d.to_f32(), blk.m.to_f32());
                out.extend(blk.q.iter().map(|&q| d * q as f32 + m));
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let has_min = ty == GgmlType::Q5_1;
            for b in blocks {
                let d = f16_at(b, 0);
                let (m, qh_at) = if has_min { (f16_at(b, 2), 4) } else { (0.0, 2) };
                let qh = u32::from_le_bytes(b[qh_at..qh_at + 4].try_into().unwrap());
                let qs = &b[qh_at + 4..qh_at + 20];
                for j in 0..32 {
                    let lo = if j < 16 {
                        qs[j] & 0x0f
                    } else {
                        qs[j - 16] >> 4
                    };
                    let q = lo | ((((qh >> j) & 1) as u8) << 4);
                    out.push(if has_min {
                        d * q as f32 + m
                    } else {
                        d * (q as i32 - 16) as f32
                    });
                }
            }
        }
        GgmlType::Q8_0 => {
            for b in blocks {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let five = ty == GgmlType::Q5_K;
            for b in blocks {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let (sc, mn) = k_scale_min(&b[4..16]);
                let (qh, qs) = if five {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for sub in 0..8 {
                    let dl = d * sc[sub] as f32;
                    let ml = dmin * mn[sub] as f32;
                    let bytes = &qs[(sub / 2) * 32..(sub / 2) * 32 + 32];
                    for i in 0..32 {
                        let mut q = if sub % 2 == 0 {
                            bytes[i] & 0x0f
                        } else {
                            bytes[i] >> 4
                        };
                        if five {
                            q |= ((qh[i] >> sub) & 1) << 4;
                        }
                        out.push(dl * q as f32 - ml);
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for b in blocks {
                let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for e in 0..256 {
                    let (h, r) = (e / 128, e % 128);
                    let lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
                    let hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
                    let q = (lo | (hi << 4)) as i32 - 32;
                    let dl = d * scales[e / 16] as i8 as f32;
                    out.push(dl * q as f32);
                }
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The 6-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes).
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for i in 0..4 {
        sc[i] = s[i] & 0x3f;
        mn[i] = s[4 + i] & 0x3f;
        sc[4 + i] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
        mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    (sc, mn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_quantizer_matches_gguf_py_rules() {
        // min -1, max 2: d = 0.2, codes trunc((x + 1) * 5 + 0.5).
        let mut x = [0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = -1.0 + 3.0 * i as f32 / 31.0;
        }
        let b = quantize_q4_1_block(&x);
        assert_eq!(b.m, f16::from_f32(-1.0));
        assert_eq!(b.d, f16::from_f32(3.0 / 15.0));
        let id = 1.0f32 / (3.0f32 / 15.0);
        for (i, (&q, &v)) in b.q.iter().zip(&x).enumerate() {
            assert_eq!(q, (((v + 1.0) * id + 0.5).trunc() as u8).min(15), "{i}");
        }
        assert_eq!(b.q[0], 0);
        assert_eq!(b.q[31], 15);
        // A constant block: d = 0, every code 0, m = the value.
        let c = quantize_q4_1_block(&[0.75; 32]);
        assert_eq!((c.d.to_f32(), c.m.to_f32(), c.q), (0.0, 0.75, [0u8; 32]));
    }

    #[test]
    fn block_layouts_decode_known_values() {
        // Q4_1: d = 0.5, m = -1, element j = j % 16.
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16 {
            b[4 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let v = dequantize(GgmlType::Q4_1, &b).unwrap();
        assert_eq!(v[3], 0.5 * 3.0 - 1.0);
        assert_eq!(v[16 + 3], 0.5 * 12.0 - 1.0);
        // Q8_0: d = 0.25, q = -3.
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[2 + 5] = (-3i8) as u8;
        let v = dequantize(GgmlType::Q8_0, &b).unwrap();
        assert_eq!((v[5], v[6]), (-0.75, 0.0));
        // Q5_0: high bit of element 20 set, low nibble 1: q = 17 - 16 = 1.
        let mut b = vec![0u8; 22];
        b[0..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[2..6].copy_from_slice(&(1u32 << 20).to_le_bytes());
        b[6 + 4] = 0x10;
        let v = dequantize(GgmlType::Q5_0, &b).unwrap();
        assert_eq!((v[20], v[4], v[0]), (2.0, -32.0, -32.0));
        // Q5_1: d = 0.5, m = -3; element 3 has low nibble 7 and its high bit set
        // (q = 23), element 19 the high nibble 2 and no high bit (q = 2).
        let mut b = vec![0u8; 24];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-3.0).to_le_bytes());
        b[4..8].copy_from_slice(&(1u32 << 3).to_le_bytes());
        b[8 + 3] = 7 | (2 << 4);
        let v = dequantize(GgmlType::Q5_1, &b).unwrap();
        assert_eq!(
            (v[3], v[19], v[0]),
            (0.5 * 23.0 - 3.0, 0.5 * 2.0 - 3.0, -3.0)
        );
        // Q6_K: d = 1, scale 0 = 2, element 0: ql low nibble 5, qh bits 0 = 1 -> q = 21 - 32.
        let mut b = vec![0u8; 210];
        b[0] = 5;
        b[128] = 1;
        b[192] = 2;
        b[208..210].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        let v = dequantize(GgmlType::Q6_K, &b).unwrap();
        assert_eq!(v[0], 2.0 * (21 - 32) as f32);
        // Q4_K: d = 1, dmin = 0.5, sub-block 5 scale 3 / min 2 (packed high form).
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[4 + 8 + 1] = 3 | (2 << 4);
        b[16 + 2 * 32 + 7] = 9 << 4; // sub-block 5 = high nibbles of bytes 64..96
        let v = dequantize(GgmlType::Q4_K, &b).unwrap();
        assert_eq!(v[5 * 32 + 7], 3.0 * 9.0 - 0.5 * 2.0);
        assert_eq!(v[5 * 32 + 8], -1.0);
    }
}
