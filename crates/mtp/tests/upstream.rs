//! The upstream DFlashHead test, on its toy base and on the real CPU target
//! (tiny-qwen3), with a synthetic draft: pick rules always right / every third wrong / always wrong, k = 2 and 7,
//! block 8, 30 tokens. Checks:
//! 1. the text equals plain decoding's;
//! 2. the sink ends holding exactly the committed stream's rows, bit for bit;
//! 3. every draft equals the draft forward from scratch over the committed rows, bit for bit;
//! 4. always-right accepts every draft (k = 7: 26 of 26 in 4 rounds), always-wrong none,
//!    the mixed rule a prefix.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use dflash_draft::synthetic::write_synthetic;
use dflash_draft::{draft_forward, load_draft, DraftConfig, DraftHooks, DEFAULT_WEIGHTS};
use mtp::{run, DFlashHead, DraftHead, RunOptions, SamplingConfig};
use npu_runtime::{
    CpuTarget, Family, Forward, HeadKind, TapRows, TapSink, TargetConfig, TargetPackage,
};

mod common;
use common::CpuHooks;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn draft_config() -> DraftConfig {
    DraftConfig {
        num_layers: 1,
        hidden_size: 128,
        intermediate_size: 256,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        block_size: 8,
        mask_token_id: 511,
        target_layer_ids: vec![0, 1],
        sliding_window: None,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-6,
        embedding_scale: 1.0,
        vocab_size: Some(512),
        max_position_embeddings: 256,
        weights: DEFAULT_WEIGHTS.into(),
        v2: None,
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Rule {
    Right,
    EveryThirdWrong,
    Wrong,
}

/// Embeds with the target's embedding; picks by rule from the known plain stream,
/// using the sink's row count (the block's start position) to know where it is.
struct RuleHooks<'p> {
    inner: Box<dyn DraftHooks + 'p>,
    stream: Vec<u32>,
    sink: TapSink,
    rule: Rule,
}

impl DraftHooks for RuleHooks<'_> {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        self.inner.embed(tokens)
    }
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        let _ = self.inner.pick(hidden, n); // the real scoring still runs
        let start = self.sink.lock().unwrap().rows();
        (0..n)
            .map(|i| {
                let p = start + 1 + i;
                let t = self.stream.get(p).copied().unwrap_or(0);
                let wrong = match self.rule {
                    Rule::Right => false,
                    Rule::EveryThirdWrong => p.is_multiple_of(3),
                    Rule::Wrong => true,
                };
                if wrong {
                    (t + 1) % 512
                } else {
                    t
                }
            })
            .collect()
    }
}

/// Wraps the head to check every draft against a scratch forward over the committed
/// rows and the committed stream's token (check 3). With `decline_every = n > 0` it
/// declines every n-th round, so the loop takes plain steps too.
struct Checked<'h, 'w, 'a> {
    head: DFlashHead<'w, 'a>,
    weights: &'w dflash_draft::DraftWeights<'a>,
    hooks: &'h dyn DraftHooks,
    sink: TapSink,
    stream: Vec<u32>,
    decline_every: usize,
    calls: usize,
    drafts_checked: usize,
}

