//! Shared helpers for onebit's tests: visible skips, and [`http`], a server under test
//! seen over HTTP.
//!
//! A test whose resource is missing (a fetched model, an NPU, a CPU feature) returns
//! early and passes; without `--nocapture` that looks exactly like a pass. [`skip!`]
//! makes it visible: it prints the reason and appends one line
//! `SKIP <test file>::<test name>: <reason>` to the skip log, the file named by
//! `ONEBIT_SKIP_LOG` (default `target/skipped-tests.log` in the workspace). `.ci/run`
//! prints that file after the tests and fails when an arm that should have run skipped.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod http;

use std::io::Write;
use std::path::PathBuf;

/// The string `key` of each object in the JSON array `list` (a listing's ids or names),
/// in order; panics, naming the key and the value, where either is missing.
pub fn strings_of<'a>(list: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {list}"))
        .iter()
        .map(|item| {
            item[key]
                .as_str()
                .unwrap_or_else(|| panic!("no string '{key}' in {item}"))
        })
        .collect()
}

/// The environment variable naming the skip log.
pub const SKIP_LOG_ENV: &str = "ONEBIT_SKIP_LOG";

/// Where skips are recorded: `$ONEBIT_SKIP_LOG`, else `target/skipped-tests.log` in
/// the workspace.
pub fn skip_log() -> PathBuf {
    match std::env::var_os(SKIP_LOG_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/skipped-tests.log"),
    }
}

/// The skip log line for `test` skipping for `reason` (one line, whatever the reason holds).
pub fn skip_line(test: &str, reason: &str) -> String {
    format!("SKIP {test}: {}\n", reason.replace(['\n', '\r'], " "))
}

/// Records a skip: prints it to standard error and appends its line to the skip log.
/// Panics when the log cannot be written (a lost skip would look like a pass again).
pub fn record_skip(test: &str, reason: &str) {
    let line = skip_line(test, reason);
    eprint!("{line}");
    let path = skip_log();
    if let Some(dir) = path.parent() {
        // A missing directory is reported by the open below.
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one short line in append mode: concurrent tests do not interleave.
    let result = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = result {
        panic!(
            "test-support: skip log {} ({SKIP_LOG_ENV}): cannot append '{}': {e}",
            path.display(),
            line.trim_end()
        );
    }
}

/// `skip!("test_name", "reason {}", args)`: records that `test_name` of the calling
/// test file skipped (see [`record_skip`]); the caller then returns.
#[macro_export]
macro_rules! skip {
    ($test:expr, $($reason:tt)+) => {
        $crate::record_skip(
            &format!("{}::{}", module_path!(), $test),
            &format!($($reason)+),
        )
    };
}

/// The workspace's `target/models/<name>`, where `cargo xtask fetch-model <name>` puts
/// a real model's converted package.
pub fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/models")
        .join(name)
}

/// `fetched_model!("smollm2", "test_name")`: the fetched package's directory
/// ([`model_dir`]) when its `model.q4nx` is there; otherwise `None`, after recording with
/// [`skip!`] that `test_name` skipped for want of it (the reason names the model, which
/// `.ci/run` looks for when the model was fetched).
#[macro_export]
macro_rules! fetched_model {
    ($name:expr, $test:expr) => {{
        let dir = $crate::model_dir($name);
        if dir.join("model.q4nx").exists() {
            Some(dir)
        } else {
            $crate::skip!(
                $test,
                "{} is absent (run `cargo xtask fetch-model {}`)",
                dir.join("model.q4nx").display(),
                $name
            );
            None
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_one_line_naming_the_test_and_the_reason() {
        assert_eq!(
            skip_line("real_smollm2::greedy", "no model\nat all"),
            "SKIP real_smollm2::greedy: no model at all\n"
        );
    }

    #[test]
    fn skips_are_appended_to_the_log_named_by_the_environment() {
        let dir = std::env::temp_dir().join(format!("test-support-{}", std::process::id()));
        let log = dir.join("nested/skips.log");
        // Only this test sets the variable in this process.
        std::env::set_var(SKIP_LOG_ENV, &log);
        assert_eq!(skip_log(), log);
        skip!("first", "reason {}", 1);
        skip!("second", "reason two");
        std::env::remove_var(SKIP_LOG_ENV);
        let text = std::fs::read_to_string(&log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            text,
            "SKIP test_support::tests::first: reason 1\nSKIP test_support::tests::second: reason two\n"
        );
    }
}
