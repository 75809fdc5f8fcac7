//! The context an engine checks requests against (`--ctx-len` on `run`, `bench` and
//! `serve`), chosen once at [`crate::Engine::load`] from [`ContextLen`].
//!
//! An explicit context ([`ContextLen::Exactly`]) is taken as given (refused when 0 or
//! above the model's `max_position_embeddings`); a launcher's ([`ContextLen::AtMost`],
//! `serve --ctx-len`, as `flm serve` takes any value) is capped at the model's limit.
//! Without one ([`ContextLen::Auto`]) the context is the model's
//! `max_position_embeddings`, **capped so that a KV cache holding the whole context
//! takes at most half of the memory available** (`MemAvailable` in `/proc/meminfo`).
//! A capped context is the largest multiple of 64 positions (the KV key block) that
//! fits, so the cap counts every allocated byte; when fewer than 64 fit, what fits
//! (at least 1). When the available memory cannot be read there is no cap. The KV
//! cache itself still grows with use: the cap only bounds what a request may ask for.
//!
//! [`default_context`] is the rule, pure; [`resolve`] reads the memory and returns the
//! reason of a cap, which the engine keeps for its front end to print
//! ([`crate::Engine::context_note`]).

use crate::{EngineError, Result};
use npu_runtime::kernels::kv::BLOCK;
use npu_runtime::{KvType, TargetConfig};

/// How an engine's context is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextLen {
    /// No context: requests are not checked (a caller that bounds its own).
    #[default]
    Unchecked,
    /// Exactly this many positions: refused when 0 or above the model's
    /// `max_position_embeddings` (`run`'s and `bench`'s `--ctx-len`).
    Exactly(usize),
    /// This many positions, capped at the model's limit; refused when 0 (a launcher's
    /// `serve --ctx-len`: Lemonade passes its own number whatever the model).
    AtMost(usize),
    /// The model's limit capped by the memory available ([`default_context`]).
    Auto,
}

impl ContextLen {
    /// A command's `--ctx-len`: the value exactly when given, else [`ContextLen::Auto`].
    pub fn from_flag(flag: Option<usize>) -> ContextLen {
        flag.map_or(ContextLen::Auto, ContextLen::Exactly)
    }
}

/// The share of the available memory a full-context KV cache may take: one half.
pub const KV_SHARE_DIVISOR: u128 = 2;

/// The default context, and why it is below the model's own limit when it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultContext {
    /// Positions.
    pub positions: usize,
    /// Set when available memory capped the model's `max_position_embeddings`.
    pub reason: Option<String>,
}

/// Bytes of KV cache one position takes in the whole model: every layer's keys and
/// values at `kv_type`, scales included (as the CPU backend's `KvCache` stores them,
/// `layers × kv_heads × KvType::bytes_per_position(head_dim)`). Saturates at
/// `u128::MAX` instead of overflowing (a config may be absurd; more than any memory is
/// the right answer then).
pub fn kv_bytes_per_position(config: &TargetConfig, kv_type: KvType) -> u128 {
    (config.num_layers as u128)
        .saturating_mul(config.num_kv_heads as u128)
        .saturating_mul(kv_type.bytes_per_position(config.head_dim) as u128)
}

/// `bytes` for people: GiB from 1 GiB up, else MiB from 1 MiB up, else KiB (one decimal).
fn size(bytes: f64) -> String {
    let (gib, mib, kib) = ((1u64 << 30) as f64, (1u64 << 20) as f64, 1024.0);
    match bytes {
        b if b >= gib => format!("{:.1} GiB", b / gib),
        b if b >= mib => format!("{:.1} MiB", b / mib),
        b => format!("{:.1} KiB", b / kib),
    }
}