impl DraftHead for Checked<'_, '_, '_> {
    fn needs_last_hidden(&self) -> bool {
        false
    }
    fn draft(&mut self, pos: usize, last: u32, k: usize) -> Option<Vec<u32>> {
        self.calls += 1;
        if self.decline_every > 0 && self.calls.is_multiple_of(self.decline_every) {
            return None;
        }
        let rows = self.sink.lock().unwrap().rows();
        assert_eq!(
            pos,
            rows + 1,
            "the loop drafts right after the committed rows"
        );
        let committed = self.sink.lock().unwrap().rows_slice(0..pos - 1).to_vec();
        let out = self.head.draft(pos, last, k)?;
        assert_eq!(
            self.head.cached_rows(),
            pos - 1,
            "the draft cache holds every committed row once drafting starts"
        );
        // The block starts with the committed token at pos - 1, whatever the loop passed.
        let mut block = vec![self.stream[pos - 1]];
        block.extend([511u32; 7]);
        let _ = last;
        let scratch = draft_forward(
            self.weights,
            &committed,
            pos - 1,
            &block,
            pos - 1,
            self.hooks,
        )
        .unwrap();
        // The head scores only the k rows asked for; the block is the scratch one.
        let cached = self.head.last_output().expect("a draft was made");
        assert!(
            cached.hidden == scratch.hidden
                && cached.layer_outputs == scratch.layer_outputs
                && cached.tokens.len() == k.min(7)
                && cached.tokens[..] == scratch.tokens[..cached.tokens.len()],
            "draft at {pos} differs from the scratch forward"
        );
        self.drafts_checked += 1;
        Some(out)
    }
    fn commit_rows(&mut self, m: usize) {
        self.head.commit_rows(m)
    }
    fn reset(&mut self) {
        self.head.reset()
    }
    fn error(&self) -> Option<String> {
        self.head.error()
    }
}

