//! The kernel manifest's refusals, the NPU presence probe on fake device trees, and
//! the hardware smoke test (skipped by name without an NPU).

use std::path::Path;

use npu_runtime::npu::manifest::{KernelArg, KernelCode, KernelManifest};
use npu_runtime::npu::plan::OP_KINDS;
use npu_runtime::npu::presence::probe;
use npu_runtime::npu::{DispatchPlan, PlanOptions};
use serde_json::{json, Value};

fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("onebit.xclbin"), b"xclbin bytes").unwrap();
    std::fs::write(dir.path().join("mm.bin"), [1u8, 0, 0, 6, 2, 0, 0, 0]).unwrap();
    std::fs::write(dir.path().join("norm.txt"), "06030100\n0x00000105\n\n").unwrap();
    std::fs::write(dir.path().join("odd.bin"), [1u8, 2, 3]).unwrap();
    std::fs::write(dir.path().join("attn.elf"), b"\x7fELF").unwrap();
    dir
}

fn good() -> Value {
    json!({
        "onebit_kernel_manifest": 1,
        "xclbin": "onebit.xclbin",
        "kernels": {
            "matmul_q4": {"kernel": "MLIR_AIE", "instructions": "mm.bin",
                "args": ["opcode", "instructions", "instruction_words", "buffer:x", "buffer:weight", "buffer:out", "scalar:rows", "scalar:n", "scalar:k"]},
            "rms_norm": {"kernel": "MLIR_AIE", "instructions": "norm.txt", "timeout_ms": 100,
                "args": ["opcode:3", "instructions", "instruction_words", "buffer:x", "buffer:gain", "buffer:out", "scalar:rows", "scalar:width"]},
            "attention": {"kernel": "attn", "elf": "attn.elf",
                "args": ["buffer:q", "buffer:keys", "buffer:values", "buffer:out", "scalar:position"]}
        }
    })
}

fn load(dir: &Path, manifest: &Value) -> Result<KernelManifest, String> {
    let path = dir.join("kernels.json");
    std::fs::write(&path, serde_json::to_string_pretty(manifest).unwrap()).unwrap();
    KernelManifest::open(&path).map_err(|e| e.to_string())
}

#[test]
fn a_good_manifest_loads_with_its_argument_layouts() {
    let dir = folder();
    let m = load(dir.path(), &good()).unwrap();
    assert_eq!(m.kernels.len(), 3);
    let mm = &m.kernels["matmul_q4"];
    assert_eq!(mm.kernel, "MLIR_AIE");
    assert_eq!(mm.code, KernelCode::Instructions(dir.path().join("mm.bin")));
    assert_eq!(mm.timeout_ms, 5000);
    assert_eq!(mm.args[0], KernelArg::Opcode(3));
    assert_eq!(mm.args[4], KernelArg::Buffer("weight".into()));
    assert_eq!(mm.args[8], KernelArg::Scalar("k".into()));
    assert_eq!(m.kernels["rms_norm"].timeout_ms, 100);
    assert_eq!(
        m.kernels["attention"].code,
        KernelCode::Elf(dir.path().join("attn.elf"))
    );
    let words =
        npu_runtime::npu::manifest::load_instructions(&dir.path().join("norm.txt")).unwrap();
    assert_eq!(words, vec![0x0603_0100, 0x105]);
    let words = npu_runtime::npu::manifest::load_instructions(&dir.path().join("mm.bin")).unwrap();
    assert_eq!(words, vec![0x0600_0001, 2]);

    // A plan names the ops this manifest lacks.
    let package = npu_runtime::TargetPackage::open(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/tiny-llama"),
    )
    .unwrap();
    let plan =
        DispatchPlan::build(&package.config, &PlanOptions::for_model(&package.config)).unwrap();
    assert_eq!(
        m.missing_for(&plan),
        vec!["embed", "norm_rope", "kv_append", "add", "swiglu"]
    );
}

