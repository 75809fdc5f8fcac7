//! GGUF -> Q4NX against FastFlowLM's own output: byte-identical files.

use std::path::PathBuf;

use q4nx_convert::gguf::GgufFile;
use q4nx_convert::GgufConverter;

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

/// A GGUF whose `general.architecture` is not Llama or Qwen3 is refused by name.
#[test]
fn unknown_architecture_is_refused_by_name() {
    let mut bytes = std::fs::read(fixture("tiny-llama/model.Q4_1.gguf")).unwrap();
    // The first string value after the key `general.architecture` is "llama" (5 bytes).
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4 + 8;
    assert_eq!(&bytes[at..at + 5], b"llama");
    bytes[at..at + 5].copy_from_slice(b"gemma");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma.gguf");
    std::fs::write(&path, bytes).unwrap();
    let gguf = GgufFile::open(&path).unwrap();
    let err = GgufConverter::new(&gguf).err().unwrap().to_string();
    assert!(
        err.starts_with("convert: ")
            && err.ends_with(
                "architecture 'gemma' is not supported (supported: llama, qwen3, gemma3)"
            ),
        "{err}"
    );
}

/// A tensor the architecture has no place for is refused by name.
#[test]
fn unknown_tensor_is_refused_by_name() {
    let mut bytes = std::fs::read(fixture("tiny-qwen3/model.Q4_1.gguf")).unwrap();
    let name = b"output_norm.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap();
    bytes[at..at + name.len()].copy_from_slice(b"output_xorm.weight");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.gguf");
    std::fs::write(&path, bytes).unwrap();
    let gguf = GgufFile::open(&path).unwrap();
    let err = GgufConverter::new(&gguf)
        .unwrap()
        .convert(&|_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.ends_with("tensor 'output_xorm.weight' has no place in a qwen3 package"),
        "{err}"
    );
}