/// The four checks over any base: `new_target` makes a fresh base, `new_hooks` the
/// drafter's embedding and scoring hooks.
fn upstream_checks<'p, T: Forward>(
    label: &str,
    new_target: &dyn Fn() -> T,
    new_hooks: &dyn Fn() -> Box<dyn DraftHooks + 'p>,
    weights: &dflash_draft::DraftWeights<'_>,
) {
    let prompt: Vec<u32> = vec![1, 17, 300, 42, 7, 255, 3, 99];
    let greedy = RunOptions {
        max_tokens: 30,
        draft_max: 7,
        adaptive: None,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ..SamplingConfig::default()
        },
    };

    // Plain decoding: the reference text.
    let mut plain_target = new_target();
    let plain = run(&mut plain_target, None, &prompt, &greedy, &mut |_| true).unwrap();
    let mut stream = prompt.clone();
    stream.extend(&plain.tokens);
    // The committed stream's tap rows: one pass over it (batch invariance makes these
    // the bits single steps write).
    let mut tap_target = new_target();
    let plain_sink = Arc::new(Mutex::new(TapRows::new(0)));
    tap_target
        .set_layer_taps(&[0, 1], plain_sink.clone())
        .unwrap();
    tap_target.forward(&stream).unwrap();

    for (rule, k, decline_every) in [Rule::Right, Rule::EveryThirdWrong, Rule::Wrong]
        .into_iter()
        .flat_map(|r| {
            [2usize, 7]
                .into_iter()
                .flat_map(move |k| [0usize, 3].into_iter().map(move |d| (r, k, d)))
        })
    {
        let mut target = new_target();
        let sink = Arc::new(Mutex::new(TapRows::new(0)));
        target.set_layer_taps(&[0, 1], sink.clone()).unwrap();
        let hooks = RuleHooks {
            inner: new_hooks(),
            stream: stream.clone(),
            sink: sink.clone(),
            rule,
        };
        let check_hooks = RuleHooks {
            inner: new_hooks(),
            stream: stream.clone(),
            sink: sink.clone(),
            rule,
        };
        let head = DFlashHead::new(weights, Box::new(hooks), sink.clone());
        let mut checked = Checked {
            head,
            weights,
            hooks: &check_hooks,
            sink: sink.clone(),
            stream: stream.clone(),
            decline_every,
            calls: 0,
            drafts_checked: 0,
        };
        let opts = RunOptions {
            draft_max: k,
            adaptive: None,
            ..greedy.clone()
        };
        let out = run(&mut target, Some(&mut checked), &prompt, &opts, &mut |_| {
            true
        })
        .unwrap();
        // 1. text
        assert_eq!(
            out.tokens, plain.tokens,
            "{label} {rule:?} k={k}: text differs from plain decoding"
        );
        // 2. the sink holds exactly the committed rows, bit for bit
        let rows = sink.lock().unwrap().clone();
        assert_eq!(rows.rows(), target.position(), "{label} {rule:?} k={k}");
        assert!(
            rows.rows() + 1 >= stream.len() && rows.rows() <= stream.len(),
            "{label} {rule:?} k={k}: {} rows",
            rows.rows()
        );
        let reference = plain_sink
            .lock()
            .unwrap()
            .rows_slice(0..rows.rows())
            .to_vec();
        assert!(
            rows.rows_slice(0..rows.rows()) == &reference[..],
            "{label} {rule:?} k={k}: sink rows differ"
        );
        // 3. checked inside `Checked::draft`
        assert!(checked.drafts_checked > 0);
        // A head is reusable: `run` resets it, so a second run over a fresh target
        // repeats the first exactly.
        if decline_every == 0 && k == 7 {
            sink.lock().unwrap().truncate(0);
            let mut again = new_target();
            again.set_layer_taps(&[0, 1], sink.clone()).unwrap();
            let repeat = run(&mut again, Some(&mut checked), &prompt, &opts, &mut |_| {
                true
            })
            .unwrap();
            assert_eq!(
                repeat.tokens, out.tokens,
                "{label} {rule:?}: a reused head differs"
            );
            assert_eq!(
                repeat.stats.accepted_per_round,
                out.stats.accepted_per_round
            );
            assert_eq!(sink.lock().unwrap().rows(), again.position());
        }
        // 4. acceptance
        let s = &out.stats;
        if decline_every > 0 {
            assert!(s.plain_steps > 0, "declined rounds are plain steps");
        }
        match rule {
            Rule::Right => {
                assert_eq!(s.accepted, s.drafted, "{label} {rule:?} k={k}");
                if k == 7 && decline_every == 0 {
                    assert_eq!((s.accepted, s.drafted, s.rounds), (26, 26, 4), "{label}");
                }
            }
            Rule::Wrong => assert_eq!(s.accepted, 0, "{label}"),
            Rule::EveryThirdWrong => {
                assert!(s.accepted > 0 && s.accepted < s.drafted, "{label}: {s:?}");
                assert!(
                    s.accepted_per_round.iter().all(|&a| a < 3),
                    "{label}: a prefix up to the first wrong draft: {s:?}"
                );
            }
        }
    }
    // A draft asked at a position that does not follow the committed rows is refused
    // with a reason, and the next aligned one goes ahead.
    let sink = Arc::new(Mutex::new(TapRows::new(256)));
    for _ in 0..3 {
        sink.lock().unwrap().push_row(&[0.0; 256]);
    }
    let mut head = DFlashHead::new(weights, new_hooks(), sink);
    assert_eq!(head.draft(6, 1, 7), None, "{label}");
    assert_eq!(
        head.error().as_deref(),
        Some("drafting at position 6 over 3 committed rows"),
        "{label}"
    );
    assert!(head.draft(4, 1, 7).is_some(), "{label}");
    assert_eq!(head.error(), None, "{label}");
}

#[test]
fn upstream_checks_on_the_real_cpu_target() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let draft_dir = tempfile::tempdir().unwrap();
    write_synthetic(draft_dir.path(), &draft_config(), 3).unwrap();
    let draft = load_draft(draft_dir.path()).unwrap();
    let weights = draft.weights().unwrap();
    upstream_checks(
        "tiny-qwen3",
        &|| CpuTarget::new(&package).unwrap(),
        &|| Box::new(CpuHooks::new(&package, HeadKind::Tiles)),
        &weights,
    );
}

/// The upstream test's own setting: a toy base that writes a tap row for every
/// position it runs (rejected rows too) and leaves trimming to the drafter.
struct ToyBase {
    config: TargetConfig,
    tokens: Vec<u32>,
    sink: Option<TapSink>,
}

/// The toy's greedy continuation of `token` at `pos` (never the mask token).
fn toy_next(pos: usize, token: u32) -> u32 {
    ((pos * 31 + token as usize * 17 + 5) % 511) as u32
}