#[test]
fn bad_manifests_are_refused_by_name() {
    let dir = folder();
    let p = dir.path().join("kernels.json").display().to_string();
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, String)> = vec![
        (Box::new(|m| m["onebit_kernel_manifest"] = json!(2)), "config key 'onebit_kernel_manifest' is 2; this onebit reads version 1".into()),
        (Box::new(|m| { m.as_object_mut().unwrap().remove("onebit_kernel_manifest"); }), "config key 'onebit_kernel_manifest' is missing (expected 1)".into()),
        (Box::new(|m| m["xclbin"] = json!("../outside.xclbin")), "config key 'xclbin' '../outside.xclbin' must be a relative path inside the manifest's folder".into()),
        (Box::new(|m| m["xclbin"] = json!("/etc/passwd")), "config key 'xclbin' '/etc/passwd' must be a relative path inside the manifest's folder".into()),
        (Box::new(|m| m["xclbin"] = json!("missing.xclbin")), format!("config key 'xclbin' names {}, which is not a file", Path::new(&p).parent().unwrap().join("missing.xclbin").display())),
        (Box::new(|m| m["kernels"]["softmax"] = json!({"kernel": "k", "args": []})), format!("config key 'kernels.softmax' is not an op of the plan (ops: {})", OP_KINDS.join(", "))),
        (Box::new(|m| { m["kernels"]["matmul_q4"].as_object_mut().unwrap().remove("kernel"); }), "config key 'kernels.matmul_q4.kernel' is missing (the kernel's name, e.g. MLIR_AIE)".into()),
        (Box::new(|m| m["kernels"]["matmul_q4"]["elf"] = json!("attn.elf")), "config key 'kernels.matmul_q4.elf' and instructions are both given; a kernel takes one".into()),
        (Box::new(|m| m["kernels"]["matmul_q4"]["instructions"] = json!("odd.bin")), format!("config key 'kernels.matmul_q4.instructions' {} holds 3 bytes, not a whole number of 32-bit words", dir.path().join("odd.bin").display())),
        (Box::new(|m| m["kernels"]["matmul_q4"]["args"][3] = json!("buffer:gain")), "config key 'kernels.matmul_q4.args[3]' 'gain' is not a buffer of matmul_q4 (it binds weight, x, out)".into()),
        (Box::new(|m| m["kernels"]["matmul_q4"]["args"][8] = json!("scalar:heads")), "config key 'kernels.matmul_q4.args[8]' 'heads' is not a scalar of matmul_q4 (it offers rows, position, n, k)".into()),
        (Box::new(|m| m["kernels"]["matmul_q4"]["args"][0] = json!("opcode:three")), "config key 'kernels.matmul_q4.args[0]' 'opcode:three': the opcode must be a number".into()),
        (Box::new(|m| m["kernels"]["matmul_q4"]["args"][0] = json!("bo:x")), "config key 'kernels.matmul_q4.args[0]' 'bo:x' is not opcode, instructions, instruction_words, buffer:NAME or scalar:NAME".into()),
        (Box::new(|m| m["kernels"]["attention"]["args"][0] = json!("instructions")), "config key 'kernels.attention.args[0]' 'instructions' needs an instructions file for attention".into()),
        (Box::new(|m| m["kernels"]["rms_norm"]["timeout_ms"] = json!(0)), "config key 'kernels.rms_norm.timeout_ms' must be 1..=600000 milliseconds, not 0".into()),
        (Box::new(|m| { m.as_object_mut().unwrap().remove("xclbin"); }), "config key 'kernels.matmul_q4.xclbin' is missing and the manifest has no top-level xclbin".into()),
        (Box::new(|m| m["kernels"] = json!([])), "config key 'kernels' is missing or not an object".into()),
    ];
    for (edit, expected) in cases {
        let mut m = good();
        edit(&mut m);
        let err = load(dir.path(), &m).unwrap_err();
        assert_eq!(err, format!("target: {p}: {expected}"));
    }
    std::fs::write(dir.path().join("kernels.json"), "{ not json").unwrap();
    let err = KernelManifest::open(dir.path().join("kernels.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "target: {p}: config key '(file)' is not valid JSON"
        )),
        "{err}"
    );
}

