//! `onebit validate`: whether onebit can run on this machine, and with what — the check
//! a launcher (Lemonade) runs before it starts the engine. Exit 0 when the CPU backend
//! can run a model here (always on x86-64 with the memory for one); the NPU is reported,
//! not required.

use anyhow::{bail, Result};
use clap::Args;
use npu_runtime::kernels::Isa;
use npu_runtime::npu::presence::probe_this_machine;
use serde_json::json;

/// The least memory the smallest model needs to load and run (SmolLM2-135M's package
/// is 163 MB, its int8 head and KV caches about as much again).
const MIN_AVAILABLE_BYTES: u64 = 512 << 20;

#[derive(Args)]
pub struct ValidateArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A `/proc/meminfo` field in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The CPU's model name (`/proc/cpuinfo`).
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Whether onebit can run with `available` bytes of memory (unknown counts as enough:
/// `/proc/meminfo` is Linux's), and the sentence that says so.
fn verdict(available: Option<u64>, kernel: &str) -> (bool, String) {
    let enough = available.is_none_or(|a| a >= MIN_AVAILABLE_BYTES);
    let sentence = match enough {
        true => format!("onebit can run here: the CPU backend with the {kernel} kernels"),
        false => format!(
            "onebit cannot run here: {} MB of memory available, the smallest model needs {} MB",
            available.unwrap_or(0) >> 20,
            MIN_AVAILABLE_BYTES >> 20
        ),
    };
    (enough, sentence)
}

pub fn run(args: &ValidateArgs) -> Result<()> {
    let isa = Isa::detect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (total, available) = (meminfo("MemTotal:"), meminfo("MemAvailable:"));
    let npu = probe_this_machine();
    let xrt = crate::doctor::installed_xrt();
    let (enough, verdict) = verdict(available, &isa.name());
    if args.json {
        println!(
            "{}",
            json!({
                "ok": enough,
                "verdict": verdict,
                "cpu": cpu_name(),
                "cores": cores,
                "kernel": isa.name(),
                "amx": isa.amx(),
                "memory_total_bytes": total,
                "memory_available_bytes": available,
                "npu": {"usable": npu.usable, "reason": npu.reason, "devices": npu.nodes.len()},
                "xrt": xrt.as_ref().map(|(found, note)| json!({"found": found, "note": note})),
            })
        );
    } else {
        println!("cpu:    {} ({cores} cores)", cpu_name());
        println!(
            "kernel: {} (AMX tiles: {})",
            isa.name(),
            match isa.amx() {
                true => "yes",
                false => "not applicable: the CPU lacks them or the OS does not grant them",
            }
        );
        println!(
            "memory: {} MB total, {} MB available",
            total.unwrap_or(0) >> 20,
            available.unwrap_or(0) >> 20
        );
        println!("npu:    {}", npu.reason);
        match &xrt {
            Some((found, note)) => println!("xrt:    {found}: {note}"),
            None => println!("xrt:    not installed"),
        }
        println!("{verdict}");
    }
    if !enough {
        bail!("validate: {verdict}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Too little memory is refused with the amount and the need; enough, or a machine
    /// that does not say, is not.
    #[test]
    fn low_memory_is_refused_by_amount() {
        let (ok, sentence) = verdict(Some(100 << 20), "avx2");
        assert!(!ok);
        assert_eq!(
            sentence,
            format!(
                "onebit cannot run here: 100 MB of memory available, the smallest model needs {} MB",
                MIN_AVAILABLE_BYTES >> 20
            )
        );
        assert_eq!(
            verdict(Some(MIN_AVAILABLE_BYTES), "avx2"),
            (
                true,
                "onebit can run here: the CPU backend with the avx2 kernels".to_string()
            )
        );
        assert!(verdict(None, "scalar").0);
    }
}
