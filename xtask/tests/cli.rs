//! The `xtask` command line as a user meets it: the usage lists every task the binary
//! dispatches, and a wrong task, model or argument is refused by name with a failing exit
//! status, before any work starts.
//!
//! This file also makes `cargo test --workspace` build the `xtask` binary in the test
//! profile with the workspace's features, which `.ci/run` then runs for its xtask steps
//! instead of a second, release build (docs/development.md, "CI time").

use std::process::{Command, Output};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("xtask starts")
}

/// The tasks `main` dispatches, read from its `match` (`"name" => module::run(rest)`).
fn dispatched_tasks() -> Vec<String> {
    let main = include_str!("../src/main.rs");
    main.lines()
        .filter_map(|line| {
            let line = line.trim();
            let (name, call) = line.split_once(" => ")?;
            let name = name.strip_prefix('"')?.strip_suffix('"')?;
            call.ends_with("::run(rest),").then(|| name.to_string())
        })
        .collect()
}

#[test]
fn the_usage_lists_every_task() {
    let tasks = dispatched_tasks();
    assert!(
        tasks.len() >= 10,
        "the dispatch table was not read: {tasks:?}"
    );
    let out = xtask(&[]);
    assert!(out.status.success());
    let usage = String::from_utf8(out.stdout).unwrap();
    for task in &tasks {
        assert!(
            usage
                .lines()
                .any(|l| l.trim_start().starts_with(task.as_str())),
            "the usage does not list the task '{task}':\n{usage}"
        );
    }
}

/// Runs xtask with `args` and requires a failing exit status whose error says `message`.
fn assert_refused(args: &[&str], message: &str) {
    let out = xtask(args);
    assert!(!out.status.success(), "xtask {args:?} succeeded");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains(message), "xtask {args:?}: {err}");
}

#[test]
fn an_unknown_task_is_refused_by_name() {
    assert_refused(&["frobnicate"], "unknown task 'frobnicate'");
}

#[test]
fn an_unknown_model_is_refused_before_any_download() {
    assert_refused(
        &["fetch-model", "llama-9000"],
        "fetch-model: unknown model 'llama-9000' (known: smollm2, gemma3)",
    );
}

#[test]
fn tidy_refuses_arguments_by_name() {
    assert_refused(&["tidy", "--fix"], "tidy: takes no arguments (got '--fix')");
}
