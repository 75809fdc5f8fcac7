//! ggml block arithmetic against gguf-py 0.19.0 itself, bit for bit
//! (`fixtures/ggml-reference`, made by `cargo xtask ggml-reference`).

use std::path::PathBuf;

use q4nx_convert::ggml::{dequantize, quantize_q4_1_block};
use q4nx_convert::gguf::GgmlType;
use q4nx_format::Container;

fn reference() -> Container {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/ggml-reference/gguf-py-0.19.0.safetensors");
    Container::open(p).unwrap()
}

#[test]
fn dequantization_is_bit_identical_to_gguf_py() {
    let c = reference();
    use GgmlType::*;
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16] {
        let blocks = c.tensor(&format!("{ty}.blocks")).unwrap().bytes;
        let expected = c.tensor(&format!("{ty}.values")).unwrap().to_f32().unwrap();
        let ours = dequantize(ty, blocks).unwrap();
        assert_eq!(ours.len(), expected.len(), "{ty}");
        for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty} element {i}: ours {a}, gguf-py {b}"
            );
        }
    }
}

#[test]
fn q4_1_quantizer_is_bit_identical_to_gguf_py() {
    let c = reference();
    let input = c.tensor("q4_1.input").unwrap().to_f32().unwrap();
    let expected = c.tensor("q4_1.output").unwrap().bytes;
    assert_eq!(input.len() / 32 * 20, expected.len());
    for (g, (x, want)) in input
        .chunks_exact(32)
        .zip(expected.chunks_exact(20))
        .enumerate()
    {
        let b = quantize_q4_1_block(x.try_into().unwrap());
        let mut bytes = Vec::with_capacity(20);
        bytes.extend(b.d.to_le_bytes());
        bytes.extend(b.m.to_le_bytes());
        for j in 0..16 {
            bytes.push(b.q[j] | (b.q[j + 16] << 4));
        }
        assert_eq!(bytes, want, "group {g}");
    }
}
