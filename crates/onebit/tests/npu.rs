//! `onebit doctor` and `--backend`: the NPU path as far as it goes without an NPU.

mod common;

use common::{fixture, json_of, onebit, reference_pair};

#[test]
fn doctor_reports_the_machine_and_why_the_npu_is_not_usable() {
    let out = onebit().arg("doctor").arg("--json").output().unwrap();
    let report = json_of(out);
    assert!(report["cpu"]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k == "scalar"));
    // Every kernel family names the variant it runs here.
    for family in ["q4xf32", "q8", "bf16"] {
        let variant = report["cpu"]["families"][family]
            .as_str()
            .unwrap_or_default();
        assert!(!variant.is_empty(), "{family}: {}", report["cpu"]);
    }
    assert_eq!(report["xrt"]["built_with_xrt"], cfg!(feature = "xrt"));
    let usable = report["npu"]["usable"].as_bool().unwrap();
    let reason = report["npu"]["reason"].as_str().unwrap();
    if !usable {
        // On this machine: no accel node, or (with one) the missing XRT build.
        assert!(
            reason.starts_with("no /dev/accel device") || reason.contains("XRT"),
            "{reason}"
        );
    }
    let text = onebit().arg("doctor").assert().success();
    let stdout = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        stdout.contains(&format!(
            "npu: {}: {reason}",
            if usable { "usable" } else { "not usable" }
        )),
        "{stdout}"
    );
}

#[test]
fn doctor_checks_a_plan_a_manifest_and_the_sim_device() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k.xclbin"), b"x").unwrap();
    std::fs::write(dir.path().join("mm.txt"), "06030100\n").unwrap();
    let manifest = dir.path().join("kernels.json");
    std::fs::write(
        &manifest,
        r#"{"onebit_kernel_manifest": 1, "xclbin": "k.xclbin", "kernels": {
            "matmul_q4": {"kernel": "MLIR_AIE", "instructions": "mm.txt",
              "args": ["opcode", "instructions", "instruction_words", "buffer:x", "buffer:weight", "buffer:out", "scalar:rows"]}}}"#,
    )
    .unwrap();
    let out = onebit()
        .args(["doctor", "--json", "--compare-ops", "--model"])
        .arg(fixture("tiny-qwen3"))
        .arg("--kernels")
        .arg(&manifest)
        .output()
        .unwrap();
    let report = json_of(out);
    assert_eq!(report["plan"]["steps"], 1 + 16 * 2 + 2);
    assert_eq!(
        report["manifest"]["kernels"],
        serde_json::json!(["matmul_q4"])
    );
    let missing: Vec<&str> = report["manifest"]["missing_for_plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        missing.contains(&"attention") && !missing.contains(&"matmul_q4"),
        "{missing:?}"
    );
    assert_eq!(report["compare_ops"]["all_passed"], true);
    assert_eq!(report["compare_ops"]["ops"].as_array().unwrap().len(), 10);

    std::fs::write(
        &manifest,
        r#"{"onebit_kernel_manifest": 1, "kernels": {"softmax": {}}}"#,
    )
    .unwrap();
    let out = onebit()
        .args(["doctor", "--kernels"])
        .arg(&manifest)
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr.contains("config key 'kernels.softmax' is not an op of the plan"),
        "{stderr}"
    );
}

/// The simulated NPU generates exactly the CPU backend's tokens, plain and speculative.
#[test]
fn sim_backend_generates_the_cpu_backends_tokens() {
    let run = |backend: &str, extra: &[&str]| {
        let out = onebit()
            .args([
                "run",
                "--json",
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--prompt-tokens",
                "1,17,33,250",
                "--backend",
                backend,
                "--model",
            ])
            .arg(fixture("tiny-llama"))
            .args(extra)
            .output()
            .unwrap();
        json_of(out)
    };
    // The sim runs the f32 family (auto means f32 there): compare at the same precision.
    let cpu = run("cpu", &["--precision", "f32"]);
    let sim = run("sim", &[]);
    assert_eq!(cpu["tokens"], sim["tokens"]);
    assert!(
        sim["backend"].as_str().unwrap().starts_with("sim"),
        "{}",
        sim["backend"]
    );
    let spec = run(
        "sim",
        &["--oracle", "every-third", "--draft-max", "5", "--fixed-k"],
    );
    assert_eq!(spec["plain"]["tokens"], cpu["tokens"]);
    assert_eq!(spec["speculative"]["tokens"], cpu["tokens"]);
    assert!(spec["speculative"]["stats"]["rounds"].as_u64().unwrap() > 1);
}

/// z-lab's trained draft through the simulated NPU: the sim's tap rows feed the
/// drafter, and the tokens and every round's acceptance equal the CPU backend's.
#[test]
fn sim_backend_runs_the_dflash_reference_pair_like_the_cpu() {
    let (_dir, target, draft) = reference_pair();
    let run = |backend: &str| {
        let out = onebit()
            .args([
                "run",
                "--prompt-tokens",
                "1,17,300,42,7,255,3,99,128,64",
                "--max-tokens",
                "48",
            ])
            .args([
                "--ignore-eos",
                "--json",
                "--draft-max",
                "7",
                "--precision",
                "f32",
                "--fixed-k",
                "--backend",
                backend,
                "--model",
            ])
            .arg(&target)
            .arg("--draft")
            .arg(&draft)
            .output()
            .unwrap();
        json_of(out)
    };
    let (cpu, sim) = (run("cpu"), run("sim"));
    assert_eq!(sim["tokens"], cpu["tokens"]);
    assert_eq!(
        sim["speculative"]["accepted_per_round"],
        cpu["speculative"]["accepted_per_round"]
    );
    assert!(sim["speculative"]["accepted"].as_u64().unwrap() > 0);
}

#[test]
fn npu_backend_without_xrt_is_refused_by_name() {
    if cfg!(feature = "xrt") {
        test_support::skip!(
            "npu_backend_without_xrt_is_refused_by_name",
            "built with `xrt`"
        );
        return;
    }
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,2",
            "--backend",
            "npu",
            "--kernels",
            "k.json",
            "--model",
        ])
        .arg(fixture("tiny-llama"))
        .assert()
        .code(2);
    assert_eq!(
        String::from_utf8_lossy(&out.get_output().stderr),
        "onebit: error: --backend npu: this onebit was built without XRT support (cargo feature `xrt`)\n"
    );
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,2",
            "--kernels",
            "k.json",
            "--model",
        ])
        .arg(fixture("tiny-llama"))
        .assert()
        .code(2);
    assert!(String::from_utf8_lossy(&out.get_output().stderr)
        .contains("--kernels only applies to --backend npu"));
}

/// The q8 family is a CPU family: asking the sim for it is refused by name.
#[test]
fn sim_backend_refuses_q8_by_name() {
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,2",
            "--max-tokens",
            "1",
            "--backend",
            "sim",
        ])
        .args(["--precision", "q8", "--model"])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--precision q8: the sim backend runs the f32 family only"),
        "{err}"
    );
}

/// The NPU plan keeps an f32 KV cache: asking the sim for bf16 KV is refused by name;
/// `auto` on the sim is f32.
#[test]
fn sim_backend_refuses_bf16_kv_by_name() {
    let out = onebit()
        .args(["run", "--prompt-tokens", "1,2", "--max-tokens", "1"])
        .args(["--backend", "sim", "--kv-type", "bf16", "--model"])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv-type bf16: the sim backend keeps an f32 KV cache"),
        "{err}"
    );
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,2",
            "--max-tokens",
            "1",
            "--json",
        ])
        .args(["--backend", "sim", "--model"])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["kv_type"], "f32");
}