fn fake_tree(nodes: &[(&str, Option<&str>)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("dev/accel")).unwrap();
    for (name, driver) in nodes {
        std::fs::write(root.path().join("dev/accel").join(name), b"").unwrap();
        let device = root
            .path()
            .join("sys/class/accel")
            .join(name)
            .join("device");
        std::fs::create_dir_all(&device).unwrap();
        if let Some(driver) = driver {
            let target = root.path().join("sys/bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&target).unwrap();
            std::os::unix::fs::symlink(&target, device.join("driver")).unwrap();
        }
    }
    root
}

#[test]
fn presence_probe_explains_why_the_npu_is_or_is_not_usable() {
    let none = fake_tree(&[]);
    let p = probe(&none.path().join("dev"), &none.path().join("sys"), true);
    assert!(!p.usable);
    assert!(
        p.reason.starts_with(&format!(
            "no {}/accel device",
            none.path().join("dev").display()
        )),
        "{}",
        p.reason
    );

    let other = fake_tree(&[("accel0", Some("habanalabs")), ("accel1", None)]);
    let p = probe(&other.path().join("dev"), &other.path().join("sys"), true);
    assert!(!p.usable);
    assert_eq!(p.nodes.len(), 2);
    assert_eq!(p.nodes[0].driver.as_deref(), Some("habanalabs"));
    assert!(
        p.reason.contains("none is bound to amdxdna"),
        "{}",
        p.reason
    );
    assert!(p.reason.contains("accel1 → no driver"), "{}", p.reason);

    let npu = fake_tree(&[("accel0", Some("amdxdna"))]);
    let without = probe(&npu.path().join("dev"), &npu.path().join("sys"), false);
    assert!(!without.usable);
    assert_eq!(
        without.reason,
        "an amdxdna NPU is present, but this onebit was built without XRT support (cargo feature `xrt`)"
    );
    let with = probe(&npu.path().join("dev"), &npu.path().join("sys"), true);
    assert!(with.usable, "{}", with.reason);
}

/// On a Ryzen AI machine with a build that has `xrt`: open the device, run the
/// op-by-op comparison through the kernels of `$ONEBIT_NPU_MANIFEST`, time a buffer
/// round trip. Everywhere else it says, by name, why it did not run.
#[test]
// Without `xrt` the hardware part is compiled out and the early return is the last statement.
#[allow(clippy::needless_return)]
fn hardware_smoke() {
    let presence = npu_runtime::npu::presence::probe_this_machine();
    if !presence.usable {
        test_support::skip!("hardware_smoke", "{}", presence.reason);
        return;
    }
    #[cfg(feature = "xrt")]
    {
        use npu_runtime::npu::Device;
        let Some(manifest) = std::env::var_os("ONEBIT_NPU_MANIFEST") else {
            test_support::skip!("hardware_smoke", "an NPU is present but ONEBIT_NPU_MANIFEST names no kernel manifest (see docs/npu.md)");
            return;
        };
        let mut device = npu_runtime::npu::open_npu(Path::new(&manifest), 0).unwrap();
        let checks = npu_runtime::npu::compare::compare_ops(&mut device).unwrap();
        println!(
            "{}",
            npu_runtime::npu::compare::format_table(&device.describe(), &checks)
        );
        for c in &checks {
            assert!(c.passed(), "{}: NMSE {} over {}", c.op, c.nmse, c.limit);
        }
        // A 4 MiB buffer object round trip: host → device → host, timed.
        use npu_runtime::npu::plan::{BufferRole, BufferSpec, Elem};
        let size = 4 << 20;
        let spec = BufferSpec {
            name: "round-trip".into(),
            bytes: size,
            role: BufferRole::Activations,
            elem: Elem::Bytes,
            source: None,
        };
        device.allocate(&[spec], &[]).unwrap();
        let data: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        let start = std::time::Instant::now();
        device.write(0, 0, &data).unwrap();
        let mut back = vec![0u8; size];
        device.read(0, 0, &mut back).unwrap();
        let seconds = start.elapsed().as_secs_f64();
        assert!(back == data, "the buffer round trip changed the bytes");
        println!(
            "hardware_smoke: 4 MiB round trip in {:.2} ms ({:.2} GB/s)",
            seconds * 1e3,
            2.0 * size as f64 / seconds / 1e9
        );
    }
}

proptest::proptest! {
    /// The manifest and instruction-stream parsers take any bytes without panicking
    /// (`cargo xtask fuzz manifest|instructions` runs the same entry points for longer).
    #[test]
    fn parsers_never_panic(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
        edits in proptest::collection::vec((0usize..2000, proptest::num::u8::ANY), 0..8),
    ) {
        let dir = folder();
        npu_runtime::fuzzing::exercise_instructions(&bytes);
        npu_runtime::fuzzing::exercise_manifest(dir.path(), &bytes);
        // Small edits of a good manifest reach deeper than random bytes.
        let mut text = serde_json::to_vec(&good()).unwrap();
        for (at, b) in edits {
            let n = text.len();
            text[at % n] = b;
        }
        npu_runtime::fuzzing::exercise_manifest(dir.path(), &text);
    }
}
