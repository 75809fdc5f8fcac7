//! Property tests that mutate real containers: nothing may panic, and whatever is
//! accepted must be internally consistent. `cargo xtask fuzz` runs the same
//! mutations for minutes at a time.

use std::path::PathBuf;

use proptest::prelude::*;
use q4nx_format::{Container, ContainerWriter, Dtype};

fn fixture_bytes() -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/tiny-qwen3/model.q4nx");
    std::fs::read(p).unwrap()
}

fn exercise(bytes: Vec<u8>) {
    q4nx_format::fuzzing::exercise_container(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_header_bytes_never_panic(edits in prop::collection::vec((0usize..2600, any::<u8>()), 1..8)) {
        let mut bytes = fixture_bytes();
        for (at, value) in edits {
            let at = at % bytes.len().min(2600);
            bytes[at] = value;
        }
        exercise(bytes);
    }

    #[test]
    fn digit_edits_in_header_never_panic(edits in prop::collection::vec((0usize..2528, b'0'..=b'9'), 1..6)) {
        let mut bytes = fixture_bytes();
        for (at, digit) in edits {
            let at = 8 + at;
            if bytes[at].is_ascii_digit() {
                bytes[at] = digit;
            }
        }
        exercise(bytes);
    }

    #[test]
    fn truncation_and_extension_never_panic(cut in 0usize..544744, extra in 0usize..16) {
        let mut bytes = fixture_bytes();
        bytes.truncate(cut);
        bytes.extend(std::iter::repeat_n(0u8, extra));
        exercise(bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise(bytes);
    }

    #[test]
    fn writer_output_reads_back(
        tensors in prop::collection::btree_map("[a-z.]{1,12}", (0usize..6, prop::collection::vec(0usize..5, 0..3)), 0..8),
        meta in prop::option::of(prop::collection::btree_map("[a-z]{1,6}", "[ -~]{0,10}", 0..3)),
    ) {
        let mut w = ContainerWriter::new();
        let mut expected = Vec::new();
        for (i, (name, (dt, shape))) in tensors.iter().enumerate() {
            let dtype = [Dtype::I8, Dtype::BF16, Dtype::F32, Dtype::F16, Dtype::U8, Dtype::I64][*dt];
            let len = shape.iter().product::<usize>() * dtype.size();
            let data: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
            w.add(name.clone(), dtype, shape, data.clone()).unwrap();
            expected.push((name.clone(), dtype, shape.clone(), data));
        }
        if let Some(m) = &meta { w.metadata(m.clone()); }
        let bytes = w.to_bytes();
        prop_assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()) % 8, 0);
        let c = Container::from_bytes("round-trip", bytes).unwrap();
        prop_assert_eq!(c.len(), expected.len());
        prop_assert_eq!(c.metadata(), meta.as_ref());
        for (name, dtype, shape, data) in expected {
            let t = c.tensor(&name).unwrap();
            prop_assert_eq!(t.dtype, dtype);
            prop_assert_eq!(t.shape, &shape[..]);
            prop_assert_eq!(t.bytes, &data[..]);
        }
    }
}

#[test]
fn writer_refuses_duplicates_and_wrong_lengths() {
    let mut w = ContainerWriter::new();
    w.add("a", Dtype::F32, &[2], vec![0; 8]).unwrap();
    let err = w.add("a", Dtype::F32, &[2], vec![0; 8]).err().unwrap();
    assert_eq!(err.to_string(), "q4nx: writer: tensor 'a' added twice");
    let err = w.add("b", Dtype::BF16, &[3], vec![0; 4]).err().unwrap();
    assert_eq!(
        err.to_string(),
        "q4nx: writer: tensor 'b': BF16 [3] needs 6 bytes, got 4"
    );
    let err = w
        .add("__metadata__", Dtype::U8, &[0], vec![])
        .err()
        .unwrap();
    assert!(err.to_string().contains("reserved"));
}
