//! GGUF -> Q4NX against FastFlowLM's own output: byte-identical files.

use std::path::PathBuf;

use q4nx_format::convert::GgufConverter;
use q4nx_format::gguf::GgufFile;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn check_byte_identical(dir: &str) {
    let gguf = GgufFile::open(fixture(dir).join("model.Q4_1.gguf")).unwrap();
    let conv = GgufConverter::new(&gguf).unwrap();
    let (writer, report) = conv.convert(&|_, _| {}).unwrap();
    let ours = writer.to_bytes();
    let theirs = std::fs::read(fixture(dir).join("model.q4nx")).unwrap();
    if ours != theirs {
        // Name the first differing tensor to make a failure readable.
        let a = q4nx_format::Container::from_bytes("ours", ours.clone()).unwrap();
        let b = q4nx_format::Container::from_bytes("reference", theirs.clone()).unwrap();
        for t in b.tensors() {
            let o = a.tensor(t.name).unwrap();
            assert!(o.bytes == t.bytes, "{dir}: tensor {} differs", t.name);
        }
        panic!("{dir}: headers differ");
    }
    assert_eq!(report.tensors, if dir == "tiny-llama" { 21 } else { 25 });
    assert!(report.differences.is_empty(), "{:?}", report.differences);
}

#[test]
fn tiny_llama_converts_byte_identical_to_fastflowlm() {
    check_byte_identical("tiny-llama");
}

#[test]
fn tiny_qwen3_converts_byte_identical_to_fastflowlm() {
    check_byte_identical("tiny-qwen3");
}
