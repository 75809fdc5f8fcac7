//! `onebit doctor`: what this machine offers and why the NPU is or is not usable.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use npu_runtime::kernels::Isa;
use npu_runtime::npu::compare::{compare_ops, format_table};
use npu_runtime::npu::presence::probe_this_machine;
use npu_runtime::npu::{DispatchPlan, KernelManifest, PlanOptions, SimDevice};
use npu_runtime::TargetPackage;
use serde_json::json;

#[derive(Args)]
pub struct DoctorArgs {
    /// Also build the NPU dispatch plan of this target package and summarise it.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Also check this NPU kernel manifest (and, with --model, that it covers the plan).
    #[arg(long)]
    pub kernels: Option<PathBuf>,
    /// Run the op-by-op comparison of the simulated device (and of the NPU when usable
    /// with --kernels) against the CPU reference, and print the table.
    #[arg(long)]
    pub compare_ops: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// An installed XRT found where `xrt-sys`'s build script looks, and its version.
pub(crate) fn installed_xrt() -> Option<(String, String)> {
    use xrt_sys_version as v;
    let mut roots: Vec<(PathBuf, String)> = Vec::new();
    if let Some(root) = std::env::var_os("XILINX_XRT") {
        roots.push((PathBuf::from(root), "XILINX_XRT".into()));
    }
    roots.push((PathBuf::from("/opt/xilinx/xrt"), "/opt/xilinx/xrt".into()));
    roots.push((PathBuf::from("/usr"), "/usr (distribution package)".into()));
    for (root, how) in roots {
        let header = root.join("include/version.h");
        let version = std::fs::read_to_string(&header)
            .ok()
            .and_then(|t| v::parse_version_header(&t))
            .or_else(|| {
                std::fs::read_to_string(root.join("version.json"))
                    .ok()
                    .and_then(|t| v::parse_version_json(&t))
            });
        if let Some(version) = version {
            let ok = v::supports_register_xclbin(version);
            return Some((
                format!(
                    "{}.{}.{} at {} ({how})",
                    version.0,
                    version.1,
                    version.2,
                    root.display()
                ),
                if ok {
                    "new enough for the NPU (>= 2.17)".into()
                } else {
                    "too old for the NPU: register_xclbin/hw_context need 2.17".into()
                },
            ));
        }
    }
    None
}

use xrt_sys::version as xrt_sys_version;

fn plan_for(model: &Path) -> Result<(TargetPackage, DispatchPlan)> {
    let package = TargetPackage::open(model)?;
    let plan = DispatchPlan::build(&package.config, &PlanOptions::for_model(&package.config))?;
    Ok((package, plan))
}

/// Each kernel family and the variant it runs on this CPU.
fn families() -> [(&'static str, &'static str); 3] {
    let isa = Isa::detect();
    [
        ("q4xf32", npu_runtime::kernels::matmul::variant_name(isa)),
        ("q8", npu_runtime::kernels::q8::variant_name(isa)),
        ("bf16", npu_runtime::kernels::dense::variant_name(isa)),
    ]
}

fn families_json() -> serde_json::Value {
    families()
        .iter()
        .map(|(family, variant)| (family.to_string(), serde_json::Value::from(*variant)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

pub fn run(args: &DoctorArgs) -> Result<()> {
    let presence = probe_this_machine();
    let kernels: Vec<String> = Isa::available().iter().map(|k| k.name()).collect();
    let xrt = installed_xrt();
    let plan = args.model.as_deref().map(plan_for).transpose()?;
    let manifest = args
        .kernels
        .as_deref()
        .map(KernelManifest::open)
        .transpose()?;
    let missing = match (&manifest, &plan) {
        (Some(m), Some((_, p))) => Some(m.missing_for(p)),
        _ => None,
    };
    let comparisons = if args.compare_ops {
        let mut sim = SimDevice::new(Isa::detect());
        Some(("sim".to_string(), compare_ops(&mut sim)?))
    } else {
        None
    };

    if args.json {
        let value = json!({
            "onebit": env!("CARGO_PKG_VERSION"),
            "cpu": {
                "kernels": kernels,
                "chosen": Isa::detect().name(),
                "families": families_json(),
                "threads": rayon::current_num_threads(),
            },
            "xrt": {
                "built_with_xrt": xrt_sys::ENABLED,
                "installed": xrt.as_ref().map(|(v, verdict)| json!({"version": v, "verdict": verdict})),
            },
            "npu": {
                "usable": presence.usable,
                "reason": presence.reason,
                "nodes": presence.nodes.iter().map(|n| json!({
                    "node": n.node.display().to_string(),
                    "driver": n.driver,
                    "accessible": n.accessible,
                })).collect::<Vec<_>>(),
            },
            "plan": plan.as_ref().map(|(_, p)| json!({
                "steps": p.steps.len(),
                "ops": p.op_counts().into_iter().map(|(k, n)| json!({"op": k, "count": n})).collect::<Vec<_>>(),
                "summary": p.summary(),
            })),
            "manifest": manifest.as_ref().map(|m| json!({
                "path": m.path.display().to_string(),
                "kernels": m.kernels.keys().collect::<Vec<_>>(),
                "missing_for_plan": missing,
            })),
            "compare_ops": comparisons.as_ref().map(|(device, checks)| json!({
                "device": device,
                "all_passed": checks.iter().all(|c| c.passed()),
                "ops": checks.iter().map(|c| json!({
                    "op": c.op, "shape": c.shape, "max_abs_error": c.max_abs_error,
                    "nmse": c.nmse, "limit": c.limit, "bit_exact": c.bit_exact, "passed": c.passed(),
                })).collect::<Vec<_>>(),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }

    println!("onebit {}", env!("CARGO_PKG_VERSION"));
    println!(
        "cpu: kernels {} (using {}), {} threads",
        kernels.join(", "),
        Isa::detect().name(),
        rayon::current_num_threads()
    );
    println!(
        "cpu: variants in use: {}",
        families()
            .iter()
            .map(|(family, variant)| format!("{family} {variant}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "xrt: this onebit was built {} XRT support{}",
        if xrt_sys::ENABLED { "with" } else { "without" },
        if xrt_sys::ENABLED {
            ""
        } else {
            " (cargo feature `xrt`)"
        }
    );
    match &xrt {
        Some((version, verdict)) => println!("xrt: installed {version}: {verdict}"),
        None => println!(
            "xrt: no installation found (pkg-config aside: $XILINX_XRT, /opt/xilinx/xrt, /usr)"
        ),
    }
    if presence.nodes.is_empty() {
        println!("npu: no accelerator nodes");
    }
    for n in &presence.nodes {
        println!(
            "npu: {} driver {} {}",
            n.node.display(),
            n.driver.as_deref().unwrap_or("(none)"),
            if n.accessible {
                "(read-write ok)"
            } else {
                "(not accessible)"
            }
        );
    }
    println!(
        "npu: {}: {}",
        if presence.usable {
            "usable"
        } else {
            "not usable"
        },
        presence.reason
    );
    if let Some((package, p)) = &plan {
        println!("plan: {}: {}", package.dir.display(), p.summary());
    }
    if let Some(m) = &manifest {
        println!(
            "kernels: {} maps {}",
            m.path.display(),
            m.kernels.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        match &missing {
            Some(missing) if missing.is_empty() => {
                println!("kernels: every op of the plan has a kernel")
            }
            Some(missing) => println!(
                "kernels: the plan needs kernels for: {}",
                missing.join(", ")
            ),
            None => {}
        }
    }
    if let Some((device, checks)) = &comparisons {
        println!();
        print!("{}", format_table(device, checks));
    }
    Ok(())
}
