//! `cargo xtask mutants`: named source mutants that the important tests must catch.
//!
//! Each mutant is one textual edit of one file. They are applied, one at a time, to the
//! working tree itself, the tests named for it are run there with `--workspace` (so the
//! tree's own test build is theirs: see [`workspace_selection`]), and the edit is undone.
//! The original text of every edited file is journaled first under
//! `target/mutants/applied.json`, so an edit never outlives its run: it is undone when its
//! tests end, when the run fails or is interrupted (Ctrl-C, SIGTERM), and at the start of
//! the next run if the process died. Most of a run is rebuilding, so the mutants of one
//! crate whose edit sits in a whole expression or statement run share one build
//! ([`crate::schemata`]: each behind a switch read at run time, the build checked to pass
//! with every switch off first); the rest, and all with `--one-build-each`, are built one
//! at a time. A mutant is *caught* when those tests fail (or a
//! test binary crashes). A mutant that does not compile, or whose anchor vanished, tests
//! nothing: it is *unviable*. A mutant of a code path this CPU cannot run (its
//! `requires` features are missing) is *not applicable* and is not run. The run ends with
//! a table and the line `mutants: N caught, N missed, N unviable, N not applicable`, and
//! fails if any mutant is missed or unviable.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One named mutant.
pub struct Mutant {
    pub name: &'static str,
    pub file: &'static str,
    pub find: &'static str,
    pub replace: &'static str,
    /// `cargo test` arguments selecting the tests that must catch it.
    pub tests: &'static [&'static str],
    /// A second edit `(file, find, replace)` for mutants that need two.
    pub also: Option<(&'static str, &'static str, &'static str)>,
    /// CPU features the mutated code path needs (names as `is_x86_feature_detected!`
    /// spells them). On a CPU without one the tests cannot reach the mutant: it is
    /// reported "not applicable", never missed.
    pub requires: &'static [&'static str],
}