/// The default context of a model whose `max_position_embeddings` is `model_max`, whose
/// KV cache takes `kv_bytes_per_position` bytes a position (all layers, K and V, at
/// `kv_type`), with `available` bytes of memory available (`None`: unknown, no cap).
///
/// The rule: `model_max` when `model_max × kv_bytes_per_position` is at most half of
/// `available`; otherwise the largest multiple of 64 positions whose cache fits in that
/// half (fewer when not even 64 fit, at least 1), with the reason. All arithmetic is
/// checked: a product past `u128` counts as more than any memory.
pub fn default_context(
    model_max: usize,
    kv_bytes_per_position: u128,
    available: Option<u64>,
    kv_type: KvType,
) -> DefaultContext {
    let uncapped = DefaultContext {
        positions: model_max,
        reason: None,
    };
    let Some(available) = available else {
        return uncapped;
    };
    let budget = available as u128 / KV_SHARE_DIVISOR;
    let needed = (model_max as u128).checked_mul(kv_bytes_per_position);
    if matches!(needed, Some(n) if n <= budget) {
        return uncapped;
    }
    // Here kv_bytes_per_position > 0 (else `needed` would be 0) and the fit is below
    // model_max (else `needed` would fit), so it converts back to usize.
    let fit = budget / kv_bytes_per_position;
    let fit = usize::try_from(fit).unwrap_or(model_max).min(model_max);
    let positions = match fit {
        0 => 1,
        f if f < BLOCK => f,
        f => f / BLOCK * BLOCK,
    };
    DefaultContext {
        positions,
        reason: Some(format!(
            "--ctx-len defaults to {positions} positions: {model_max} would need {} of KV cache ({}), more than half of the {} available; pass --ctx-len to choose",
            size(model_max as f64 * kv_bytes_per_position as f64),
            kv_type.name(),
            size(available as f64),
        )),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes (`None` if absent, not a number
/// of kB, or past `u64`).
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut fields = line.split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    match (fields.next(), fields.next()) {
        (Some("kB"), None) => kib.checked_mul(1024),
        _ => None,
    }
}

/// The file the available memory is read from: `/proc/meminfo`, or the file
/// `ONEBIT_MEMINFO` names (tests give the CLI a machine of a chosen size with it).
fn meminfo_path() -> std::path::PathBuf {
    std::env::var_os("ONEBIT_MEMINFO")
        .map(Into::into)
        .unwrap_or_else(|| "/proc/meminfo".into())
}

/// The memory available now, in bytes, if this system says.
pub fn available_memory() -> Option<u64> {
    mem_available(&std::fs::read_to_string(meminfo_path()).ok()?)
}

/// The context of a model of `config` whose KV cache stores `kv_type`, asked for as
/// `asked`: the positions (`None` for [`ContextLen::Unchecked`]) and the reason when
/// available memory capped the default.
pub fn resolve(
    asked: ContextLen,
    config: &TargetConfig,
    kv_type: KvType,
) -> Result<(Option<usize>, Option<String>)> {
    check(asked, config)?;
    let max = config.max_positions;
    Ok(match asked {
        ContextLen::Unchecked => (None, None),
        ContextLen::Exactly(n) => (Some(n), None),
        ContextLen::AtMost(n) => (Some(n.min(max)), None),
        ContextLen::Auto => {
            let chosen = default_context(
                max,
                kv_bytes_per_position(config, kv_type),
                available_memory(),
                kv_type,
            );
            (Some(chosen.positions), chosen.reason)
        }
    })
}

/// Refuses an explicit context of 0, or one above the model's limit where it must fit
/// ([`ContextLen::Exactly`]): checked before anything loads.
pub fn check(asked: ContextLen, config: &TargetConfig) -> Result<()> {
    let max = config.max_positions;
    match asked {
        ContextLen::Exactly(0) | ContextLen::AtMost(0) => Err(EngineError::Invalid(
            "--ctx-len must be at least 1".to_string(),
        )),
        ContextLen::Exactly(n) if n > max => Err(EngineError::Invalid(format!(
            "--ctx-len {n} exceeds the model's max_position_embeddings {max}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// SmolLM2's geometry: 30 layers, 3 kv heads of 64.
    fn smollm2(max_positions: usize) -> TargetConfig {
        let json = serde_json::json!({
            "model_type": "llama",
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "vocab_size": 49152,
            "max_position_embeddings": max_positions,
        });
        TargetConfig::from_json(std::path::Path::new("config.json"), &json).unwrap()
    }

    #[test]
    fn bytes_per_position_count_every_layer_head_and_type() {
        let c = smollm2(8192);
        // 30 layers × 3 kv heads × (K + V) × 64 values.
        assert_eq!(kv_bytes_per_position(&c, KvType::F32), 30 * 3 * 2 * 64 * 4);
        assert_eq!(kv_bytes_per_position(&c, KvType::Bf16), 30 * 3 * 2 * 64 * 2);
        // q8: an int8 per value and an f32 scale per (position, head) for K and V.
        assert_eq!(kv_bytes_per_position(&c, KvType::Q8), 30 * 3 * 2 * (64 + 4));
        let mut absurd = c.clone();
        absurd.num_layers = usize::MAX;
        absurd.num_kv_heads = usize::MAX;
        absurd.head_dim = usize::MAX;
        for kv_type in KvType::ALL {
            assert_eq!(kv_bytes_per_position(&absurd, kv_type), u128::MAX);
        }
    }

    #[test]
    fn the_model_limit_stands_when_half_the_memory_holds_it() {
        let bpp = 23_040; // SmolLM2 at bf16
        let want = DefaultContext {
            positions: 8192,
            reason: None,
        };
        // Exactly half: 8192 × 23040 × 2 bytes.
        let exactly = 8192 * 23_040 * 2;
        assert_eq!(
            default_context(8192, bpp, Some(exactly), KvType::Bf16),
            want
        );
        assert_eq!(
            default_context(8192, bpp, Some(64 * GIB), KvType::Bf16),
            want
        );
        // Unknown memory: no cap, whatever the model asks.
        assert_eq!(
            default_context(usize::MAX, u128::MAX, None, KvType::F32),
            DefaultContext {
                positions: usize::MAX,
                reason: None
            }
        );
        // A cache of no bytes always fits.
        assert_eq!(
            default_context(8192, 0, Some(0), KvType::F32).positions,
            8192
        );
    }

    #[test]
    fn a_cap_is_the_largest_block_multiple_in_half_the_memory_and_says_so() {
        // 32768 positions of 1.5 MiB: 48 GiB; 20 GiB available, 10 GiB for the cache:
        // 6826.67 positions fit, 6784 = 106 blocks of 64.
        let bpp = 3 << 19;
        let got = default_context(32768, bpp, Some(20 * GIB), KvType::Bf16);
        assert_eq!(got.positions, 6784);
        assert_eq!(
            got.reason.as_deref(),
            Some("--ctx-len defaults to 6784 positions: 32768 would need 48.0 GiB of KV cache (bf16), more than half of the 20.0 GiB available; pass --ctx-len to choose")
        );
        assert!(6784 * bpp <= 10 * GIB as u128 && (6784 + 64) * bpp > 10 * GIB as u128);
        // One byte short of half: capped, to the block below.
        let short = default_context(8192, 23_040, Some(8192 * 23_040 * 2 - 2), KvType::F32);
        assert_eq!(short.positions, 8128);
        assert!(short.reason.unwrap().contains("(f32)"));
        // Fewer than a block fit: what fits; none fit: one position.
        assert_eq!(
            default_context(4096, 1000, Some(2 * 50_500), KvType::Q8).positions,
            50
        );
        assert_eq!(
            default_context(4096, 1000, Some(1000), KvType::Q8).positions,
            1
        );
        assert_eq!(
            default_context(4096, 1000, Some(0), KvType::Q8).positions,
            1
        );
        // Sizes below a GiB in MiB, below a MiB in KiB.
        let small = default_context(2048, 4096, Some(6 << 20), KvType::Q8);
        assert_eq!(
            small.reason.as_deref(),
            Some("--ctx-len defaults to 768 positions: 2048 would need 8.0 MiB of KV cache (q8), more than half of the 6.0 MiB available; pass --ctx-len to choose")
        );
        let tiny = default_context(256, 512, Some(100 << 10), KvType::Bf16);
        assert_eq!(tiny.positions, 64);
        assert!(tiny
            .reason
            .unwrap()
            .contains(": 256 would need 128.0 KiB of KV cache (bf16), more than half of the 100.0 KiB available;"));
    }

    /// The README's example: Llama 3.1 8B's geometry (32 layers, 8 kv heads of 128,
    /// 131072 positions) at bf16 with 20.1 GiB available.
    #[test]
    fn the_readme_example() {
        let json = serde_json::json!({
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
        });
        let c = TargetConfig::from_json(std::path::Path::new("config.json"), &json).unwrap();
        let bpp = kv_bytes_per_position(&c, KvType::Bf16);
        assert_eq!(bpp, 128 << 10);
        let available = mem_available("MemAvailable:   21076377 kB\n");
        let got = default_context(c.max_positions, bpp, available, KvType::Bf16);
        assert_eq!(got.positions, 82304);
        assert_eq!(
            got.reason.as_deref(),
            Some("--ctx-len defaults to 82304 positions: 131072 would need 16.0 GiB of KV cache (bf16), more than half of the 20.1 GiB available; pass --ctx-len to choose")
        );
    }

    #[test]
    fn absurd_sizes_cap_without_overflow() {
        // The product overflows u128: more than any memory.
        let got = default_context(usize::MAX, u128::MAX, Some(u64::MAX), KvType::F32);
        assert_eq!(got.positions, 1);
        assert!(got
            .reason
            .unwrap()
            .starts_with("--ctx-len defaults to 1 positions: "));
        let got = default_context(usize::MAX, 1, Some(u64::MAX), KvType::F32);
        assert_eq!(got.positions, (u64::MAX / 2) as usize / 64 * 64);
        let c = smollm2(1 << 24);
        let got = default_context(
            usize::MAX,
            kv_bytes_per_position(&c, KvType::F32),
            Some(16 * GIB),
            KvType::F32,
        );
        // 8 GiB / 46080 bytes = 186413.5 → 186368 (2912 blocks).
        assert_eq!(got.positions, 186_368);
    }

    #[test]
    fn mem_available_reads_kib_lines_only() {
        let meminfo = "MemTotal:       32614444 kB\nMemFree:         1084212 kB\nMemAvailable:   24092884 kB\nBuffers:          591412 kB\n";
        assert_eq!(mem_available(meminfo), Some(24_092_884 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(mem_available("MemAvailable: 5 MB\n"), None);
        assert_eq!(mem_available("MemAvailable: 5\n"), None);
        assert_eq!(mem_available("MemAvailable: 5 kB extra\n"), None);
        assert_eq!(
            mem_available(&format!("MemAvailable: {} kB\n", u64::MAX / 1024 + 1)),
            None
        );
        assert_eq!(mem_available(""), None);
    }

    #[test]
    fn explicit_values_are_checked_not_capped() {
        let c = smollm2(8192);
        let resolve = |asked| resolve(asked, &c, KvType::F32).map_err(|e| e.to_string());
        assert_eq!(resolve(ContextLen::Exactly(8192)), Ok((Some(8192), None)));
        assert_eq!(resolve(ContextLen::Exactly(1)), Ok((Some(1), None)));
        assert_eq!(resolve(ContextLen::Unchecked), Ok((None, None)));
        let zero = Err("--ctx-len must be at least 1".to_string());
        assert_eq!(resolve(ContextLen::Exactly(0)), zero);
        assert_eq!(resolve(ContextLen::AtMost(0)), zero);
        assert_eq!(
            resolve(ContextLen::Exactly(8193)),
            Err("--ctx-len 8193 exceeds the model's max_position_embeddings 8192".to_string())
        );
        // A launcher's number is capped at the model's limit, not refused.
        assert_eq!(resolve(ContextLen::AtMost(8193)), Ok((Some(8192), None)));
        assert_eq!(resolve(ContextLen::AtMost(100)), Ok((Some(100), None)));
        assert_eq!(ContextLen::from_flag(None), ContextLen::Auto);
        assert_eq!(ContextLen::from_flag(Some(7)), ContextLen::Exactly(7));
    }
}
