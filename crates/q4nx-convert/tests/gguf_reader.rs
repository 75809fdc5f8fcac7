//! The GGUF reader: files built byte by byte, malformed ones refused by message,
//! and property tests (round trip; mutated real files never panic).

use std::path::PathBuf;

use proptest::prelude::*;
use q4nx_convert::gguf::{GgmlType, Gguf, GgufValue};

/// A minimal GGUF writer for tests: metadata entries and tensor infos as raw parts.
#[derive(Default, Clone)]
struct Builder {
    version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
    alignment: u64,
}

fn gstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s);
}

impl Builder {
    fn new() -> Builder {
        Builder {
            version: 3,
            alignment: 32,
            ..Default::default()
        }
    }
    fn kv_raw(mut self, key: &[u8], ty: u32, value: &[u8]) -> Builder {
        gstr(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }
    fn kv_u32(self, key: &str, v: u32) -> Builder {
        self.kv_raw(key.as_bytes(), 4, &v.to_le_bytes())
    }
    fn kv_str(self, key: &str, v: &str) -> Builder {
        let mut b = Vec::new();
        gstr(&mut b, v.as_bytes());
        self.kv_raw(key.as_bytes(), 8, &b)
    }
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Builder {
        gstr(&mut self.infos, name.as_bytes());
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }
    fn data(mut self, bytes: &[u8]) -> Builder {
        self.data.extend(bytes);
        self
    }
    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        while !(out.len() as u64).is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

fn check(bytes: Vec<u8>, expect: &[&str]) {
    let err = Gguf::parse("bad.gguf", &bytes).expect_err("must be refused");
    let msg = err.to_string();
    assert!(msg.starts_with("gguf: bad.gguf: "), "{msg}");
    for piece in expect {
        assert!(msg.contains(piece), "message {msg:?} lacks {piece:?}");
    }
}

fn f32_tensor() -> Builder {
    Builder::new().tensor("w", &[4, 2], 0, 0).data(&[0u8; 32])
}

#[test]
fn well_formed_file_parses() {
    let g = Gguf::parse(
        "ok.gguf",
        &f32_tensor().kv_str("general.architecture", "llama").build(),
    )
    .unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(
        g.metadata_value("general.architecture")
            .and_then(|v| v.as_str()),
        Some("llama")
    );
    let t = g.tensor("w").unwrap();
    assert_eq!(
        (t.ggml_type, t.rows(), t.cols(), t.shape()),
        (GgmlType::F32, 2, 4, vec![2, 4])
    );
}

#[test]
fn bad_magic() {
    let mut b = f32_tensor().build();
    b[0] = b'X';
    check(b, &["bad magic [88, 71, 85, 70]"]);
}

#[test]
fn unsupported_version() {
    let mut builder = f32_tensor();
    builder.version = 1;
    check(builder.build(), &["version 1 is not supported"]);
}

#[test]
fn truncated_header() {
    check(
        b"GGUF\x03\x00".to_vec(),
        &["truncated at byte 4: version needs 4 bytes, 2 left"],
    );
}

#[test]
fn metadata_count_larger_than_the_file() {
    let mut b = f32_tensor().build();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    check(b, &["metadata count 18446744073709551615 cannot fit"]);
}

#[test]
fn tensor_count_larger_than_the_file() {
    let mut b = f32_tensor().build();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    check(b, &["tensor count 1099511627776 cannot fit"]);
}

#[test]
fn unknown_value_type() {
    check(
        Builder::new().kv_raw(b"k", 13, &[0; 8]).build(),
        &["key 'k': unknown value type 13"],
    );
}

#[test]
fn nested_array() {
    let mut v = 9u32.to_le_bytes().to_vec();
    v.extend(1u64.to_le_bytes());
    check(
        Builder::new().kv_raw(b"k", 9, &v).build(),
        &["key 'k': nested arrays are not supported"],
    );
}

#[test]
fn array_count_larger_than_the_file() {
    let mut v = 4u32.to_le_bytes().to_vec();
    v.extend((1u64 << 60).to_le_bytes());
    check(
        Builder::new().kv_raw(b"k", 9, &v).build(),
        &["array 'k' count 1152921504606846976 cannot fit"],
    );
}

#[test]
fn key_not_utf8() {
    check(
        Builder::new().kv_raw(b"k\xff", 4, &[0; 4]).build(),
        &["metadata key is not UTF-8"],
    );
}

#[test]
fn string_longer_than_the_file() {
    let mut v = Vec::new();
    v.extend(1000u64.to_le_bytes());
    v.extend(b"abc");
    check(
        Builder::new().kv_raw(b"k", 8, &v).build(),
        &["k needs 1000 bytes"],
    );
}

#[test]
fn duplicate_key() {
    check(
        Builder::new().kv_u32("a", 1).kv_u32("a", 2).build(),
        &["key 'a' appears twice"],
    );
}

#[test]
fn bad_alignment() {
    check(
        f32_tensor().kv_u32("general.alignment", 24).build(),
        &["key 'general.alignment'", "not a power of two"],
    );
}

#[test]
fn too_many_dimensions() {
    check(
        Builder::new().tensor("w", &[1, 1, 1, 1, 1], 0, 0).build(),
        &["tensor 'w': 5 dimensions (1 to 4 allowed)"],
    );
}

#[test]
fn unknown_ggml_type() {
    check(
        Builder::new()
            .tensor("w", &[4], 99, 0)
            .data(&[0; 16])
            .build(),
        &["tensor 'w': unknown ggml type 99"],
    );
}

#[test]
fn row_not_whole_blocks() {
    check(
        Builder::new()
            .tensor("w", &[48, 2], 3, 0)
            .data(&[0; 64])
            .build(),
        &["tensor 'w': 2 rows of 48 elements are not whole Q4_1 blocks of 32"],
    );
}

#[test]
fn misaligned_offset() {
    check(
        Builder::new()
            .tensor("w", &[4], 0, 8)
            .data(&[0; 32])
            .build(),
        &["tensor 'w': offset 8 is not a multiple of the alignment 32"],
    );
}

#[test]
fn data_past_the_end() {
    check(
        Builder::new()
            .tensor("w", &[64], 0, 0)
            .data(&[0; 100])
            .build(),
        &["tensor 'w': data", "runs past the end"],
    );
}

#[test]
fn size_overflow() {
    check(
        Builder::new()
            .tensor("w", &[1 << 40, 1 << 40], 0, 0)
            .build(),
        &["tensor 'w': dims", "overflow"],
    );
}

#[test]
fn overlapping_tensors() {
    check(
        Builder::new()
            .tensor("a", &[16], 0, 0)
            .tensor("b", &[16], 0, 32)
            .data(&[0; 96])
            .build(),
        &["tensor 'b': data overlaps tensor 'a'"],
    );
}

#[test]
fn duplicate_tensor() {
    check(
        Builder::new()
            .tensor("a", &[8], 0, 0)
            .tensor("a", &[8], 0, 32)
            .data(&[0; 64])
            .build(),
        &["tensor 'a' appears twice"],
    );
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures")
            .join(name),
    )
    .unwrap()
}

#[test]
fn real_fixture_metadata_reads_as_written() {
    let g = Gguf::parse("tiny-llama", &fixture("tiny-llama/model.Q4_1.gguf")).unwrap();
    assert_eq!(g.tensors.len(), 20);
    assert_eq!(
        g.metadata_value("llama.rope.dimension_count"),
        Some(&GgufValue::U32(32))
    );
    assert_eq!(
        g.metadata_value("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len()),
        Some(512)
    );
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ggml_type, embd.dims.clone()),
        (GgmlType::Q4_1, vec![128, 512])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn written_files_read_back(
        values in prop::collection::vec((0u32..4, any::<u32>(), "[a-z]{0,8}"), 0..6),
        tensors in prop::collection::vec((1u64..4, 1u64..3), 0..4),
    ) {
        let mut b = Builder::new();
        for (i, (kind, n, s)) in values.iter().enumerate() {
            let key = format!("k{i}");
            b = match kind {
                0 => b.kv_u32(&key, *n),
                1 => b.kv_str(&key, s),
                2 => b.kv_raw(key.as_bytes(), 7, &[(*n % 2) as u8]),
                _ => b.kv_raw(key.as_bytes(), 12, &(*n as f64).to_le_bytes()),
            };
        }
        let mut offset = 0u64;
        for (i, (blocks, rows)) in tensors.iter().enumerate() {
            b = b.tensor(&format!("t{i}"), &[32 * blocks, *rows], 3, offset);
            let size = blocks * rows * 20;
            b = b.data(&vec![i as u8; size as usize]);
            let padded = size.next_multiple_of(32);
            b = b.data(&vec![0; (padded - size) as usize]);
            offset += padded;
        }
        let bytes = b.build();
        let g = Gguf::parse("prop", &bytes).unwrap();
        prop_assert_eq!(g.metadata.len(), values.len());
        for (i, (kind, n, s)) in values.iter().enumerate() {
            let v = g.metadata_value(&format!("k{i}")).unwrap();
            match kind {
                0 => prop_assert_eq!(v, &GgufValue::U32(*n)),
                1 => prop_assert_eq!(v.as_str(), Some(s.as_str())),
                2 => prop_assert_eq!(v, &GgufValue::Bool(*n % 2 == 1)),
                _ => prop_assert_eq!(v.as_f64(), Some(*n as f64)),
            }
        }
        for (i, (blocks, rows)) in tensors.iter().enumerate() {
            let t = g.tensor(&format!("t{i}")).unwrap();
            prop_assert_eq!(t.range.len() as u64, blocks * rows * 20);
            prop_assert!(bytes[t.range.clone()].iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn mutated_real_files_never_panic(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut bytes = fixture("tiny-qwen3/model.Q4_1.gguf");
        let header = 20_000.min(bytes.len());
        for (at, v) in edits {
            bytes[at % header] = v;
        }
        if cut % 3 == 0 {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        q4nx_convert::fuzzing::exercise_gguf(&bytes);
    }
}
