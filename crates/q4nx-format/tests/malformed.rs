//! Malformed containers, each refused with a message naming what is wrong.

use q4nx_format::{Container, FormatError, MAX_HEADER_LEN};

/// A file with the given header text and `data_len` zero bytes of data.
fn file(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0u8, data_len));
    out
}

/// Parses `bytes` and requires a refusal whose message contains every piece of `expect`.
fn check(bytes: Vec<u8>, expect: &[&str]) -> FormatError {
    let err = Container::from_bytes("bad.q4nx", bytes).expect_err("must be refused");
    let msg = err.to_string();
    assert!(msg.starts_with("q4nx: bad.q4nx: "), "{msg}");
    for piece in expect {
        assert!(msg.contains(piece), "message {msg:?} lacks {piece:?}");
    }
    err
}

const GOOD: &str = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}"#;

#[test]
fn good_container_is_accepted() {
    let c = Container::from_bytes("good", file(GOOD, 16)).unwrap();
    let names: Vec<_> = c.tensors().map(|t| t.name.to_string()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn empty_file() {
    check(vec![], &["file is 0 bytes, too short"]);
}

#[test]
fn truncated_length_prefix() {
    check(vec![1, 0, 0], &["file is 3 bytes, too short"]);
}

#[test]
fn header_too_long() {
    let mut bytes = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    check(
        bytes,
        &["header length 100000001 exceeds the limit of 100000000"],
    );
}

#[test]
fn header_past_end_of_file() {
    let mut bytes = 64u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    check(
        bytes,
        &["header length 64 runs past the end of the 10-byte file"],
    );
}

#[test]
fn truncated_data() {
    let mut bytes = file(GOOD, 16);
    bytes.truncate(bytes.len() - 3);
    check(
        bytes,
        &["tensor 'b'", "end 16 is past the 13 bytes of data"],
    );
}

#[test]
fn header_not_utf8() {
    let mut bytes = file(r#"{"a":1}"#, 0);
    bytes[10] = 0xff;
    check(bytes, &["header is not UTF-8", "offset 2"]);
}

#[test]
fn header_not_json() {
    check(
        file(r#"{"a": {"dtype": "#, 0),
        &["header is not valid JSON"],
    );
}

#[test]
fn header_not_an_object() {
    check(
        file("[1, 2, 3]", 0),
        &["header JSON is not an object: found an array"],
    );
}

#[test]
fn trailing_garbage_after_json() {
    check(
        file(r#"{} x"#, 0),
        &["header is not valid JSON", "trailing characters"],
    );
}

#[test]
fn unknown_dtype() {
    check(
        file(
            r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#,
            1,
        ),
        &["tensor 'w'", "unknown dtype label 'Q4'"],
    );
}

#[test]
fn entry_missing_key() {
    check(
        file(r#"{"w":{"dtype":"I8","data_offsets":[0,1]}}"#, 1),
        &["tensor 'w'", "missing key 'shape'"],
    );
}

#[test]
fn entry_unexpected_key() {
    check(
        file(
            r#"{"w":{"dtype":"I8","shape":[1],"data_offsets":[0,1],"scale":2}}"#,
            1,
        ),
        &["tensor 'w'", "unexpected key 'scale'"],
    );
}

#[test]
fn negative_shape() {
    check(
        file(
            r#"{"w":{"dtype":"I8","shape":[-1],"data_offsets":[0,1]}}"#,
            1,
        ),
        &["tensor 'w'", "'shape'[0] is -1, not a non-negative integer"],
    );
}

#[test]
fn three_offsets() {
    check(
        file(
            r#"{"w":{"dtype":"I8","shape":[1],"data_offsets":[0,1,2]}}"#,
            1,
        ),
        &["tensor 'w'", "'data_offsets' has 3 values, not 2"],
    );
}

#[test]
fn inverted_offsets() {
    check(
        file(
            r#"{"w":{"dtype":"I8","shape":[0],"data_offsets":[4,2]}}"#,
            4,
        ),
        &["tensor 'w'", "data_offsets [4, 2] end before they begin"],
    );
}

#[test]
fn size_overflow() {
    check(
        file(
            r#"{"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
            8,
        ),
        &["tensor 'w'", "overflows"],
    );
}

#[test]
fn size_mismatch() {
    check(
        file(
            r#"{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}}"#,
            4,
        ),
        &["tensor 'w'", "hold 4 bytes, but BF16 [3] needs 6"],
    );
}

#[test]
fn out_of_bounds() {
    check(
        file(
            r#"{"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#,
            4,
        ),
        &["tensor 'w'", "end 8 is past the 4 bytes of data"],
    );
}

#[test]
fn gap_between_tensors() {
    check(
        file(
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}"#,
            5,
        ),
        &[
            "tensor 'b'",
            "starts at 3, but the previous tensor ends at 2 (gap)",
        ],
    );
}

#[test]
fn data_not_starting_at_zero() {
    check(
        file(
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#,
            3,
        ),
        &[
            "tensor 'a'",
            "starts at 1, but the previous tensor ends at 0 (gap)",
        ],
    );
}

#[test]
fn overlapping_tensors() {
    check(
        file(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
            4,
        ),
        &[
            "tensor 'b'",
            "starts at 2, inside the previous tensor which ends at 4 (overlap)",
        ],
    );
}

#[test]
fn duplicate_name() {
    check(
        file(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2,
        ),
        &["tensor 'a' appears more than once"],
    );
}

#[test]
fn trailing_bytes_after_data() {
    check(
        file(GOOD, 20),
        &["tensors end at data offset 16, but the file has 20 data bytes (4 trailing)"],
    );
}

#[test]
fn metadata_not_strings() {
    check(
        file(r#"{"__metadata__":{"format":1}}"#, 0),
        &["__metadata__ is malformed", "key 'format' holds a number"],
    );
}

#[test]
fn entry_not_an_object() {
    check(
        file(r#"{"w":[1,2]}"#, 0),
        &["tensor 'w'", "expected an object, found an array"],
    );
}

#[test]
fn missing_tensor_lookup_names_it() {
    let c = Container::from_bytes("good", file(GOOD, 16)).unwrap();
    let err = c.tensor("lm_head.weight").unwrap_err();
    assert_eq!(
        err.to_string(),
        "q4nx: good: no tensor named 'lm_head.weight'"
    );
    let err = c
        .tensor("a")
        .unwrap()
        .expect_dtype(q4nx_format::Dtype::BF16)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "q4nx: good: tensor 'a': expected dtype BF16, found F32"
    );
    let err = c.tensor("a").unwrap().to_i64().unwrap_err();
    assert!(err.to_string().contains("found F32"), "{err}");
}

#[test]
fn missing_file_names_path() {
    let err = Container::open("/nonexistent/model.q4nx").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("q4nx: /nonexistent/model.q4nx: cannot read"),
        "{err}"
    );
}