/// The toy's tap row at `pos` for `token`: two layers of 128 values.
fn toy_tap_row(pos: usize, token: u32) -> Vec<f32> {
    (0..256)
        .map(|j| (((pos * 13 + token as usize * 7 + j * 3) % 97) as f32 - 48.0) / 48.0)
        .collect()
}

impl Forward for ToyBase {
    fn config(&self) -> &TargetConfig {
        &self.config
    }
    fn position(&self) -> usize {
        self.tokens.len()
    }
    fn forward(&mut self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        let mut out = Vec::new();
        for &t in tokens {
            let pos = self.tokens.len();
            let next = toy_next(pos, t) as usize;
            out.extend((0..512).map(|v| if v == next { 1.0 } else { -((v % 7) as f32) }));
            if let Some(sink) = &self.sink {
                sink.lock().unwrap().push_row(&toy_tap_row(pos, t));
            }
            self.tokens.push(t);
        }
        Ok(out)
    }
    fn last_hidden(&self) -> &[f32] {
        &[]
    }
    fn truncate(&mut self, len: usize) -> npu_runtime::Result<()> {
        // KV rollback only: the tap sink is the drafter's to trim.
        self.tokens.truncate(len);
        Ok(())
    }
    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> npu_runtime::Result<()> {
        assert_eq!(layers, [0, 1]);
        *sink.lock().unwrap() = TapRows::new(256);
        self.sink = Some(sink);
        Ok(())
    }
    fn clear_layer_taps(&mut self) {
        self.sink = None;
    }
    fn embed(&self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        Ok(ToyHooks.embed(tokens))
    }
    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        let _ = (hidden, n);
        Vec::new()
    }
}

/// Embedding and scoring of the toy: deterministic rows per token; a row's pick
/// hashes its bits (the rule hooks override it anyway).
struct ToyHooks;

impl DraftHooks for ToyHooks {
    fn embed(&self, tokens: &[u32]) -> Vec<f32> {
        tokens
            .iter()
            .flat_map(|&t| {
                (0..128).map(move |j| (((t as usize * 11 + j * 5) % 61) as f32 - 30.0) / 30.0)
            })
            .collect()
    }
    fn pick(&self, hidden: &[f32], n: usize) -> Vec<u32> {
        hidden
            .chunks_exact(hidden.len() / n.max(1))
            .map(|row| row.iter().fold(0u32, |h, v| h.rotate_left(5) ^ v.to_bits()) % 511)
            .collect()
    }
}

#[test]
fn upstream_checks_on_the_toy_base() {
    let draft_dir = tempfile::tempdir().unwrap();
    write_synthetic(draft_dir.path(), &draft_config(), 5).unwrap();
    let draft = load_draft(draft_dir.path()).unwrap();
    let weights = draft.weights().unwrap();
    let config = TargetConfig {
        family: Family::Llama,
        vocab_size: 512,
        hidden_size: 128,
        intermediate_size: 256,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        rope_theta: 10000.0,
        rms_eps: 1e-6,
        max_positions: 256,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        chat_template: None,
        lm_head_requantized: false,
        variant: Default::default(),
    };
    upstream_checks(
        "toy base",
        &|| ToyBase {
            config: config.clone(),
            tokens: Vec::new(),
            sink: None,
        },
        &|| Box::new(ToyHooks),
        &weights,
    );
}

/// The drafter's embedding hook is the target's embedding; a token past the
/// vocabulary (never produced by the loop, but the hook takes any id) reads the last
/// row instead of out of bounds.
#[test]
fn package_hooks_embed_like_the_target() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let hooks = CpuHooks::new(&package, HeadKind::Tiles);
    let target = CpuTarget::new(&package).unwrap();
    assert_eq!(
        hooks.embed(&[3, 7, 500]),
        target.embed(&[3, 7, 500]).unwrap()
    );
    let vocab = package.config.vocab_size as u32;
    assert_eq!(hooks.embed(&[vocab + 5]), hooks.embed(&[vocab - 1]));
}