/// The catalogue. Keep each `find` unique in its file.
pub const MUTANTS: &[Mutant] = &[
    // onebit perplexity: the KL divergence's direction (the compared precision is the reference).
    Mutant {
        name: "perplexity-kl-in-the-other-direction",
        file: "crates/onebit/src/perplexity.rs",
        find: ".map(|(&r, &m)| r.exp() * (r - m))",
        replace: ".map(|(&r, &m)| m.exp() * (m - r))",
        tests: &["-p", "onebit", "--test", "perplexity", "match_a_float64"],
        also: None,
        requires: &[],
    },
    // The q8 family (onebit-kernels) and its use in the CPU target.
    Mutant {
        name: "q8-avx512vnni-min-term-in-another-order",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "_mm512_fmadd_ps(m, sx, _mm512_mul_ps(scale, isum))",
        replace: "_mm512_add_ps(_mm512_mul_ps(m, sx), _mm512_mul_ps(scale, isum))",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl", "avx512vnni"],
    },
    Mutant {
        name: "q8-avx2-min-term-in-another-order",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "_mm256_fmadd_ps(m, sx, _mm256_mul_ps(scale, isum))",
        replace: "_mm256_add_ps(_mm256_mul_ps(m, sx), _mm256_mul_ps(scale, isum))",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx2", "fma"],
    },
    // The AMX variant (q8/amx.rs): its logic runs on the tile emulator on every machine,
    // its asm on AMX CPUs.
    // The engine's detokenizer: text that reads otherwise in context must not stall it.
    Mutant {
        name: "detokenizer-waits-for-the-window-to-agree",
        file: "crates/onebit-engine/src/text.rs",
        find: "            // The emitted text reads otherwise in context",
        replace: "            #[allow(unreachable_code)]\n            return Ok(String::new());\n            // The emitted text reads otherwise in context",
        tests: &["-p", "onebit", "--test", "run", "streamed_text_never_stalls"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "amx-tile-loaded-with-the-wrong-stride",
        file: "crates/onebit-kernels/src/q8/amx.rs",
        find: "tiles.load::<TB>(weights.as_ptr(), TILE_ROW_BYTES);",
        replace: "tiles.load::<TB>(weights.as_ptr(), GROUP);",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "amx-row-depends-on-its-batch-neighbours",
        file: "crates/onebit-kernels/src/q8/amx.rs",
        find: "let scale = V::mul(d, V::splat(dx[o][g]));",
        replace: "let scale = V::mul(d, V::splat(dx[0][g]));",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "amx-emulator-tdpbusd-reads-the-signed-operand-as-unsigned",
        file: "crates/onebit-kernels/src/q8/amx.rs",
        find: "Dot::Usd => (false, true),",
        replace: "Dot::Usd => (false, false),",
        tests: &["-p", "onebit-kernels", "--test", "amx"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "amx-bit-without-the-os-permission",
        file: "crates/onebit-kernels/src/isa.rs",
        find: "if cpu.tile && cpu.int8 && cpu.os_state && grant() {",
        replace: "if cpu.tile && cpu.int8 && cpu.os_state {",
        tests: &["-p", "onebit-kernels", "--lib", "isa"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "amx-tiles-skip-the-second-level",
        file: "crates/onebit-kernels/src/q8/amx.rs",
        find: "        for l in 1..L {\n            isum = V::fold",
        replace: "        for l in 1..1 {\n            isum = V::fold",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8-int8-head-keeps-the-unsigned-surplus",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "_mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), surplus)",
        replace: "_mm512_add_epi32(_mm512_add_epi32(even[r], odd[r]), _mm512_setzero_si512())",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl", "avx512vnni"],
    },
    Mutant {
        name: "q8-parallel-quantizer-share-drops-its-last-row",
        file: "crates/onebit-kernels/src/q8/quantize.rs",
        find: "let share = rows.len() * t / tasks..rows.len() * (t + 1) / tasks;",
        replace: "let share = rows.len() * t / tasks..(rows.len() * (t + 1) / tasks).max(1) - 1;",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8-avx512-quantizer-codes-nan-as-the-clamp",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "_mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r), clamped)",
        replace: "clamped",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl"],
    },
    Mutant {
        name: "q8-avx512-quantizer-sums-the-group-in-another-order",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));",
        replace: "let pairs = _mm_add_ps(_mm_movehl_ps(half, half), _mm_shuffle_ps::<0b1011_0001>(half, half));",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl"],
    },
    Mutant {
        name: "q8-quantizer-truncates-instead-of-rounding",
        file: "crates/onebit-kernels/src/q8/quantize.rs",
        find: "*c = code_of(round_even(v * inverse));",
        replace: "*c = code_of(v * inverse);",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8x2-levels-fold-without-the-128-weight",
        file: "crates/onebit-kernels/src/q8/reference.rs",
        find: "isum = isum * 128 + part;",
        replace: "isum += part;",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8x2-avx512-folds-the-residual-at-256",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "folded = $add($shift::<7>(folded), $sums[$l * $o + level]);",
        replace: "folded = $add($shift::<8>(folded), $sums[$l * $o + level]);",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx2"],
    },
    Mutant {
        name: "matmul-avx2-batched-rows-sum-in-another-order",
        file: "crates/onebit-kernels/src/matmul/x86.rs",
        find: "let t = _mm256_fmadd_ps(m, sx, _mm256_mul_ps(d, acc[r][q]));",
        replace: "let t = if R > 1 { _mm256_add_ps(_mm256_mul_ps(m, sx), _mm256_mul_ps(d, acc[r][q])) } else { _mm256_fmadd_ps(m, sx, _mm256_mul_ps(d, acc[r][q])) };",
        tests: &["-p", "onebit-kernels", "--test", "matmul"],
        also: None,
        requires: &["avx2", "fma"],
    },
    // Gemma 3 (tests/gemma3.rs: transformers' greedy tokens and logits on a tiny model).
    Mutant {
        name: "gemma-rmsnorm-without-the-plus-one",
        file: "crates/npu-runtime/src/model.rs",
        find: "*v += 1.0;",
        replace: "*v += 0.0;",
        tests: &["-p", "npu-runtime", "--test", "gemma3", "tiny_gemma3_f32"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "sliding-window-sees-past-its-window",
        file: "crates/npu-runtime/src/cpu.rs",
        find: "cfg.window_of(l),",
        replace: "None,",
        tests: &["-p", "npu-runtime", "--test", "gemma3", "tiny_gemma3_f32"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "gemma-embedding-not-scaled",
        file: "crates/npu-runtime/src/model.rs",
        find: "Some(scale) => out.extend(widened.map(|v| v * scale)),",
        replace: "Some(_) => out.extend(widened),",
        tests: &["-p", "npu-runtime", "--test", "gemma3", "tiny_gemma3_f32"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8-target-reads-v-as-k",
        file: "crates/npu-runtime/src/cpu.rs",
        find: "gather(y, n, s, p.qkv.part(1)),",
        replace: "gather(y, n, s, p.qkv.part(2)),",
        tests: &["-p", "npu-runtime", "--test", "reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "prefill-scores-the-first-row-not-the-last",
        file: "crates/npu-runtime/src/cpu.rs",
        find: "false => p.rows.end - 1..p.rows.end,",
        replace: "false => p.rows.start..p.rows.start + 1,",
        tests: &["-p", "npu-runtime", "--test", "reference"],
        also: None,
        requires: &[],
    },
    // mtp's accept rules (verify.rs): each rule, the residual draw, and the penalty
    // state the target distribution is computed under. The distribution tests compare
    // every arm, on its own seeds, with the analytic law of a toy target.
    Mutant {
        name: "penalty-applied-after-verification",
        file: "crates/mtp/src/verify.rs",
        find: "    let saved = sampler.penalty_state();\n",
        replace: "    let saved = sampler.penalty_state();\n    sampler.restore_penalty_state(Default::default());\n",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "verify-penalty-state-skips-accepted-drafts",
        file: "crates/mtp/src/verify.rs",
        find: "        sampler.accept(d);\n    }\n",
        replace: "    }\n",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "verify-greedy-accepts-the-wrong-token",
        file: "crates/mtp/src/verify.rs",
        find: "sampler.pick(row(a)) == drafts[a]",
        replace: "sampler.pick(row(a + 1)) == drafts[a]",
        tests: &["-p", "mtp", "--test", "sampling", "--test", "lookup"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "verify-accept-ratio-q-over-p",
        file: "crates/mtp/src/verify.rs",
        find: "(pd / qd).min(1.0)",
        replace: "(qd / pd).min(1.0)",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "verify-residual-not-normalized",
        file: "crates/mtp/src/verify.rs",
        find: "residual.iter_mut().for_each(|v| *v /= total);",
        replace: "residual.iter_mut().for_each(|v| *v /= 1.0);",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "verify-residual-draws-from-p",
        file: "crates/mtp/src/verify.rs",
        find: "return (i, sampler.draw(&residual) as u32);",
        replace: "return (i, sampler.draw(&p) as u32);",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },
    // DFlash 2 against z-lab's module (tests/data/dflash2-ref).
    Mutant {
        name: "dflash2-conv-tap-reads-ahead",
        file: "crates/dflash-draft/src/v2.rs",
        find: "let Some(src) = i.checked_sub(t) else {",
        replace: "let Some(src) = Some(i + t).filter(|&s| s < b) else {",
        tests: &["-p", "dflash-draft", "--test", "dflash2_reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash2-softcap-before-the-multiplier",
        file: "crates/dflash-draft/src/config.rs",
        find: "Some(cap) => (scaled / cap).tanh() * cap,",
        replace: "Some(cap) => (logit / cap).tanh() * cap * self.output_multiplier,",
        tests: &["-p", "dflash-draft", "--test", "dflash2_reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash2-selector-ignores-the-predecessor",
        file: "crates/dflash-draft/src/v2.rs",
        find: "let context: Vec<f32> = bf16_row(w.predecessor, prev as usize, rank)",
        replace: "let context: Vec<f32> = bf16_row(w.predecessor, prev as usize, rank).map(|_| 1.0)",
        tests: &["-p", "dflash-draft", "--test", "dflash2_reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash2-candidate-is-its-own-predecessor",
        file: "crates/dflash-draft/src/v2.rs",
        find: ".zip(&context)",
        replace: ".zip(&bf16_row(w.predecessor, cand as usize, rank).zip(&projected[p * rank..(p + 1) * rank]).map(|(a, b)| a * b).collect::<Vec<f32>>())",
        tests: &["-p", "dflash-draft", "--test", "dflash2_reference"],
        also: None,
        requires: &[],
    },
    // The upstream DFlashHead table.
    Mutant {
        name: "dflash-head-no-trim-after-verify",
        file: "crates/mtp/src/dflash.rs",
        find: ".truncate(mark + m);",
        replace: ".rows(); // no trim",
        tests: &["-p", "mtp", "--test", "upstream", "--test", "dflash_ref"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash-head-trims-one-row-short",
        file: "crates/mtp/src/dflash.rs",
        find: ".truncate(mark + m);",
        replace: ".truncate(mark + m - 1);",
        tests: &["-p", "mtp", "--test", "upstream", "--test", "dflash_ref"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash-head-trims-after-a-plain-step-too",
        file: "crates/mtp/src/dflash.rs",
        find: "if let Some(mark) = self.mark.take() {",
        replace: "if let Some(mark) = self.mark {",
        tests: &["-p", "mtp", "--test", "upstream"],
        also: Some(("crates/mtp/src/run.rs", "stats.plain_steps += 1;", "stats.plain_steps += 1;\n            if let Some(h) = head.as_deref_mut() {\n                h.commit_rows(1);\n            }")),
        requires: &[],
    },
    Mutant {
        name: "dflash-head-fuses-one-row-short",
        file: "crates/mtp/src/dflash.rs",
        find: "(rows, sink.rows_slice(folded..rows).to_vec())",
        replace: "(rows, sink.rows_slice(folded..rows.max(folded + 1) - 1).to_vec())",
        tests: &["-p", "mtp", "--test", "upstream", "--test", "dflash_ref"],
        also: Some(("crates/mtp/src/dflash.rs", "let n_new = rows - self.cache.len().min(rows);", "let n_new = (rows - self.cache.len().min(rows)).saturating_sub(1);")),
        requires: &[],
    },
    Mutant {
        name: "loop-drafts-after-the-first-token-not-the-last",
        file: "crates/mtp/src/run.rs",
        find: "let d = h.draft(pos_next + 1, next,",
        replace: "let d = h.draft(pos_next + 1, tokens[0],",
        tests: &["-p", "mtp", "--test", "upstream", "--test", "dflash_ref"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash-head-skips-the-position-check",
        file: "crates/mtp/src/dflash.rs",
        find: "if pos != rows + 1 {",
        replace: "if false {",
        tests: &["-p", "mtp", "--test", "upstream"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "dflash-head-folds-from-the-start-of-the-sink",
        file: "crates/mtp/src/dflash.rs",
        find: "let folded = self.cache.len().min(rows);",
        replace: "let folded = 0;",
        tests: &["-p", "mtp", "--test", "upstream", "--test", "dflash_ref"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-decode-fusion-in-stored-order",
        file: "crates/dflash-draft/src/package.rs",
        find: "out[(b * 32 + r) * w + col] = bf16::from_le_bytes([pair[0], pair[1]]).to_f32();",
        replace: "let _ = (b, r, col); out[i] = bf16::from_le_bytes([pair[0], pair[1]]).to_f32();",
        tests: &["-p", "dflash-draft", "--test", "loader", "--test", "import"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-unexplained-tensor-check-off",
        file: "crates/dflash-draft/src/package.rs",
        find: ".find(|t| !expected.iter().any(|e| e == t.name))",
        replace: ".find(|t| false && !expected.iter().any(|e| e == t.name))",
        tests: &["-p", "dflash-draft", "--test", "loader"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-scalar-comparison-skipped",
        file: "crates/dflash-draft/src/package.rs",
        find: "if t.shape != [want.len()] || found != want {",
        replace: "if false {",
        tests: &["-p", "dflash-draft", "--test", "loader"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "tile-count-check-off-by-one",
        file: "crates/q4nx-format/src/tile.rs",
        find: "if tensor.shape != [tiles, TILE_BYTES] {",
        replace: "if tensor.shape != [tiles, TILE_BYTES] && tensor.shape != [tiles - 1, TILE_BYTES] {",
        tests: &["-p", "dflash-draft", "--test", "loader"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-cache-ropes-new-rows-from-position-0",
        file: "crates/dflash-draft/src/forward.rs",
        find: "let start = self.len;",
        replace: "let start = 0;",
        tests: &["-p", "dflash-draft", "--test", "cached", "--test", "reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-block-attention-causal",
        file: "crates/dflash-draft/src/forward.rs",
        find: "            total - first(i),",
        replace: "            total - first(i) - (q.len() / qd - 1 - i),",
        tests: &["-p", "dflash-draft", "--test", "reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "writer-tensors-unsorted",
        file: "crates/q4nx-format/src/writer.rs",
        find: "order.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));",
        replace: "",
        tests: &["-p", "q4nx-format", "--test", "fixtures"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "header-gap-check-off",
        file: "crates/q4nx-format/src/container.rs",
        find: "if t.data.start > expected {",
        replace: "if t.data.start > expected && false {",
        tests: &["-p", "q4nx-format", "--test", "malformed"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "tile-nibbles-swapped",
        file: "crates/q4nx-format/src/tile.rs",
        find: "(byte, if row % 2 == 1 { 4 } else { 0 })",
        replace: "(byte, if row % 2 == 1 { 0 } else { 4 })",
        tests: &["-p", "q4nx-format", "--test", "tile_codec"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "gguf-overlap-check-off",
        file: "crates/q4nx-convert/src/gguf.rs",
        find: "if pair[1].range.start < pair[0].range.end {",
        replace: "if pair[1].range.start < pair[0].range.end && false {",
        tests: &["-p", "q4nx-convert", "--test", "gguf_reader"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "convert-llama-rows-not-unpermuted",
        file: "crates/q4nx-convert/src/lib.rs",
        find: "if !rope_rows {",
        replace: "if true {",
        tests: &["-p", "q4nx-convert", "--test", "convert"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "quantizer-divides-instead-of-multiplying-by-the-inverse",
        file: "crates/q4nx-convert/src/ggml.rs",
        find: "let t = ((v - lo) * id + 0.5).trunc();",
        replace: "let t = ((v - lo) / d + 0.5).trunc();",
        tests: &["-p", "q4nx-convert", "--test", "ggml_reference"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "matmul-batched-rows-sum-in-another-order",
        file: "crates/onebit-kernels/src/matmul/x86.rs",
        find: "let t = _mm512_fmadd_ps(m, sx, _mm512_mul_ps(d, acc[r][rg]));",
        replace: "let t = if R > 1 { _mm512_add_ps(_mm512_mul_ps(m, sx), _mm512_mul_ps(d, acc[r][rg])) } else { _mm512_fmadd_ps(m, sx, _mm512_mul_ps(d, acc[r][rg])) };",
        tests: &["-p", "onebit-kernels", "--test", "matmul", "-p", "npu-runtime", "--test", "reference"],
        also: None,
        requires: &["avx512f"],
    },
    Mutant {
        name: "team-posters-share-the-job-slot",
        file: "crates/onebit-kernels/src/team.rs",
        find: "let _turn = self.posting.lock().unwrap_or_else(|e| e.into_inner());",
        replace: "let _turn = ();",
        tests: &["-p", "npu-runtime", "--test", "reference", "concurrent"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "team-column-blocks-overlap-by-a-column",
        file: "crates/onebit-kernels/src/team.rs",
        find: "let start = b * width;",
        replace: "let start = (b * width).saturating_sub(1);",
        tests: &["-p", "onebit-kernels", "--lib", "team"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "q8-avx512-later-sweeps-overwrite-the-first-rows",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "let row = out.row_mut(o0 + o);\n            for (h, v) in yo.iter().enumerate() {",
        replace: "let row = out.row_mut(o);\n            for (h, v) in yo.iter().enumerate() {",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl", "avx512vnni"],
    },
    Mutant {
        name: "q8-avx512-second-half-takes-the-first-halfs-high-nibbles",
        file: "crates/onebit-kernels/src/q8/x86.rs",
        find: "$acc[r][1] = dpbusd_broadcast!($acc[r][1], h1, $rows[r], $hi_off);",
        replace: "$acc[r][1] = dpbusd_broadcast!($acc[r][1], h0, $rows[r], $hi_off);",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl", "avx512vnni"],
    },
    Mutant {
        name: "team-guided-claim-skips-a-task",
        file: "crates/onebit-kernels/src/team.rs",
        find: "for i in first..first + run {",
        replace: "for i in first + 1..first + run {",
        tests: &["-p", "onebit-kernels", "--lib", "team"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "sse-keep-alive-never-sent",
        file: "crates/onebit-serve/src/generate.rs",
        find: "out.extend_from_slice(b\": keep-alive\\n\\n\");",
        replace: "let _ = &mut out;",
        tests: &["-p", "onebit-serve", "--test", "serve", "silent_sse_streams"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "chat-template-file-ignored",
        file: "crates/onebit-engine/src/lib.rs",
        find: "            .or(self.package.config.chat_template.as_deref())",
        replace: "            .and(self.package.config.chat_template.as_deref())",
        tests: &["-p", "onebit-engine", "--test", "chat_tokens"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "rms-norm-interleaved-rows-sum-in-reverse",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: "for c in 0..width {",
        replace: "for c in (0..width).rev() {",
        tests: &["-p", "onebit-kernels", "--test", "elementwise"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "swiglu-chunks-read-up-at-the-wrong-offset",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: "serial(g, &up[i * CHUNK..])",
        replace: "serial(g, &up[i * (CHUNK - 1)..])",
        tests: &["-p", "onebit-kernels", "--test", "elementwise"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "exp-reduction-drops-the-low-part-of-ln2",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: "let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, ac));",
        replace: "let r = n.mul_add(-LN2_HI, ac);",
        tests: &["-p", "onebit-kernels", "--test", "elementwise"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "sigmoid-of-a-negative-forgets-its-exp",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: "let numerator = if t >= 0.0 { x } else { x * e };",
        replace: "let numerator = x;",
        tests: &["-p", "onebit-kernels", "--test", "elementwise"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "truncate-keeps-one-row-too-many",
        file: "crates/onebit-kernels/src/kv.rs",
        find: "store.values.resize(len * hd);",
        replace: "store.values.resize((len + 1).min(self.len) * hd);",
        tests: &["-p", "npu-runtime", "--test", "reference"],
        also: None,
        requires: &[],
    },
    // The attention family: the fixed exp-sum lane order, and the combine's rescale.
    Mutant {
        name: "attention-avx512-exp-sum-in-another-order",
        file: "crates/onebit-kernels/src/attention/x86.rs",
        find: "let sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), e[2]), e[3]);",
        replace: "let sum = _mm512_add_ps(_mm512_add_ps(e[0], _mm512_add_ps(e[1], e[2])), e[3]);",
        tests: &["-p", "onebit-kernels", "--test", "attention"],
        also: None,
        requires: &["avx512f", "avx512bw", "avx512vl"],
    },
    Mutant {
        name: "attention-combine-skips-the-running-rescale",
        file: "crates/onebit-kernels/src/attention/mod.rs",
        find: "*s = *s * a + p * c;",
        replace: "*s = *s + p * c;",
        tests: &["-p", "onebit-kernels", "--test", "attention"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "last-layer-tap-not-final-normed",
        file: "crates/npu-runtime/src/cpu.rs",
        find: "true => &final_hidden,",
        replace: "true => &x,",
        tests: &["-p", "npu-runtime", "--test", "reference"],
        also: None,
        requires: &[],
    },
    // The NPU backend (simulated device, plan, packing) and the attention dot product.
    Mutant {
        name: "npu-truncate-keeps-the-position",
        file: "crates/npu-runtime/src/npu/target.rs",
        find: "        self.position = len;\n        Ok(())",
        replace: "        let _ = len;\n        Ok(())",
        tests: &["-p", "npu-runtime", "--test", "npu_sim"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "npu-kv-append-one-position-late",
        file: "crates/npu-runtime/src/npu/device.rs",
        find: "let to = (kh * g.capacity + pass.position + i) * hd;",
        replace: "let to = (kh * g.capacity + (pass.position + i + 1).min(g.capacity - 1)) * hd;",
        tests: &["-p", "npu-runtime", "--test", "npu_sim"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "npu-pack-drops-the-first-tile-byte",
        file: "crates/npu-runtime/src/npu/pack.rs",
        find: "padded(matrix.bytes().to_vec(), spec)",
        replace: "padded([&matrix.bytes()[1..], &[0u8][..]].concat(), spec)",
        tests: &["-p", "npu-runtime", "--test", "npu_sim"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "npu-taps-copied-into-slot-zero",
        file: "crates/npu-runtime/src/npu/device.rs",
        find: "taps[i * w + slot * h..i * w + (slot + 1) * h]",
        replace: "taps[i * w..i * w + h]",
        tests: &["-p", "npu-runtime", "--test", "npu_sim"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "attention-dot-drops-the-tail",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: "        acc[j] = x.mul_add(y, acc[j]);",
        replace: "        let _ = (j, x, y);",
        tests: &["-p", "onebit-kernels", "--test", "matmul"],
        also: None,
        requires: &[],
    },

    Mutant {
        name: "dflash-head-reset-keeps-the-cache",
        file: "crates/mtp/src/dflash.rs",
        find: "        self.cache = DraftKvCache::for_weights(self.weights);\n        self.mark = None;",
        replace: "        self.mark = None;",
        tests: &["-p", "mtp", "--test", "upstream"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "sampler-temperature-ignored",
        file: "crates/mtp/src/sample.rs",
        find: "p[i] = ((l[i] - max) / t).exp();",
        replace: "p[i] = (l[i] - max).exp();",
        tests: &["-p", "mtp", "--test", "sampling"],
        also: None,
        requires: &[],
    },

    Mutant {
        name: "npu-taps-rebuild-drops-committed-kv",
        file: "crates/npu-runtime/src/npu/target.rs",
        find: "let (span, committed) = (g.capacity * row_bytes, self.position * row_bytes);",
        replace: "let (span, committed) = (g.capacity * row_bytes, 0);",
        tests: &["-p", "npu-runtime", "--test", "npu_sim"],
        also: None,
        requires: &[],
    },

    // Prompt lookup and the adaptive draft length.
    Mutant {
        name: "lookup-proposes-from-the-wrong-offset",
        file: "crates/mtp/src/lookup.rs",
        find: "(0..k).map(|j| self.copied(follow, j, len))",
        replace: "(0..k).map(|j| self.copied(follow - 1, j, len))",
        tests: &["-p", "mtp", "--lib", "--test", "lookup"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-block-attention-is-causal",
        file: "crates/dflash-draft/src/forward.rs",
        find: "&|_| total,",
        replace: "&|i| total - b + i + 1,",
        tests: &["-p", "dflash-draft", "--test", "cached"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-loop-cache-ignores-the-precision",
        file: "crates/dflash-draft/src/forward.rs",
        find: "DraftPrecision::Q8 => KvType::Bf16,",
        replace: "DraftPrecision::Q8 => KvType::F32,",
        tests: &["-p", "dflash-draft", "--test", "cached"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "proposal-argmax-takes-the-last-of-tied-maxima",
        file: "crates/onebit-kernels/src/elementwise.rs",
        find: ".and_then(|(k, c)| c.iter().position(|&x| x == max)",
        replace: ".and_then(|(k, c)| c.iter().rposition(|&x| x == max)",
        tests: &["-p", "onebit-kernels", "--test", "elementwise"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "lookup-ignores-the-copy-cursor",
        file: "crates/mtp/src/lookup.rs",
        find: "if let Some(cursor) = self.cursor {",
        replace: "if let Some(cursor) = None::<usize> {",
        tests: &["-p", "mtp", "--lib", "lookup"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "lookup-cursor-stays-on-the-edited-token",
        file: "crates/mtp/src/lookup.rs",
        find: "let skip = usize::from(copied < committed.len());",
        replace: "let skip = 0;",
        tests: &["-p", "mtp", "--lib", "lookup"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "adaptive-k-ignores-acceptance",
        file: "crates/mtp/src/adaptive.rs",
        find: "let p = acceptance.get(j).copied().unwrap_or(0.0);",
        replace: "let p = acceptance.get(j).map_or(1.0_f64, |_| 1.0);",
        tests: &["-p", "mtp", "--test", "adaptive", "--test", "lookup"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "adaptive-probes-ignore-their-budget",
        file: "crates/mtp/src/adaptive.rs",
        find: "true => self.probe_floor(costs, draft_cost),",
        replace: "true => 0,",
        tests: &["-p", "mtp", "--test", "adaptive"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "draft-q8-swaps-keys-and-values",
        file: "crates/dflash-draft/src/forward.rs",
        find: "vec![&l.k, &l.v],",
        replace: "vec![&l.v, &l.k],",
        tests: &["-p", "dflash-draft", "--test", "cached"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "cost-model-ignores-row-count",
        file: "crates/mtp/src/adaptive.rs",
        find: "let pass = cost(k + 1);",
        replace: "let pass = cost(1);",
        tests: &["-p", "mtp", "--test", "adaptive"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "shared-weight-buffer-ranges-all-start-at-zero",
        file: "crates/onebit-kernels/src/q8/pack.rs",
        find: "let at = ranges.last().map_or(0, |r: &Range<usize>| r.end);",
        replace: "let at = ranges.last().map_or(0, |_: &Range<usize>| 0);",
        tests: &["-p", "onebit-kernels", "--test", "q8"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "calibration-times-the-cold-passes",
        file: "crates/mtp/src/adaptive.rs",
        find: "while warm_up.len() < WARM_UP_MAX_PASSES && !warmed_up(&warm_up) {",
        replace: "while warm_up.len() < WARM_UP_MAX_PASSES && warm_up.is_empty() {",
        tests: &["-p", "mtp", "--test", "adaptive"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "warm-up-settles-before-the-plateau",
        file: "crates/mtp/src/adaptive.rs",
        find: "recent.iter().all(|&t| t >= best * (1.0 - WARM_UP_GAIN))",
        replace: "recent.iter().all(|&t| t >= best * (1.0 - WARM_UP_GAIN) || t > 0.0)",
        tests: &["-p", "mtp", "--test", "adaptive"],
        also: None,
        requires: &[],
    },
    // The draft's context in the shared KV layout: each block row's own window start.
    Mutant {
        name: "draft-rows-read-keys-from-the-first-rows-window",
        file: "crates/dflash-draft/src/forward.rs",
        find: "let skip = (first(i) - from) * hd;",
        replace: "let skip = 0;",
        tests: &["-p", "dflash-draft", "--test", "cached"],
        also: None,
        requires: &[],
    },
    // Chat templates: the model's BOS reaches the template, once in the prompt, and a
    // template's refusal is the client's error. The BOS mutants also fail the tokenizer
    // oracle (llama.cpp's ids for the real Gemma 3 prompts) when the models are fetched.
    Mutant {
        name: "template-bos-token-empty",
        file: "crates/onebit-engine/src/text.rs",
        find: "bos_token => tokens.bos_token,",
        replace: "bos_token => \"\",",
        tests: &["-p", "onebit-engine", "--test", "chat_templates"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "chat-prompt-bos-doubled",
        file: "crates/onebit-engine/src/text.rs",
        find: "if self.prefix.is_empty() || ids.starts_with(&self.prefix) {",
        replace: "if self.prefix.is_empty() {",
        tests: &["-p", "onebit-engine", "--test", "chat_tokens", "--test", "tokenizer_oracle"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "chat-prompt-bos-dropped",
        file: "crates/onebit-engine/src/text.rs",
        find: "Ok(self.prefix.iter().copied().chain(ids).collect())",
        replace: "Ok(ids)",
        tests: &["-p", "onebit-engine", "--test", "chat_tokens", "--test", "tokenizer_oracle"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "template-error-is-a-500",
        file: "crates/onebit-serve/src/error.rs",
        find: "ApiError::invalid(Some(\"messages\"), e.to_string())",
        replace: "ApiError::internal(e.to_string())",
        tests: &["-p", "onebit-serve", "--test", "serve", "--", "a_template_refusal_is_a_400_with_its_text"],
        also: None,
        requires: &[],
    },
    // The default context: half of the available memory for a full-context KV cache.
    Mutant {
        name: "default-context-takes-all-available-memory",
        file: "crates/onebit-engine/src/context.rs",
        find: "pub const KV_SHARE_DIVISOR: u128 = 2;",
        replace: "pub const KV_SHARE_DIVISOR: u128 = 1;",
        tests: &["-p", "onebit-engine", "--lib", "context::"],
        also: None,
        requires: &[],
    },
    // The engine's one rule for the tokens a request generates by default.
    Mutant {
        name: "default-max-tokens-ignores-the-context",
        file: "crates/onebit-engine/src/lib.rs",
        find: "None => Ok(DEFAULT_MAX_TOKENS.min(ctx - prompt)),",
        replace: "None => Ok(DEFAULT_MAX_TOKENS),",
        tests: &["-p", "onebit-engine", "--test", "engine", "--", "the_context_and_max_tokens_follow_one_rule"],
        also: None,
        requires: &[],
    },
    // A server of the store: a request reaches the model it names, loaded then.
    Mutant {
        name: "store-server-ignores-the-named-model",
        file: "crates/onebit-serve/src/store.rs",
        find: "Some(name) => self.find(name).ok_or_else(|| ApiError::unknown_model(name)),",
        replace: "Some(_) => Ok(&self.models[0]),",
        tests: &["-p", "onebit-serve", "--test", "serve", "a_store_server"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "store-server-hides-a-failed-load",
        file: "crates/onebit-serve/src/store.rs",
        find: "Ok(Err(e)) => format!(\"{e:#}\"),",
        replace: "Ok(Err(_)) => return Ok(()),",
        tests: &["-p", "onebit-serve", "--test", "serve", "a_store_model_that_cannot_load"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "store-server-lists-without-the-key",
        file: "crates/onebit-serve/src/store.rs",
        find: "        .fallback(not_found)\n        .layer(axum::middleware::from_fn_with_state(\n            first.clone(),\n            auth::require_key,\n        ));",
        replace: "        .fallback(not_found);",
        tests: &["-p", "onebit-serve", "--test", "serve", "a_store_server_with_a_key"],
        also: None,
        requires: &[],
    },
    // onebit serve: what clients rely on.
    Mutant {
        name: "seed-defaults-to-a-constant",
        file: "crates/onebit-serve/src/request.rs",
        find: "None | Some(-1) => fresh_seed(),",
        replace: "None | Some(-1) => 0,",
        tests: &["-p", "onebit-serve", "--test", "serve", "unseeded_requests"],
        also: None,
        requires: &[],
    },
    // /api/ps moved out of the locked router into the open one (beside /health).
    Mutant {
        name: "api-key-unchecked-on-a-route",
        file: "crates/onebit-serve/src/lib.rs",
        find: "let open = Router::new().route(\"/health\", get(health));",
        replace: "let open = Router::new().route(\"/health\", get(health)).route(\"/api/ps\", axum::routing::get(ollama::ps));",
        tests: &["-p", "onebit-serve", "--test", "serve", "an_api_key_locks"],
        also: Some(("crates/onebit-serve/src/lib.rs", ".route(\"/api/ps\", get(ollama::ps))", "")),
        requires: &[],
    },
    Mutant {
        name: "request-tokenized-on-the-async-threads",
        file: "crates/onebit-serve/src/generate.rs",
        find: "blocking(&app.clone(), move || prepare_blocking(&app, &bytes, route)).await",
        replace: "prepare_blocking(&app, &bytes, route)",
        tests: &["-p", "onebit-serve", "--test", "serve", "tokenization_leaves"],
        also: None,
        requires: &[],
    },
    // The screened head (onebit-kernels q8/screen.rs; Gemma 3's default head).
    Mutant {
        name: "screen-every-row-takes-the-first-rows-candidates",
        file: "crates/onebit-kernels/src/q8/screen.rs",
        find: "        for &r in own {",
        replace: "        for &r in &candidates[0] {",
        tests: &["-p", "onebit-kernels", "--test", "q8", "screen"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "screen-ties-go-to-the-higher-index",
        file: "crates/onebit-kernels/src/q8/screen.rs",
        find: ".then(self.index.cmp(&other.index))",
        replace: ".then(other.index.cmp(&self.index))",
        tests: &["-p", "onebit-kernels", "--test", "q8", "top_rows"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "screened-head-never-the-default",
        file: "crates/npu-runtime/src/model.rs",
        find: "(true, _) if config.int8_head_outweighs_the_layers() => HeadKind::Screened,",
        replace: "(true, _) if config.int8_head_outweighs_the_layers() && false => HeadKind::Screened,",
        tests: &["-p", "npu-runtime", "--test", "gemma3", "real_gemma3"],
        also: None,
        requires: &[],
    },
    // The engine's prefix reuse: a prompt shares the cached positions it matches, no more.
    Mutant {
        name: "prefix-reuse-keeps-a-stale-position",
        file: "crates/onebit-engine/src/lib.rs",
        find: "a.iter().zip(b).take_while(|(x, y)| x == y).count()",
        // Off by one where the prompts part: the first differing position is kept too.
        replace: "a.iter().zip(b).take_while(|(x, y)| x == y).count() + usize::from(a.iter().zip(b).any(|(x, y)| x != y))",
        tests: &["-p", "onebit-engine", "--test", "engine", "a_prompt_extending_the_history"],
        also: None,
        requires: &[],
    },
    // The engine's cancellation: a flag set mid-generation stops it at the next token.
    Mutant {
        name: "cancellation-ignored-while-decoding",
        file: "crates/onebit-engine/src/lib.rs",
        find: "            if cancel.is_cancelled() {\n                reason = Some(StopReason::Cancelled);",
        replace: "            if false && cancel.is_cancelled() {\n                reason = Some(StopReason::Cancelled);",
        tests: &["-p", "onebit-engine", "--test", "engine", "cancellation_and_the_sink"],
        also: None,
        requires: &[],
    },
    // The server: a client that goes away stops its generation. Two edits: the dropped
    // handler's cancel flag, and the token sink's check of the closed channel (either
    // alone stops a whole answer's generation; a stream's failed send stops it too).
    Mutant {
        name: "disconnect-leaves-the-generation-running",
        file: "crates/onebit-serve/src/generate.rs",
        find: "        if let Some(f) = self.0.take() {\n            f.cancel();",
        replace: "        if let Some(f) = self.0.take() {\n            drop(f);",
        tests: &["-p", "onebit-serve", "--test", "serve", "a_disconnect_cancels"],
        also: Some((
            "crates/onebit-serve/src/generate.rs",
            "                if tx.is_closed() {",
            "                if false && tx.is_closed() {",
        )),
        requires: &[],
    },
    Mutant {
        name: "cancelled-session-left-in-the-batch",
        file: "crates/onebit-engine/src/lib.rs",
        find: "drop(membership);",
        replace: "if cancel.is_cancelled() { std::mem::forget(membership) } else { drop(membership) }",
        tests: &["-p", "onebit-serve", "--test", "serve", "shared_passes"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "shared-pass-hands-every-session-the-first-logits",
        file: "crates/npu-runtime/src/cpu.rs",
        find: "(p.part, logits[at - count..at].to_vec())",
        replace: "(p.part, logits[..count].to_vec())",
        tests: &["-p", "npu-runtime", "--test", "reference", "batched_sessions"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "chained-lookup-round-leaves-rejected-rows",
        file: "crates/mtp/src/chain.rs",
        find: "self.dflash.mark_round();",
        replace: "",
        tests: &["-p", "onebit", "--test", "speculative", "chained"],
        also: None,
        requires: &[],
    },
    // The loop takes a chained round's lookup proposal whole, unverified: the chained
    // text must then differ from plain text.
    Mutant {
        name: "chained-drafters-proposal-not-verified",
        file: "crates/mtp/src/run.rs",
        find: "        base.truncate(pos_next + 1 + accepted)?;",
        replace: "        let accepted = if proposer == \"lookup\" { drafts.len() } else { accepted };\n        base.truncate(pos_next + 1 + accepted)?;",
        tests: &["-p", "onebit", "--test", "speculative", "chained"],
        also: None,
        requires: &[],
    },
    // Every round counted as the first drafter's: the chain's per-drafter counters.
    Mutant {
        name: "drafter-counters-credit-the-wrong-drafter",
        file: "crates/mtp/src/stats.rs",
        find: "let at = match self.by_drafter.iter().position(|d| d.name == drafter) {",
        replace: "let at = match self.by_drafter.iter().position(|_| true) {",
        tests: &["-p", "mtp", "--lib", "stats"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "chained-drafter-ignores-its-estimates",
        file: "crates/mtp/src/chain.rs",
        find: "(Some(l), Some(d)) => l >= d || passed_over + 1 >= PROBE_EVERY,",
        replace: "(Some(_), Some(_)) => true,",
        tests: &["-p", "mtp", "--lib", "chain"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "ollama-num-ctx-ignored",
        file: "crates/onebit-serve/src/generate.rs",
        find: "Some(n) if n <= server => Ok(n),",
        replace: "Some(n) if n <= server => Ok(server),",
        tests: &["-p", "onebit-serve", "--test", "serve", "num_ctx"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "ollama-final-object-without-draft-counters",
        file: "crates/onebit-serve/src/encode.rs",
        find: "if c.drafted {\n        v[\"draft_n\"]",
        replace: "if false {\n        v[\"draft_n\"]",
        tests: &["-p", "onebit-serve", "--test", "serve", "drafting_server"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "speculative-off-drafts-anyway",
        file: "crates/onebit-serve/src/request.rs",
        find: "Some(\"off\") => Ok(DraftMode::Off),",
        replace: "Some(\"off\") => Ok(DraftMode::Auto),",
        tests: &["-p", "onebit-serve", "--test", "serve", "every_drafting_mode"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "speculative-mode-not-checked-against-the-drafter",
        file: "crates/onebit-serve/src/generate.rs",
        find: "if !job.draft.available(&engine.config().drafter) {",
        replace: "if false {",
        tests: &["-p", "onebit-serve", "--test", "serve", "every_drafting_mode"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "latest-tag-not-stripped",
        file: "crates/onebit-serve/src/lib.rs",
        find: "name.strip_suffix(\":latest\").unwrap_or(name)",
        replace: "name",
        tests: &["-p", "onebit-serve", "--test", "serve", "latest"],
        also: None,
        requires: &[],
    },
    // Ollama's keep_alive as an idle timeout: the timer fires but frees nothing.
    Mutant {
        name: "keep-alive-timer-frees-nothing",
        file: "crates/onebit-serve/src/sessions.rs",
        find: "        release_idle(ready);\n        app.log(&format!(",
        replace: "        app.log(&format!(",
        tests: &["-p", "onebit-serve", "--test", "serve", "keep_alive_frees"],
        also: None,
        requires: &[],
    },
    // Freeing a KV cache only truncates it: the memory stays allocated.
    Mutant {
        name: "kv-release-keeps-the-memory",
        file: "crates/onebit-kernels/src/kv.rs",
        find: "self.layers.iter_mut().for_each(KvLayer::release);",
        replace: "self.truncate(0);",
        tests: &["-p", "onebit-kernels", "--lib", "kv::tests"],
        also: None,
        requires: &[],
    },
    // /metrics: the time-to-first-token histogram never observed; buckets not cumulative.
    Mutant {
        name: "ttft-histogram-never-observed",
        file: "crates/onebit-serve/src/generate.rs",
        find: "app.metrics.first_token(seconds);",
        replace: "let _ = seconds;",
        tests: &["-p", "onebit-serve", "--test", "serve", "metrics_count"],
        also: None,
        requires: &[],
    },
    Mutant {
        name: "histogram-buckets-not-cumulative",
        file: "crates/onebit-serve/src/metrics.rs",
        find: "            cumulative += n;",
        replace: "            cumulative = *n;",
        tests: &["-p", "onebit-serve", "--lib", "metrics::"],
        also: None,
        requires: &[],
    },
    // The model store: a download off its pinned sha256 must leave nothing.
    Mutant {
        name: "pull-keeps-a-download-off-its-sha256",
        file: "crates/onebit/src/store.rs",
        find: "if !got.eq_ignore_ascii_case(&file.sha256) {",
        replace: "if false && !got.eq_ignore_ascii_case(&file.sha256) {",
        tests: &["-p", "onebit", "--test", "store", "a_failed_pull_leaves_nothing"],
        also: None,
        requires: &[],
    },
];

/// How a test run ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Passed,
    /// Tests failed: how many checks (test functions) failed.
    Failed(usize),
    /// A test binary died without a result (a crash or an abort): caught.
    Crashed,
    /// The tests ran past their time limit and were killed: caught, as a hang the
    /// mutant caused (the build had finished before the clock started).
    TimedOut,
    /// The mutated workspace does not compile: the mutant tests nothing (it rotted
    /// with a refactor), so it is reported as unviable and fails the run.
    Unviable,
}

/// Classifies a finished `cargo test` from its exit status and output.
fn classify(success: bool, stdout: &str, stderr: &str) -> Outcome {
    if success {
        return Outcome::Passed;
    }
    let failed: usize = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test result: FAILED. "))
        .filter_map(|l| {
            l.split("; ")
                .nth(1)?
                .strip_suffix(" failed")?
                .parse::<usize>()
                .ok()
        })
        .sum();
    if failed > 0 {
        Outcome::Failed(failed)
    } else if stderr.contains("error: could not compile") || !stderr.contains("Running ") {
        // No test binary ran: the build failed.
        Outcome::Unviable
    } else {
        Outcome::Crashed
    }
}

/// A child process's end: exit status and output, or killed at its time limit.
struct Finished {
    success: bool,
    stdout: String,
    stderr: String,
    timed_out: bool,
    secs: f64,
}

/// Runs `cmd` in a process group of its own with its output captured; past `limit` the
/// whole group (cargo and every test binary it started) is killed, so nothing is left
/// running and no hung test stalls the run.
fn run_limited(mut cmd: Command, limit: Duration) -> Result<Finished> {
    use std::io::Read;
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("mutants: cannot start cargo")?;
    // Drained on threads so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > limit {
            timed_out = true;
            kill_group(child.id());
            break child.wait()?;
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            // The child has a process group of its own, so the terminal's Ctrl-C did not
            // reach it: stop it here; the caller's `Applied` then restores the tree.
            kill_group(child.id());
            let _ = child.wait();
            bail!("mutants: interrupted");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok(Finished {
        success: status.success() && !timed_out,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// SIGKILL to the process group `pgid` (the child made it with `process_group(0)`).
fn kill_group(pgid: u32) {
    // `kill(1)` rather than libc: this crate has no unsafe.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
}

/// A build or a test run longer than this is stuck, not slow (a mutant that loops in
/// const evaluation, a baseline that hangs): it is stopped and reported.
const STUCK: Duration = Duration::from_secs(3600);

/// A mutant's `cargo test` arguments as run: every `-p PACKAGE` gives way to
/// `--workspace`, the target flags and test filters stay. With `-p`, cargo unifies the
/// features of third-party crates over the selected packages only, so each distinct
/// selection built its own copy of serde, tokio, syn... (measured: 55–77 s for one
/// selection after the workspace's test build); with `--workspace` every selection uses
/// the units of the tree's own test build (`cargo test --workspace`, which CI has just
/// run), and a mutant rebuilds only its crate, those above it and the selected test
/// binaries. A target name two packages share (`--test reference`) then runs in both:
/// more tests, never fewer. The catalogue keeps its `-p` for the reader and for
/// [`named_targets`]' check that each target exists.
fn workspace_selection<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = vec!["--workspace"];
    let mut it = args.iter();
    while let Some(&arg) = it.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(it.by_ref());
            break;
        }
        if arg == "-p" {
            it.next();
            continue;
        }
        out.push(arg);
    }
    out
}

/// `cargo test` over `args`; `switch` names the mutant of a shared build to switch on
/// ([`crate::schemata::SWITCH`]), which is otherwise unset.
fn cargo(root: &Path, args: &[&str], no_run: bool, switch: Option<&str>) -> Command {
    let mut cmd = crate::cargo_command();
    match switch {
        Some(name) => cmd.env(crate::schemata::SWITCH, name),
        None => cmd.env_remove(crate::schemata::SWITCH),
    };
    cmd.arg("test").arg("--no-fail-fast");
    if no_run {
        cmd.arg("--no-run");
    }
    // proptest saves a failing case beside its test (`tests/*.proptest-regressions`):
    // a mutant's failures must not land in the tree.
    cmd.args(workspace_selection(args))
        .current_dir(root)
        .env("PROPTEST_DISABLE_FAILURE_PERSISTENCE", "1");
    cmd
}

/// The tree's untracked, unignored files (`git ls-files --others --exclude-standard`).
fn untracked(root: &Path) -> Result<std::collections::BTreeSet<String>> {
    Ok(
        crate::git_files(root, &["--others", "--exclude-standard"], "mutants")?
            .into_iter()
            .collect(),
    )
}

/// Builds the tests of `args` (no time limit but [`STUCK`]), then runs them within
/// `limit`: only the run is timed, so a slow rebuild is never taken for a hang.
/// `build_first: false` is for a tree built already (a shared build's mutants): one
/// cargo call fewer. The third value is a failed build's error output (else empty), so
/// the caller can say why without building again.
fn cargo_test(
    root: &Path,
    args: &[&str],
    limit: Duration,
    switch: Option<&str>,
    build_first: bool,
) -> Result<(Outcome, f64, String)> {
    if build_first {
        // `cargo test --no-run` takes the same arguments (it ignores test-name filters).
        let build = run_limited(cargo(root, args, true, switch), STUCK)?;
        if build.timed_out || !build.success {
            return Ok((Outcome::Unviable, build.secs, build.stderr));
        }
    }
    let run = run_limited(cargo(root, args, false, switch), limit)?;
    if run.timed_out {
        return Ok((Outcome::TimedOut, run.secs, String::new()));
    }
    Ok((
        classify(run.success, &run.stdout, &run.stderr),
        run.secs,
        String::new(),
    ))
}

/// The time limit of a mutant's tests: `factor` times their baseline run, at least
/// `min`.
fn limit_for(baseline_secs: f64, factor: f64, min: Duration) -> Duration {
    Duration::from_secs_f64(baseline_secs * factor).max(min)
}

/// The workspace's crates that mutants edit, every crate before those it depends on
/// (ARCHITECTURE.md's layers, top down).
const DEPENDENTS_FIRST: &[&str] = &[
    "onebit",
    "onebit-serve",
    "onebit-engine",
    "mtp",
    "npu-runtime",
    "dflash-draft",
    "onebit-kernels",
    "q4nx-convert",
    "q4nx-format",
];

/// Where a crate's mutants run in the order (a crate not listed runs last).
fn build_rank(krate: &str) -> usize {
    DEPENDENTS_FIRST
        .iter()
        .position(|&c| c == krate)
        .unwrap_or(DEPENDENTS_FIRST.len())
}

/// The crate a mutant's file is in (`crates/npu-runtime/src/cpu.rs` → `npu-runtime`).
fn crate_of(file: &str) -> &str {
    file.strip_prefix("crates/")
        .and_then(|f| f.split('/').next())
        .unwrap_or(file)
}

/// Whether this CPU has a feature, by the name `is_x86_feature_detected!` takes.
/// Unknown names are an error (a typo must not turn a mutant into "not applicable").
fn cpu_has(feature: &str) -> Result<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        Ok(match feature {
            "sse4.1" => std::arch::is_x86_feature_detected!("sse4.1"),
            "avx" => std::arch::is_x86_feature_detected!("avx"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            "avx512vbmi" => std::arch::is_x86_feature_detected!("avx512vbmi"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
            // The kernels' own detection (CPUID, XCR0 and Linux's permission) is what
            // gates their tiles; /proc/cpuinfo lists what the CPU and kernel support.
            "amx" => std::fs::read_to_string("/proc/cpuinfo")
                .map(|c| c.contains(" amx_tile") && c.contains(" amx_int8"))
                .unwrap_or(false),
            other => bail!("mutants: unknown CPU feature '{other}' in the catalogue"),
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        Ok(false)
    }
}

/// The features of `requires` this CPU lacks (by `has`).
fn missing_features(
    requires: &[&'static str],
    has: impl Fn(&str) -> Result<bool>,
) -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for &f in requires {
        if !has(f)? {
            missing.push(f);
        }
    }
    Ok(missing)
}

/// A test target a mutant's `cargo test` arguments select.
#[derive(Debug, PartialEq)]
enum TestTarget {
    Lib(String),
    Bin(String, String),
    Test(String, String),
}

impl TestTarget {
    /// The target's source file under the workspace `root`, if it exists.
    fn source(&self, root: &Path) -> Option<PathBuf> {
        let dir = |pkg: &str| {
            if pkg == "xtask" {
                root.join("xtask")
            } else {
                root.join("crates").join(pkg)
            }
        };
        let candidates = match self {
            TestTarget::Lib(p) => vec![dir(p).join("src/lib.rs")],
            TestTarget::Bin(p, b) if b == p => vec![dir(p).join("src/main.rs")],
            TestTarget::Bin(p, b) => vec![dir(p).join(format!("src/bin/{b}.rs"))],
            TestTarget::Test(p, t) => vec![
                dir(p).join(format!("tests/{t}.rs")),
                dir(p).join(format!("tests/{t}/main.rs")),
            ],
        };
        candidates.into_iter().find(|c| c.is_file())
    }
}

/// The test targets of `cargo test` arguments: each `-p PACKAGE` must be followed by
/// at least one of `--lib`, `--bin NAME`, `--test NAME` (a bare `-p` would build and
/// run every target of the package); words that are not flags are test-name filters.
fn named_targets(args: &[&str]) -> Result<Vec<TestTarget>> {
    let mut targets = Vec::new();
    let mut package: Option<(&str, usize)> = None;
    let close = |package: Option<(&str, usize)>, count: usize| -> Result<()> {
        match package {
            Some((p, before)) if count == before => {
                bail!("mutants: -p {p} names no --lib, --bin or --test target")
            }
            _ => Ok(()),
        }
    };
    let mut it = args.iter();
    while let Some(&arg) = it.next() {
        let current = || {
            package
                .map(|(p, _)| p.to_string())
                .with_context(|| format!("mutants: {arg} before any -p PACKAGE"))
        };
        match arg {
            "--" => break,
            "-p" => {
                close(package, targets.len())?;
                let p = it.next().context("mutants: -p needs a package")?;
                package = Some((p, targets.len()));
            }
            "--lib" => targets.push(TestTarget::Lib(current()?)),
            "--bin" | "--test" => {
                let name = it
                    .next()
                    .with_context(|| format!("mutants: {arg} needs a target name"))?
                    .to_string();
                targets.push(if arg == "--bin" {
                    TestTarget::Bin(current()?, name)
                } else {
                    TestTarget::Test(current()?, name)
                });
            }
            flag if flag.starts_with('-') => bail!("mutants: unexpected flag {flag}"),
            _filter => {}
        }
    }
    close(package, targets.len())?;
    Ok(targets)
}

/// The verdicts of a run, counted.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    caught: usize,
    /// Of `caught`, those whose tests ran past their time limit.
    timed_out: usize,
    missed: usize,
    unviable: usize,
    not_applicable: usize,
}

impl Tally {
    /// The summary line every run ends with.
    fn line(&self) -> String {
        format!(
            "mutants: {} caught ({} by timeout), {} missed, {} unviable, {} not applicable",
            self.caught, self.timed_out, self.missed, self.unviable, self.not_applicable
        )
    }

    /// Counts a mutant's outcome (its tests ran within `limit`) and says it in words.
    fn record(&mut self, outcome: Outcome, limit: Duration) -> String {
        match outcome {
            Outcome::Failed(n) => {
                self.caught += 1;
                format!("caught ({n} failing)")
            }
            Outcome::Crashed => {
                self.caught += 1;
                "caught (test binary crashed)".into()
            }
            Outcome::TimedOut => {
                self.caught += 1;
                self.timed_out += 1;
                format!("caught (timeout, {:.0} s)", limit.as_secs_f64())
            }
            Outcome::Unviable => {
                self.unviable += 1;
                "UNVIABLE (does not compile)".into()
            }
            Outcome::Passed => {
                self.missed += 1;
                "MISSED".into()
            }
        }
    }

    /// Missed and unviable mutants fail the run; not-applicable ones do not.
    fn check(&self) -> Result<()> {
        if self.missed > 0 || self.unviable > 0 {
            bail!(
                "mutants: {} missed and {} unviable (a mutant that does not compile or whose anchor vanished tests nothing)",
                self.missed,
                self.unviable
            );
        }
        Ok(())
    }
}

pub fn run(args: &[String]) -> Result<()> {
    // `--filter NAME` narrows every mutant's tests to test functions matching NAME
    // (to show that one test alone catches them, e.g. the upstream test's toy base).
    let mut only: Vec<&str> = Vec::new();
    let mut filter: Option<&str> = None;
    let mut factor = DEFAULT_TIMEOUT_FACTOR;
    let mut min_limit = DEFAULT_TIMEOUT_MIN;
    let mut skip_baseline = false;
    let mut one_build_each = false;
    let mut it = args.iter().map(String::as_str);
    while let Some(arg) = it.next() {
        match arg {
            "--filter" => filter = Some(it.next().context("mutants: --filter needs a test name")?),
            "--timeout-factor" => {
                let v = it
                    .next()
                    .context("mutants: --timeout-factor needs a number")?;
                factor = v
                    .parse()
                    .ok()
                    .filter(|f: &f64| *f >= 1.0)
                    .with_context(|| format!("mutants: --timeout-factor '{v}': a number >= 1"))?;
            }
            "--timeout-min" => {
                let v = it.next().context("mutants: --timeout-min needs seconds")?;
                min_limit = Duration::from_secs(
                    v.parse()
                        .with_context(|| format!("mutants: --timeout-min '{v}': whole seconds"))?,
                );
            }
            // For CI, right after `cargo test --workspace` passed on the same tree: the
            // unmutated run of each selection proves nothing new there (about 70 s).
            "--skip-baseline" => skip_baseline = true,
            // Every mutant on a build of its own (the shared builds' equivalence check).
            "--one-build-each" => one_build_each = true,
            flag if flag.starts_with('-') => bail!("mutants: unknown option '{flag}'"),
            name => only.push(name),
        }
    }
    let tests_of = |m: &Mutant| -> Vec<&str> {
        let mut t: Vec<&str> = m.tests.to_vec();
        if let Some(f) = filter {
            t.extend(["--", f]);
        }
        t
    };
    let root = crate::workspace_root();
    let journal = root.join("target/mutants/applied.json");
    let undone = restore_journaled(&journal)?;
    if undone > 0 {
        println!("mutants: restored {undone} file(s) a previous, interrupted run left mutated");
    }
    // The first signal sets the flag (the tests are stopped, the tree restored); a second
    // one, with the flag already set, exits at once.
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, INTERRUPTED.clone())
            .and_then(|_| signal_hook::flag::register(signal, INTERRUPTED.clone()))
            .context("mutants: cannot install the Ctrl-C / SIGTERM handler")?;
    }
    let untracked_before = untracked(&root)?;
    let mut selected: Vec<&Mutant> = MUTANTS
        .iter()
        .filter(|m| only.is_empty() || only.contains(&m.name))
        .collect();
    if selected.is_empty() {
        bail!("mutants: no mutant named {only:?}");
    }
    if let Some(unknown) = only.iter().find(|n| !MUTANTS.iter().any(|m| m.name == **n)) {
        bail!("mutants: no mutant named '{unknown}'");
    }
    // A mutant builds and runs only the test targets it names: each must exist.
    for m in &selected {
        for t in named_targets(m.tests).with_context(|| format!("mutants: '{}'", m.name))? {
            if t.source(&root).is_none() {
                bail!("mutants: '{}' names {t:?}, which has no source", m.name);
            }
        }
    }
    // Mutants of one crate run together, dependents before their dependencies: restoring
    // a crate makes the next build that needs it rebuild it, so interleaved crates would
    // be rebuilt many times over, and in this order no later selection needs an earlier
    // crate restored on its own (the sort is stable: the catalogue's order within a crate).
    selected.sort_by_key(|m| build_rank(crate_of(m.file)));
    let mut missing = Vec::new();
    for m in &selected {
        missing.push(missing_features(m.requires, cpu_has)?);
    }
    // The baseline: each distinct test selection once (many mutants share one), built
    // and then timed; its time sets the limit of its mutants' runs.
    let mut baseline: Vec<(Vec<&str>, f64)> = Vec::new();
    if skip_baseline {
        println!(
            "mutants: baseline skipped (--skip-baseline: the whole suite passed unmutated on this tree); \
             every mutant's limit is the floor, {} s",
            min_limit.as_secs()
        );
    } else {
        println!("mutants: baseline (the unmutated tests must pass)");
    }
    for (m, lacks) in selected.iter().zip(&missing) {
        let tests = tests_of(m);
        if skip_baseline || !lacks.is_empty() || baseline.iter().any(|(t, _)| *t == tests) {
            continue;
        }
        let start = Instant::now();
        match cargo_test(&root, &tests, STUCK, None, true)? {
            (Outcome::Passed, secs, _) => {
                println!(
                    "  {:>6.1} s  cargo test {} (built and run in {:.1} s)",
                    secs,
                    tests.join(" "),
                    start.elapsed().as_secs_f64()
                );
                baseline.push((tests, secs));
            }
            (outcome, _, _) => bail!(
                "mutants: the tests of '{}' ({}) fail without any mutant: {outcome:?}",
                m.name,
                tests.join(" ")
            ),
        }
    }
    let total = selected.len();
    println!("mutants: {total} mutants, one crate at a time");
    let mut rows: Vec<(String, String, f64)> = Vec::new();
    let mut tally = Tally::default();
    let items: Vec<(&Mutant, Vec<&str>)> = selected.into_iter().zip(missing).collect();
    let limit_of = |tests: &[&str]| {
        let base = baseline
            .iter()
            .find(|(t, _)| *t == tests)
            .map_or(0.0, |(_, secs)| *secs);
        limit_for(base, factor, min_limit)
    };
    let report = |name: &str, verdict: String, secs: f64, rows: &mut Vec<(String, String, f64)>| {
        println!(
            "  [{}/{total}] {:<58} {verdict} ({secs:.1} s)",
            rows.len() + 1,
            name
        );
        rows.push((name.into(), verdict, secs));
    };
    for group in items.chunk_by(|(a, _), (b, _)| crate_of(a.file) == crate_of(b.file)) {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bail!("mutants: interrupted");
        }
        let krate = crate_of(group[0].0.file);
        let mut done = vec![false; group.len()];
        let plan = if one_build_each {
            Vec::new()
        } else {
            plan_shared(&root, group)?
        };
        // A shared build costs a build and one unmutated run of each selection (16–50 s
        // measured here); a mutant built alone 2–12 s: below five it does not pay.
        let shares = plan.len() >= MIN_SHARED;
        let in_plan: Vec<bool> = (0..group.len())
            .map(|k| shares && plan.iter().any(|(j, _)| *j == k))
            .collect();
        // The mutants no shared build holds run first, while the crate's incremental state
        // is the tree's own: after a shared build, the first rebuild is of the whole crate
        // (measured 36 s for the kernels in CI, against 7–12 s). Those a shared build
        // rejects run after it.
        for stage in 0..2 {
            if stage == 1 && shares {
                let shared =
                    run_shared(&root, &journal, krate, group, &plan, &tests_of, &limit_of)?;
                for (k, outcome, limit, secs) in shared.into_iter().flatten() {
                    done[k] = true;
                    let verdict = tally.record(outcome, limit);
                    report(group[k].0.name, verdict, secs, &mut rows);
                }
            }
            for k in 0..group.len() {
                if done[k] || (stage == 0 && in_plan[k]) {
                    continue;
                }
                done[k] = true;
                let (m, lacks) = &group[k];
                if INTERRUPTED.load(Ordering::SeqCst) {
                    bail!("mutants: interrupted");
                }
                let path: PathBuf = root.join(m.file);
                let original = std::fs::read_to_string(&path)?;
                if original.matches(m.find).count() != 1 {
                    tally.unviable += 1;
                    rows.push((
                        m.name.into(),
                        "UNVIABLE (anchor not found exactly once)".into(),
                        0.0,
                    ));
                    continue;
                }
                if !lacks.is_empty() {
                    tally.not_applicable += 1;
                    rows.push((
                        m.name.into(),
                        format!("not applicable (needs {})", lacks.join(", ")),
                        0.0,
                    ));
                    continue;
                }
                let edits = match edits_of(m, &root, &original)? {
                    Some(edits) => edits,
                    None => bail!(
                        "mutants: '{}': second anchor not found exactly once in {}",
                        m.name,
                        m.also.map_or("", |(file, _, _)| file)
                    ),
                };
                let tests = tests_of(m);
                let limit = limit_of(&tests);
                let start = Instant::now();
                let mut applied = Applied::apply(&journal, edits)?;
                let outcome = cargo_test(&root, &tests, limit, None, true);
                if let Ok((Outcome::Unviable, _, errors)) = &outcome {
                    println!("{}", first_errors(errors));
                }
                applied.restore()?;
                let verdict = tally.record(outcome?.0, limit);
                report(m.name, verdict, start.elapsed().as_secs_f64(), &mut rows);
            }
        }
    }
    println!("\n{:<58} {:<32} {:>8}", "mutant", "result", "seconds");
    for (name, verdict, secs) in &rows {
        println!("{name:<58} {verdict:<32} {secs:>8.1}");
    }
    println!("\n{}", tally.line());
    let left: Vec<String> = untracked(&root)?
        .difference(&untracked_before)
        .cloned()
        .collect();
    if !left.is_empty() {
        bail!(
            "mutants: the mutants' tests left new files in the tree (a test writes beside its \
             source on failure): {}",
            left.join(", ")
        );
    }
    tally.check()
}

/// The mutants of one crate's `group` a shared build can hold ([`crate::schemata`]):
/// applicable, one edit, an anchor whose edit sits in a whole node, and no two sites of a
/// file overlapping (the later one keeps a build of its own). Indices into `group`.
fn plan_shared(
    root: &Path,
    group: &[(&Mutant, Vec<&str>)],
) -> Result<Vec<(usize, crate::schemata::Site)>> {
    let mut texts: std::collections::BTreeMap<&str, String> = Default::default();
    let mut plan: Vec<(usize, crate::schemata::Site)> = Vec::new();
    for (k, (m, lacks)) in group.iter().enumerate() {
        if !lacks.is_empty() || m.also.is_some() {
            continue;
        }
        if !texts.contains_key(m.file) {
            let text = std::fs::read_to_string(root.join(m.file))
                .with_context(|| format!("mutants: cannot read {}", m.file))?;
            texts.insert(m.file, text);
        }
        let Some(site) = crate::schemata::site(&texts[m.file], m.find, m.replace) else {
            continue;
        };
        let clash = plan
            .iter()
            .any(|(j, s)| group[*j].0.file == m.file && crate::schemata::overlap(s, &site));
        if !clash {
            plan.push((k, site));
        }
    }
    Ok(plan)
}

/// The first lines of a failed build's errors (why it failed).
fn first_errors(stderr: &str) -> String {
    let errors: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("error"))
        .take(12)
        .collect();
    errors.join("\n")
}

/// The runs of a shared build's check: selections that name the same targets run once,
/// with their test-name filters together (libtest runs every test matching any), or with
/// none if one of them has none. Each run with the indices of the selections it covers.
/// A selection passing libtest flags after `--` runs on its own.
fn merged_checks<'a>(selections: &[Vec<&'a str>]) -> Vec<(Vec<&'a str>, Vec<usize>)> {
    struct Run<'a> {
        targets: Vec<&'a str>,
        /// `None`: the targets' every test.
        filters: Option<Vec<&'a str>>,
        members: Vec<usize>,
        alone: bool,
    }
    let mut runs: Vec<Run<'a>> = Vec::new();
    for (i, sel) in selections.iter().enumerate() {
        let (mut targets, mut filters) = (Vec::new(), Vec::new());
        let mut it = sel.iter();
        while let Some(&arg) = it.next() {
            match arg {
                "--" => filters.extend(it.by_ref()),
                "-p" | "--test" | "--bin" => {
                    targets.push(arg);
                    targets.extend(it.next());
                }
                flag if flag.starts_with('-') => targets.push(flag),
                filter => filters.push(filter),
            }
        }
        let alone = filters.iter().any(|f| f.starts_with('-'));
        let same = runs
            .iter_mut()
            .find(|r| !alone && !r.alone && r.targets == targets);
        match same {
            Some(run) => {
                run.members.push(i);
                match (&mut run.filters, filters.is_empty()) {
                    (f, true) => *f = None,
                    (Some(all), false) => all.extend(filters),
                    (None, false) => {}
                }
            }
            None => runs.push(Run {
                targets: if alone { sel.clone() } else { targets },
                filters: (!alone && !filters.is_empty()).then_some(filters),
                members: vec![i],
                alone,
            }),
        }
    }
    runs.into_iter()
        .map(|run| {
            let mut args = run.targets;
            if let Some(filters) = run.filters {
                args.push("--");
                for f in filters {
                    if !args.contains(&f) {
                        args.push(f);
                    }
                }
            }
            (args, run.members)
        })
        .collect()
}

/// The fewest mutants a shared build is made for.
const MIN_SHARED: usize = 5;

/// A shared mutant's result: its index in the group, outcome, time limit and seconds.
type SharedResult = (usize, Outcome, Duration, f64);

/// Runs the mutants of `plan` on one shared build of `krate`: every site wrapped behind
/// its switch, the build checked (it compiles, and each of their test selections passes
/// with no mutant switched on), then each mutant's tests with its switch on. `None` when
/// the check fails: the tree is restored and those mutants run one build each.
#[allow(clippy::too_many_arguments)]
fn run_shared<'a>(
    root: &Path,
    journal: &Path,
    krate: &str,
    group: &[(&Mutant, Vec<&str>)],
    plan: &[(usize, crate::schemata::Site)],
    tests_of: &dyn Fn(&Mutant) -> Vec<&'a str>,
    limit_of: &dyn Fn(&[&str]) -> Duration,
) -> Result<Option<Vec<SharedResult>>> {
    let mut plan: Vec<(usize, crate::schemata::Site)> = plan.to_vec();
    let start = Instant::now();
    // A site whose two branches do not type-check together (a `Range` and a `Rev` of one)
    // is dropped, by the compiler's error lines, and the build tried again.
    let mut attempts = 0;
    let (mut applied, checked, run_count) = loop {
        attempts += 1;
        let mut files: Vec<&str> = plan.iter().map(|(k, _)| group[*k].0.file).collect();
        files.sort_unstable();
        files.dedup();
        let mut edits: Vec<Edit> = Vec::new();
        // (file, first line, last line, index into `plan`) of every wrapped site.
        let mut spans: Vec<(&str, usize, usize, usize)> = Vec::new();
        for file in files {
            let path = root.join(file);
            let before = std::fs::read_to_string(&path)?;
            let at: Vec<usize> = (0..plan.len())
                .filter(|&i| group[plan[i].0].0.file == file)
                .collect();
            let sites: Vec<(crate::schemata::Site, &str)> = at
                .iter()
                .map(|&i| (plan[i].1.clone(), group[plan[i].0].0.name))
                .collect();
            let (after, lines) = crate::schemata::wrap(&before, &sites);
            for (&i, (first, last)) in at.iter().zip(lines) {
                spans.push((file, first, last, i));
            }
            edits.push((path, before, after));
        }
        if plan.len() < MIN_SHARED {
            return Ok(None);
        }
        println!(
            "mutants: {krate}: {} of its {} mutants share one build, each switched on by {}",
            plan.len(),
            group.len(),
            crate::schemata::SWITCH
        );
        let mut applied = Applied::apply(journal, edits)?;
        // The check: with no mutant switched on, every selection builds and passes.
        let mut checked: Vec<(Vec<&'a str>, f64)> = Vec::new();
        let mut failed = None;
        let selections: Vec<Vec<&'a str>> =
            plan.iter().map(|(k, _)| tests_of(group[*k].0)).collect();
        let runs = merged_checks(&selections);
        let run_count = runs.len();
        for (tests, members) in runs {
            match cargo_test(root, &tests, STUCK, None, true)? {
                (Outcome::Passed, secs, _) => {
                    checked.extend(members.into_iter().map(|m| (selections[m].clone(), secs)))
                }
                (outcome, _, errors) => {
                    failed = Some((tests, outcome, errors));
                    break;
                }
            }
        }
        let Some((tests, outcome, errors)) = failed else {
            break (applied, checked, run_count);
        };
        let mut rejected = Vec::new();
        if outcome == Outcome::Unviable && attempts < 4 {
            let at = |l: &str| -> Option<usize> {
                let loc = l.trim_start().strip_prefix("--> ")?;
                let mut parts = loc.rsplitn(3, ':');
                let (_col, line, file) = (parts.next()?, parts.next()?, parts.next()?);
                let line: usize = line.parse().ok()?;
                spans
                    .iter()
                    .find(|(f, a, b, _)| *f == file && (*a..=*b).contains(&line))
                    .map(|s| s.3)
            };
            // The location of each error (warnings, such as the wrappings' unneeded
            // parentheses, are not the build's failure).
            let mut in_error = false;
            let mut located: Vec<Option<usize>> = Vec::new();
            for l in errors.lines() {
                if l.starts_with("error") {
                    in_error = !l.starts_with("error: could not compile");
                } else if l.starts_with("warning") {
                    in_error = false;
                } else if in_error && l.trim_start().starts_with("--> ") {
                    located.push(at(l));
                    in_error = false;
                }
            }
            if !located.is_empty() && located.iter().all(Option::is_some) {
                rejected = located.into_iter().flatten().collect();
            }
        }
        applied.restore()?;
        if rejected.is_empty() {
            if outcome == Outcome::Unviable {
                println!("{}", first_errors(&errors));
            }
            println!(
                "mutants: {krate}: the shared build is not usable (cargo test {} with no \
                 mutant on: {outcome:?}); its mutants run one build each",
                tests.join(" ")
            );
            return Ok(None);
        }
        rejected.sort_unstable();
        rejected.dedup();
        let names: Vec<&str> = rejected.iter().map(|&i| group[plan[i].0].0.name).collect();
        println!(
            "mutants: {krate}: {} do not type-check in a shared build; they run one build each",
            names.join(", ")
        );
        for &i in rejected.iter().rev() {
            plan.remove(i);
        }
    };
    println!(
        "mutants: {krate}: shared build checked in {:.1} s (with no mutant on, {run_count} \
         cargo test runs pass the selections of all {})",
        start.elapsed().as_secs_f64(),
        checked.len()
    );
    let mut results = Vec::new();
    for (k, _) in &plan {
        let m = group[*k].0;
        let tests = tests_of(m);
        // The limit: the larger of the unmutated run's and this build's own.
        let own = checked
            .iter()
            .find(|(t, _)| *t == tests)
            .map_or(0.0, |(_, secs)| *secs);
        let limit = limit_of(&tests).max(limit_for(own, DEFAULT_TIMEOUT_FACTOR, Duration::ZERO));
        let start = Instant::now();
        let outcome = cargo_test(root, &tests, limit, Some(m.name), false);
        let outcome = match outcome {
            Ok((outcome, _, _)) => outcome,
            Err(e) => {
                applied.restore()?;
                return Err(e);
            }
        };
        results.push((*k, outcome, limit, start.elapsed().as_secs_f64()));
    }
    applied.restore()?;
    Ok(Some(results))
}

/// Set by the Ctrl-C / SIGTERM handler: the running tests are stopped and the tree is
/// restored before the process exits.
static INTERRUPTED: std::sync::LazyLock<std::sync::Arc<AtomicBool>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(AtomicBool::new(false)));

/// One file's edit: its path, its text before and its text with the mutant.
type Edit = (PathBuf, String, String);

/// The edits of mutant `m` (its first anchor already found once in `original`, the text
/// of `m.file`): one per file, the second edit folded in when it is in the same file.
/// `None` when the second anchor is not found exactly once.
fn edits_of(m: &Mutant, root: &Path, original: &str) -> Result<Option<Vec<Edit>>> {
    let path = root.join(m.file);
    let mutated = original.replacen(m.find, m.replace, 1);
    let Some((file, find, replace)) = m.also else {
        return Ok(Some(vec![(path, original.to_string(), mutated)]));
    };
    if file == m.file {
        if mutated.matches(find).count() != 1 {
            return Ok(None);
        }
        let both = mutated.replacen(find, replace, 1);
        return Ok(Some(vec![(path, original.to_string(), both)]));
    }
    let second = root.join(file);
    let before = std::fs::read_to_string(&second)
        .with_context(|| format!("mutants: '{}': cannot read {file}", m.name))?;
    if before.matches(find).count() != 1 {
        return Ok(None);
    }
    let after = before.replacen(find, replace, 1);
    Ok(Some(vec![
        (path, original.to_string(), mutated),
        (second, before, after),
    ]))
}

/// A mutant's edits, live in the working tree. The original texts are journaled (and
/// synced) before any file is touched, and restored by [`Applied::restore`], on drop
/// (an error, an interruption) or by [`restore_journaled`] at the next run's start.
struct Applied {
    journal: PathBuf,
    originals: Vec<(PathBuf, String)>,
}

impl Applied {
    fn apply(journal: &Path, edits: Vec<Edit>) -> Result<Self> {
        let entries: Vec<serde_json::Value> = edits
            .iter()
            .map(|(path, before, _)| serde_json::json!({ "path": path, "text": before }))
            .collect();
        if let Some(dir) = journal.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let partial = journal.with_extension("partial");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&partial)?;
            f.write_all(serde_json::to_string(&entries)?.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&partial, journal)
            .with_context(|| format!("mutants: cannot write {}", journal.display()))?;
        let mut applied = Applied {
            journal: journal.to_path_buf(),
            originals: Vec::new(),
        };
        for (path, before, after) in edits {
            // Recorded before the write, so a failed write is still restored.
            applied.originals.push((path.clone(), before));
            std::fs::write(&path, after)
                .with_context(|| format!("mutants: cannot write {}", path.display()))?;
        }
        Ok(applied)
    }

    /// Writes the original texts back and removes the journal.
    fn restore(&mut self) -> Result<()> {
        for (path, text) in self.originals.drain(..) {
            std::fs::write(&path, text)
                .with_context(|| format!("mutants: cannot restore {}", path.display()))?;
        }
        match std::fs::remove_file(&self.journal) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        if !self.originals.is_empty() {
            if let Err(e) = self.restore() {
                eprintln!(
                    "mutants: {e:#}; the journal {} keeps the original text",
                    self.journal.display()
                );
            }
        }
    }
}

/// Restores the files a journal left by an interrupted run lists; returns how many.
fn restore_journaled(journal: &Path) -> Result<usize> {
    let text = match std::fs::read_to_string(journal) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("mutants: {} is not a journal", journal.display()))?;
    let mut restored = 0;
    for entry in &entries {
        let (Some(path), Some(text)) = (entry["path"].as_str(), entry["text"].as_str()) else {
            bail!(
                "mutants: {}: an entry without path and text",
                journal.display()
            );
        };
        std::fs::write(path, text).with_context(|| format!("mutants: cannot restore {path}"))?;
        restored += 1;
    }
    std::fs::remove_file(journal)?;
    Ok(restored)
}

/// A mutant's tests may take this many times their baseline run...
const DEFAULT_TIMEOUT_FACTOR: f64 = 5.0;
/// ...and at least this long (a 2-core machine shared with other builds is noisy).
const DEFAULT_TIMEOUT_MIN: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    const BUILD_FAILED: &str = "   Compiling mtp v0.1.0\nerror[E0308]: mismatched types\nerror: could not compile `mtp` (lib) due to 1 previous error\n";

    #[test]
    fn a_mutant_that_does_not_compile_is_unviable_not_caught() {
        assert_eq!(classify(false, "", BUILD_FAILED), Outcome::Unviable);
        // No FAILED line and no test binary run is a build failure too.
        assert_eq!(
            classify(false, "", "error: some cargo failure\n"),
            Outcome::Unviable
        );
    }

    #[test]
    fn failing_tests_are_counted_and_a_crash_is_caught() {
        let stdout = "running 3 tests\ntest result: FAILED. 1 passed; 2 failed; 0 ignored\n\
                      test result: FAILED. 0 passed; 1 failed; 0 ignored\n";
        assert_eq!(classify(false, stdout, ""), Outcome::Failed(3));
        let stderr = "     Running tests/reference.rs (target/debug/deps/reference-1234)\n\
                      error: test failed, to rerun pass `--test reference`\n\
                      Caused by:\n  process didn't exit successfully (signal: 11, SIGSEGV)\n";
        assert_eq!(
            classify(false, "running 2 tests\n", stderr),
            Outcome::Crashed
        );
        assert_eq!(classify(true, "test result: ok.", ""), Outcome::Passed);
    }

    #[test]
    fn unviable_and_missed_fail_the_run_not_applicable_does_not() {
        let ok = Tally {
            caught: 3,
            not_applicable: 2,
            ..Tally::default()
        };
        assert!(ok.check().is_ok());
        assert_eq!(
            ok.line(),
            "mutants: 3 caught (0 by timeout), 0 missed, 0 unviable, 2 not applicable"
        );
        for bad in [
            Tally {
                unviable: 1,
                ..Tally::default()
            },
            Tally {
                missed: 1,
                ..Tally::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn missing_cpu_features_make_a_mutant_not_applicable() {
        let avx2_only = |f: &str| -> Result<bool> { Ok(f == "avx2" || f == "fma") };
        assert_eq!(
            missing_features(&["avx512f"], avx2_only).unwrap(),
            ["avx512f"]
        );
        assert!(missing_features(&["avx2", "fma"], avx2_only)
            .unwrap()
            .is_empty());
        assert!(missing_features(&[], avx2_only).unwrap().is_empty());
    }

    /// Every anchor of the catalogue is in the tree exactly once (a refactor that moves
    /// one makes its mutant unviable; this says so without building anything).
    #[test]
    fn every_anchor_is_found_exactly_once() {
        let root = crate::workspace_root();
        for m in MUTANTS {
            let text = std::fs::read_to_string(root.join(m.file)).unwrap();
            assert_eq!(
                text.matches(m.find).count(),
                1,
                "{}: anchor in {}",
                m.name,
                m.file
            );
            if let Some((file, find, _)) = m.also {
                let text = if file == m.file {
                    text.replacen(m.find, m.replace, 1)
                } else {
                    std::fs::read_to_string(root.join(file)).unwrap()
                };
                assert_eq!(
                    text.matches(find).count(),
                    1,
                    "{}: second anchor in {file}",
                    m.name
                );
            }
        }
    }

    /// Every mutant names the test targets that must catch it (`--test`, `--lib`,
    /// `--bin` after each `-p`), and each names a target that exists: a mutant builds and
    /// runs only those targets, so a missing or misspelt one would test nothing.
    #[test]
    fn every_mutant_names_existing_test_targets() {
        let root = crate::workspace_root();
        for m in MUTANTS {
            let targets = named_targets(m.tests).unwrap_or_else(|e| panic!("{}: {e}", m.name));
            assert!(!targets.is_empty(), "{}: names no test target", m.name);
            for t in &targets {
                assert!(
                    t.source(&root).is_some(),
                    "{}: {t:?} has no source under {}",
                    m.name,
                    root.display()
                );
            }
        }
        assert!(named_targets(&["-p", "mtp", "chain"]).is_err());
        assert!(named_targets(&["--test", "q8"]).is_err());
        let t = named_targets(&["-p", "onebit-kernels", "--test", "nosuch"]).unwrap();
        assert!(t[0].source(&root).is_none());
    }

    #[test]
    fn the_limit_is_a_multiple_of_the_baseline_with_a_floor() {
        let min = Duration::from_secs(120);
        assert_eq!(limit_for(10.0, 5.0, min), min);
        assert_eq!(limit_for(60.0, 5.0, min), Duration::from_secs(300));
        assert_eq!(crate_of("crates/npu-runtime/src/cpu.rs"), "npu-runtime");
    }

    /// Every crate the catalogue mutates has a place in the order, after every crate
    /// that depends on it (read from the manifests).
    #[test]
    fn mutated_crates_run_dependents_first() {
        let root = crate::workspace_root();
        for m in MUTANTS {
            assert!(
                build_rank(crate_of(m.file)) < DEPENDENTS_FIRST.len(),
                "{}: crate {} is not in DEPENDENTS_FIRST",
                m.name,
                crate_of(m.file)
            );
        }
        for (i, krate) in DEPENDENTS_FIRST.iter().enumerate() {
            let manifest =
                std::fs::read_to_string(root.join("crates").join(krate).join("Cargo.toml"))
                    .unwrap();
            let deps = manifest.split("[dependencies]").nth(1).unwrap_or("");
            let deps = deps.split("\n[").next().unwrap_or("");
            for later in &DEPENDENTS_FIRST[..i] {
                assert!(
                    !deps.lines().any(|l| l.starts_with(&format!("{later}."))
                        || l.starts_with(&format!("{later} "))),
                    "{krate} depends on {later}, which runs before it"
                );
            }
        }
    }

    /// A run past its limit is killed with everything it started (the grandchild
    /// `sleep` would otherwise hold the output pipe open, and `run_limited` would wait
    /// for it), and reported as timed out; a quick one is not.
    #[cfg(unix)]
    #[test]
    fn a_run_past_its_limit_is_killed_with_its_children() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 600 & echo started; wait"]);
        let start = Instant::now();
        let done = run_limited(cmd, Duration::from_millis(300)).unwrap();
        assert!(done.timed_out && !done.success);
        assert_eq!(done.stdout, "started\n");
        // Not a timing assertion: a surviving `sleep 600` would hold this for 10 minutes.
        assert!(start.elapsed() < Duration::from_secs(300));
        let mut quick = Command::new("sh");
        quick.args(["-c", "echo ok; exit 3"]);
        let done = run_limited(quick, Duration::from_secs(600)).unwrap();
        assert!(!done.timed_out && !done.success);
        assert_eq!(done.stdout, "ok\n");
    }

    #[test]
    fn selections_run_over_the_workspace_with_their_targets_and_filters() {
        assert_eq!(
            workspace_selection(&["-p", "onebit-kernels", "--test", "q8"]),
            ["--workspace", "--test", "q8"]
        );
        assert_eq!(
            workspace_selection(&[
                "-p",
                "onebit-kernels",
                "--test",
                "matmul",
                "-p",
                "npu-runtime",
                "--test",
                "reference",
                "--",
                "-p",
                "x"
            ]),
            [
                "--workspace",
                "--test",
                "matmul",
                "--test",
                "reference",
                "--",
                "-p",
                "x"
            ]
        );
        assert_eq!(
            workspace_selection(&["-p", "mtp", "--lib", "chain"]),
            ["--workspace", "--lib", "chain"]
        );
    }

    /// A mutant's edits are journaled before the tree changes and undone by `restore`,
    /// by drop (an error or an interruption unwinding) and by the next run's start.
    #[test]
    fn a_shared_builds_check_runs_each_target_set_once_with_every_filter() {
        let sel = |a: &[&'static str]| a.to_vec();
        let selections = vec![
            sel(&["-p", "s", "--test", "serve", "alpha"]),
            sel(&["-p", "s", "--test", "serve", "--", "beta"]),
            sel(&["-p", "k", "--test", "q8", "top"]),
            sel(&["-p", "k", "--test", "q8"]),
            sel(&["-p", "s", "--lib", "metrics::"]),
            sel(&["-p", "s", "--test", "serve", "alpha"]),
            sel(&["-p", "s", "--test", "serve", "--", "--exact", "gamma"]),
        ];
        let runs = merged_checks(&selections);
        assert_eq!(
            runs,
            vec![
                (
                    sel(&["-p", "s", "--test", "serve", "--", "alpha", "beta"]),
                    vec![0, 1, 5]
                ),
                (sel(&["-p", "k", "--test", "q8"]), vec![2, 3]),
                (sel(&["-p", "s", "--lib", "--", "metrics::"]), vec![4]),
                (
                    sel(&["-p", "s", "--test", "serve", "--", "--exact", "gamma"]),
                    vec![6]
                ),
            ]
        );
        // Every selection is covered once.
        let mut all: Vec<usize> = runs.iter().flat_map(|(_, m)| m.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..selections.len()).collect::<Vec<_>>());
    }

    #[test]
    fn edits_are_journaled_and_always_undone() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.rs"), dir.path().join("b.rs"));
        std::fs::write(&a, "fn a() { 1 }").unwrap();
        std::fs::write(&b, "fn b() { 2 }").unwrap();
        let journal = dir.path().join("mutants/applied.json");
        let edits = || {
            vec![
                (
                    a.clone(),
                    "fn a() { 1 }".to_string(),
                    "fn a() { 0 }".to_string(),
                ),
                (
                    b.clone(),
                    "fn b() { 2 }".to_string(),
                    "fn b() { 0 }".to_string(),
                ),
            ]
        };
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();

        let mut applied = Applied::apply(&journal, edits()).unwrap();
        assert_eq!(
            (read(&a), read(&b)),
            ("fn a() { 0 }".into(), "fn b() { 0 }".into())
        );
        assert!(journal.exists());
        applied.restore().unwrap();
        assert_eq!(
            (read(&a), read(&b)),
            ("fn a() { 1 }".into(), "fn b() { 2 }".into())
        );
        assert!(!journal.exists());

        drop(Applied::apply(&journal, edits()).unwrap());
        assert_eq!(
            read(&a),
            "fn a() { 1 }",
            "dropped without restore: restored"
        );
        assert!(!journal.exists());

        // A run killed mid-mutant: the edits stay, the journal with them.
        std::mem::forget(Applied::apply(&journal, edits()).unwrap());
        assert_eq!(read(&b), "fn b() { 0 }");
        assert_eq!(restore_journaled(&journal).unwrap(), 2);
        assert_eq!(
            (read(&a), read(&b)),
            ("fn a() { 1 }".into(), "fn b() { 2 }".into())
        );
        assert_eq!(
            restore_journaled(&journal).unwrap(),
            0,
            "nothing left to undo"
        );
    }

    #[test]
    fn a_second_edit_in_the_same_file_is_folded_into_one() {
        let dir = tempfile::tempdir().unwrap();
        let m = Mutant {
            name: "two-edits",
            file: "f.rs",
            find: "one",
            replace: "1",
            tests: &[],
            also: Some(("f.rs", "two", "2")),
            requires: &[],
        };
        let edits = edits_of(&m, dir.path(), "one two").unwrap().unwrap();
        assert_eq!(edits.len(), 1);
        assert_eq!(
            (edits[0].1.as_str(), edits[0].2.as_str()),
            ("one two", "1 2")
        );
        assert!(edits_of(&m, dir.path(), "one three").unwrap().is_none());
    }

    /// Every feature the catalogue names is one the detector knows, and every mutant
    /// of an AVX-512 intrinsic path says it needs avx512f.
    #[test]
    fn the_catalogue_names_known_features_for_its_isa_mutants() {
        for m in MUTANTS {
            for f in m.requires {
                assert!(cpu_has(f).is_ok(), "{}: unknown feature {f}", m.name);
            }
            if m.find.contains("_mm512_") || m.replace.contains("_mm512_") {
                assert!(m.requires.contains(&"avx512f"), "{}", m.name);
            }
            if m.find.contains("_mm256_") || m.replace.contains("_mm256_") {
                assert!(m.requires.contains(&"avx2"), "{}", m.name);
            }
        }
        assert!(cpu_has("avx513").is_err());
    }
}
