//! The two FastFlowLM-written fixtures: inventory, byte-exact rewrite, tile padding.

use std::path::PathBuf;

use q4nx_format::{Container, ContainerWriter, Dtype, Q4Kind, Q4Matrix};
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

/// One `tensors.tsv` line as (name, dtype, shape, bytes, sha256).
fn inventory(c: &Container) -> Vec<String> {
    let mut lines: Vec<String> = c
        .tensors()
        .map(|t| {
            let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
            format!(
                "{}\t{}\t{}\t{}\t{}",
                t.name,
                t.dtype,
                shape.join("x"),
                t.bytes.len(),
                hex::encode(Sha256::digest(t.bytes))
            )
        })
        .collect();
    lines.sort();
    lines
}

fn check_inventory(dir: &str) {
    let c = Container::open(fixture(dir).join("model.q4nx")).unwrap();
    let tsv = std::fs::read_to_string(fixture(dir).join("tensors.tsv")).unwrap();
    let mut expected: Vec<String> = tsv.lines().skip(1).map(str::to_string).collect();
    expected.sort();
    assert_eq!(
        inventory(&c),
        expected,
        "{dir}: inventory differs from tensors.tsv"
    );
    assert!(c.metadata().is_none());
}

#[test]
fn tiny_llama_inventory_matches_tensors_tsv() {
    check_inventory("tiny-llama");
}

#[test]
fn tiny_qwen3_inventory_matches_tensors_tsv() {
    check_inventory("tiny-qwen3");
}

/// Re-adding every tensor (in reverse order, to prove the writer sorts) gives the
/// converter's file byte for byte: header order, JSON and padding included.
fn check_rewrite(dir: &str) {
    let path = fixture(dir).join("model.q4nx");
    let original = std::fs::read(&path).unwrap();
    let c = Container::open(&path).unwrap();
    let mut w = ContainerWriter::new();
    let views: Vec<_> = c.tensors().collect();
    for t in views.iter().rev() {
        w.add(t.name, t.dtype, t.shape, t.bytes.to_vec()).unwrap();
    }
    assert!(
        w.to_bytes() == original,
        "{dir}: rewritten container differs"
    );
}

#[test]
fn writer_reproduces_tiny_llama_byte_for_byte() {
    check_rewrite("tiny-llama");
}

#[test]
fn writer_reproduces_tiny_qwen3_byte_for_byte() {
    check_rewrite("tiny-qwen3");
}

/// Every projection of the fixtures is a tile grid for its config geometry, and the
/// columns padded from K = 128 to 256 decode to zero (d = m = 0 there).
#[test]
fn fixture_projections_are_tile_grids_with_zero_padding() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let c = Container::open(fixture(dir).join("model.q4nx")).unwrap();
        let (hidden, inter, vocab, kv) = (128, 256, 512, 64);
        let mut shapes = vec![("lm_head.weight".to_string(), vocab, hidden)];
        for l in 0..2 {
            let p = format!("model.layers.{l}.");
            shapes.push((format!("{p}self_attn.q_proj.weight"), hidden, hidden));
            shapes.push((format!("{p}self_attn.k_proj.weight"), kv, hidden));
            shapes.push((format!("{p}self_attn.v_proj.weight"), kv, hidden));
            shapes.push((format!("{p}self_attn.o_proj.weight"), hidden, hidden));
            shapes.push((format!("{p}mlp.gate_proj.weight"), inter, hidden));
            shapes.push((format!("{p}mlp.up_proj.weight"), inter, hidden));
            shapes.push((format!("{p}mlp.down_proj.weight"), hidden, inter));
        }
        for (name, n, k) in shapes {
            let view = c.tensor(&name).unwrap();
            let m = Q4Matrix::from_tensor(&view, n, k, Q4Kind::Q4_1).unwrap();
            let values = m.decode();
            assert_eq!(values.len(), n * k);
            assert!(values.iter().all(|v| v.is_finite()), "{dir} {name}");
            assert!(values.iter().any(|&v| v != 0.0), "{dir} {name}");
            if k < 256 {
                for rb in 0..n / 32 {
                    let tile = m.decode_tile(rb, 0);
                    for r in 0..32 {
                        assert!(tile[r * 256 + k..(r + 1) * 256].iter().all(|&v| v == 0.0));
                    }
                }
            }
            // The wrong geometry is refused by name.
            let err = Q4Matrix::from_tensor(&view, n + 32, k, Q4Kind::Q4_1).unwrap_err();
            assert!(err.to_string().contains(&name), "{err}");
        }
        let embed = c.tensor("model.embed_tokens.weight").unwrap();
        assert_eq!(embed.dtype, Dtype::BF16);
        assert_eq!(embed.to_f32().unwrap().len(), vocab * hidden);
    }
}

/// `read` (no map) and `open` (map) see the same container.
#[test]
fn read_and_open_agree() {
    let path = fixture("tiny-qwen3").join("model.q4nx");
    let a = Container::open(&path).unwrap();
    let b = Container::read(&path).unwrap();
    assert_eq!(a.header(), b.header());
    assert_eq!(a.file_bytes(), b.file_bytes());
}
