//! Speculative sampling keeps the target's distribution: the first three sampled tokens
//! (64 outcomes) under plain sampling and under speculation, each on its own seeds,
//! against the analytic distribution of a toy base with a 4-token vocabulary; and the
//! sampler's chain against an independent f64 implementation.

mod common;
use common::Toy;

use mtp::{run, DraftHead, RunOptions, SamplingConfig};
use npu_runtime::Forward;

/// A target whose logits depend on the position and the token only.
fn toy() -> Toy {
    Toy::new(4, 0, 0.0)
}

/// Deterministic drafts: `(last + i + 1) % 4`.
struct Guesser;

impl DraftHead for Guesser {
    fn needs_last_hidden(&self) -> bool {
        false
    }
    fn draft(&mut self, _pos: usize, last: u32, k: usize) -> Option<Vec<u32>> {
        Some((0..k as u32).map(|i| (last + i + 1) % 4).collect())
    }
    fn commit_rows(&mut self, _: usize) {}
    fn reset(&mut self) {}
    fn error(&self) -> Option<String> {
        None
    }
}

/// Random drafts from a fixed distribution q, exposed for the min(1, p/q) rule.
struct QDrafter {
    state: u64,
    q: Vec<f32>,
    last_k: usize,
}

impl DraftHead for QDrafter {
    fn needs_last_hidden(&self) -> bool {
        false
    }
    fn draft(&mut self, _pos: usize, _last: u32, k: usize) -> Option<Vec<u32>> {
        self.last_k = k;
        Some(
            (0..k)
                .map(|_| {
                    self.state = self
                        .state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (self.state >> 40) as f32 / (1u64 << 24) as f32;
                    let mut acc = 0.0;
                    for (i, &p) in self.q.iter().enumerate() {
                        acc += p;
                        if u < acc {
                            return i as u32;
                        }
                    }
                    3
                })
                .collect(),
        )
    }
    fn commit_rows(&mut self, _: usize) {}
    fn reset(&mut self) {}
    fn error(&self) -> Option<String> {
        None
    }
    fn draft_probabilities(&self) -> Option<Vec<Vec<f32>>> {
        Some(vec![self.q.clone(); self.last_k])
    }
}

/// Counts of the first three sampled tokens (cell `t0 * 16 + t1 * 4 + t2`) over
/// `trials` runs seeded `first_seed..first_seed + trials`.
fn histogram(
    mut head: impl FnMut(u64) -> Option<Box<dyn DraftHead>>,
    sampling: SamplingConfig,
    first_seed: u64,
    trials: u64,
) -> Vec<f64> {
    let mut counts = vec![0f64; 64];
    for seed in first_seed..first_seed + trials {
        let mut base = toy();
        let options = RunOptions {
            max_tokens: 3,
            draft_max: 3,
            adaptive: None,
            stop_tokens: vec![],
            sampling: SamplingConfig { seed, ..sampling },
        };
        let out = match head(seed) {
            Some(mut h) => run(&mut base, Some(&mut *h), &[1, 2], &options, &mut |_| true),
            None => run(&mut base, None, &[1, 2], &options, &mut |_| true),
        }
        .unwrap();
        let t = &out.tokens;
        counts[(t[0] * 16 + t[1] * 4 + t[2]) as usize] += 1.0;
    }
    counts
}

/// The sampling configurations the distribution tests run: plain temperature, and every
/// transform at once (penalties strong enough to move most of the mass on a 4-token
/// vocabulary, top-k cutting one token, top-p and min-p cutting the tail).
fn configurations() -> [(&'static str, SamplingConfig); 2] {
    [
        (
            "temperature 1",
            SamplingConfig {
                temperature: 1.0,
                ..SamplingConfig::default()
            },
        ),
        (
            "penalties + top-k + top-p + min-p",
            SamplingConfig {
                temperature: 0.8,
                top_k: 3,
                top_p: 0.95,
                min_p: 0.05,
                repeat_penalty: 1.8,
                repeat_last_n: 3,
                presence_penalty: 0.6,
                frequency_penalty: 0.5,
                ..SamplingConfig::default()
            },
        ),
    ]
}

/// Draws of `q`: a draft distribution far from the toy's (which favours low ids), so
/// the min(1, p/q) test rejects often and the residual draw carries much of the mass.
const Q: [f32; 4] = [0.1, 0.1, 0.2, 0.6];

/// Speculative sampling keeps the target's distribution, penalties and truncation
/// included: plain sampling, the exact-match rule (deterministic drafts) and the
/// min(1, p/q) rule (random drafts with their q), each on its own seeds (no arm shares
/// a seed with another, so a stream is never compared with itself), are each compared
/// with the analytic distribution of the first three tokens (64 cells), computed by
/// enumeration with an independent f64 implementation of the chain
/// (`common::reference_distribution`). Pearson's goodness-of-fit test at significance
/// 0.001 (cells expecting fewer than 5 pooled; the seeds are fixed, so the outcome is
/// too). Measured (40,000 trials an arm): temperature 1: plain 50.8, exact-match 72.3,
/// min(1, p/q) 71.4 (df 60, critical 99.7); penalties + top-k + top-p + min-p: plain
/// 37.2, exact-match 27.2, min(1, p/q) 13.9 (df 23, critical 49.8). Each named mutant of
/// `verify.rs` (`cargo xtask mutants`) makes an arm fail.
#[test]
fn speculative_sampling_matches_the_analytic_distribution() {
    let trials = 40_000;
    for (name, sampling) in configurations() {
        let expected = common::analytic_histogram(4, 0, 0.0, &[1, 2], &sampling, 3);
        let total: f64 = expected.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "{name}: {total}");
        let arms: [(&str, Vec<f64>); 3] = [
            ("plain", histogram(|_| None, sampling, 0, trials)),
            (
                "exact-match rule",
                histogram(|_| Some(Box::new(Guesser)), sampling, 1_000_000, trials),
            ),
            (
                "min(1, p/q) rule",
                histogram(
                    |seed| {
                        Some(Box::new(QDrafter {
                            state: seed.wrapping_mul(7919).wrapping_add(1),
                            q: Q.to_vec(),
                            last_k: 0,
                        }))
                    },
                    sampling,
                    2_000_000,
                    trials,
                ),
            ),
        ];
        for (arm, observed) in &arms {
            let (stat, df) = common::chi2_fit(observed, &expected);
            let critical = common::chi2_critical_001(df);
            eprintln!("{name}, {arm}: chi2 {stat:.1} with {df} degrees of freedom (critical {critical:.1} at 0.001)");
            assert!(
                stat < critical,
                "{name}, {arm}: chi2 {stat:.1} (df {df}) over {critical:.1}: not the target's distribution"
            );
        }
    }
    // And the test can fail: a sample of another law (the penalties left out) is refused.
    let [_, (_, penalized)] = configurations();
    let unpenalized = SamplingConfig {
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        ..penalized
    };
    let expected = common::analytic_histogram(4, 0, 0.0, &[1, 2], &penalized, 3);
    let other = histogram(|_| None, unpenalized, 3_000_000, trials);
    let (stat, df) = common::chi2_fit(&other, &expected);
    assert!(
        stat > common::chi2_critical_001(df),
        "chi2 {stat:.1} (df {df})"
    );
}

/// Greedy decoding with penalties: the penalties change the argmax (as llama.cpp's
/// greedy sampler after its penalties), and speculative text still equals plain text —
/// each draft is checked against the argmax given the drafts accepted before it.
#[test]
fn greedy_with_penalties_speculative_text_equals_plain() {
    let sampling = SamplingConfig {
        repeat_penalty: 1.7,
        repeat_last_n: 6,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        ..SamplingConfig::default()
    };
    let options = |sampling| RunOptions {
        max_tokens: 60,
        draft_max: 4,
        adaptive: None,
        stop_tokens: vec![],
        sampling,
    };
    let unpenalized = run(
        &mut toy(),
        None,
        &[1, 2],
        &options(SamplingConfig::default()),
        &mut |_| true,
    )
    .unwrap();
    let plain = run(&mut toy(), None, &[1, 2], &options(sampling), &mut |_| true).unwrap();
    assert_ne!(
        plain.tokens, unpenalized.tokens,
        "the penalties change the greedy text"
    );
    // An oracle knowing the penalized text: every draft is right, so whole rounds are
    // accepted and each position's argmax depends on drafts accepted in its round.
    let stream = [vec![1, 2], plain.tokens.clone()].concat();
    for rule in ["always", "every-third"] {
        let mut head =
            mtp::OracleHead::new(stream.clone(), 4, mtp::OracleRule::parse(rule).unwrap());
        let spec = run(
            &mut toy(),
            Some(&mut head),
            &[1, 2],
            &options(sampling),
            &mut |_| true,
        )
        .unwrap();
        assert_eq!(spec.tokens, plain.tokens, "oracle {rule}");
        assert!(spec.stats.accepted > 10, "{:?}", spec.stats);
    }
    let spec = run(
        &mut toy(),
        Some(&mut Guesser),
        &[1, 2],
        &options(sampling),
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(spec.tokens, plain.tokens, "guesser");
}

/// A classic MTP head drafts from the target's last hidden state: the loop takes the
/// two-pass round, and greedy text still equals plain greedy text.
struct HiddenHead {
    seen_hidden: usize,
}

impl DraftHead for HiddenHead {
    fn needs_last_hidden(&self) -> bool {
        true
    }
    fn draft(&mut self, _pos: usize, last: u32, k: usize) -> Option<Vec<u32>> {
        Some((0..k as u32).map(|i| (last + i) % 4).collect())
    }
    fn commit_rows(&mut self, _: usize) {}
    fn reset(&mut self) {}
    fn error(&self) -> Option<String> {
        None
    }
    fn observe_hidden(&mut self, _hidden: &[f32]) {
        self.seen_hidden += 1;
    }
}

#[test]
fn two_pass_round_keeps_greedy_text() {
    let greedy = RunOptions {
        max_tokens: 40,
        draft_max: 3,
        adaptive: None,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ..SamplingConfig::default()
        },
    };
    let plain = run(&mut toy(), None, &[1, 2], &greedy, &mut |_| true).unwrap();
    let mut head = HiddenHead { seen_hidden: 0 };
    let mut base = toy();
    let spec = run(&mut base, Some(&mut head), &[1, 2], &greedy, &mut |_| true).unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    assert!(
        head.seen_hidden > 0,
        "the head saw the first pass's hidden state"
    );
    assert!(spec.stats.rounds > 0);
    // The target holds exactly the committed stream: prompt plus emitted tokens, minus
    // the last one (not yet run) or including it (an accepted draft was run).
    assert!(
        base.tokens.len() + 1 >= 2 + spec.tokens.len()
            && base.tokens.len() <= 2 + spec.tokens.len()
    );
    assert_eq!(base.tokens[2..], spec.tokens[..base.tokens.len() - 2]);
}

/// `Sampler::distribution` against the independent float64 chain
/// (`common::reference_distribution`), for temperature, top-p, top-k, min-p and the
/// penalties, alone and together, after a prompt and some generated tokens.
#[test]
fn distribution_matches_a_float64_reference() {
    let logits: Vec<f32> = (0..40)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.31 + (i as f32) * 0.01)
        .collect();
    let prompt: Vec<u32> = vec![3, 7, 7, 12, 30, 39, 1];
    let generated: Vec<u32> = vec![7, 20, 20, 20, 5, 39];
    let base = SamplingConfig::default();
    let mut configs = Vec::new();
    for (temperature, top_p) in [
        (1.0f32, 1.0f32),
        (0.7, 1.0),
        (1.3, 0.9),
        (0.5, 0.5),
        (2.0, 0.3),
    ] {
        configs.push(SamplingConfig {
            temperature,
            top_p,
            ..base
        });
    }
    for top_k in [1, 2, 5, 39, 40, 100] {
        configs.push(SamplingConfig {
            temperature: 0.9,
            top_k,
            ..base
        });
    }
    for min_p in [0.01f32, 0.2, 0.9, 1.0] {
        configs.push(SamplingConfig {
            temperature: 1.1,
            min_p,
            ..base
        });
    }
    for (repeat_penalty, repeat_last_n) in
        [(1.3f32, 4usize), (0.7, 64), (2.0, usize::MAX), (1.5, 0)]
    {
        configs.push(SamplingConfig {
            temperature: 1.0,
            repeat_penalty,
            repeat_last_n,
            ..base
        });
    }
    for (presence_penalty, frequency_penalty) in [(0.5f32, 0.0f32), (0.0, 0.7), (-1.0, 2.0)] {
        configs.push(SamplingConfig {
            temperature: 1.0,
            presence_penalty,
            frequency_penalty,
            ..base
        });
    }
    configs.push(SamplingConfig {
        temperature: 0.8,
        top_k: 10,
        top_p: 0.8,
        min_p: 0.05,
        repeat_penalty: 1.2,
        repeat_last_n: 5,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        ..base
    });
    // Greedy with penalties: the argmax of the penalized logits.
    configs.push(SamplingConfig {
        repeat_penalty: 3.0,
        presence_penalty: 2.0,
        ..base
    });
    configs.push(base);
    for c in configs {
        let mut sampler = mtp::Sampler::new(c).unwrap();
        sampler.observe_prompt(&prompt);
        for &t in &generated {
            sampler.accept(t);
        }
        let expected = common::reference_distribution(&logits, &c, &prompt, &generated);
        let got = sampler.distribution(&logits);
        assert_eq!(got.len(), logits.len());
        for i in 0..expected.len() {
            assert!(
                (got[i] as f64 - expected[i]).abs() < 1e-6,
                "{c:?}: p[{i}] = {} vs {}",
                got[i],
                expected[i]
            );
        }
        let sum: f64 = got.iter().map(|&v| v as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5, "{c:?}: {sum}");
        if c.temperature == 0.0 {
            assert_eq!(got.iter().filter(|&&v| v > 0.0).count(), 1);
        }
    }
    let plain_greedy = mtp::Sampler::new(base).unwrap();
    assert!(plain_greedy.is_greedy());
    assert_eq!(
        plain_greedy.distribution(&logits)[npu_runtime::argmax(&logits)],
        1.0
    );
}

/// The time split adds up: every part is positive when it ran and none exceeds the
/// run's wall-clock time.
#[test]
fn stats_time_split_is_positive_and_bounded() {
    let mut base = toy();
    let mut plain = toy();
    let options = RunOptions {
        max_tokens: 40,
        draft_max: 3,
        adaptive: None,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 1,
            ..SamplingConfig::default()
        },
    };
    let reference = run(&mut plain, None, &[0, 1], &options, &mut |_| true).unwrap();
    let mut head = mtp::OracleHead::new(
        [vec![0, 1], reference.tokens.clone()].concat(),
        4,
        mtp::OracleRule::parse("every-third").unwrap(),
    );
    let start = std::time::Instant::now();
    let out = run(&mut base, Some(&mut head), &[0, 1], &options, &mut |_| true).unwrap();
    let wall = start.elapsed().as_secs_f64();
    let s = &out.stats;
    assert_eq!(out.tokens, reference.tokens);
    for (name, t) in [
        ("target", s.target_seconds),
        ("draft", s.draft_seconds),
        ("sampling", s.sampling_seconds),
    ] {
        assert!(t > 0.0, "{name} time {t}");
        assert!(t <= wall, "{name} time {t} over the wall clock {wall}");
    }
    assert!(s.target_seconds + s.draft_seconds + s.sampling_seconds <= wall);
}

/// `draft_max = 0` is plain decoding: no head is asked for a draft or shown a hidden
/// state, one-pass and two-pass heads alike.
#[test]
fn draft_max_zero_never_consults_the_head() {
    struct Counting {
        two_pass: bool,
        drafts: usize,
        hidden: usize,
    }
    impl DraftHead for Counting {
        fn needs_last_hidden(&self) -> bool {
            self.two_pass
        }
        fn draft(&mut self, _pos: usize, _last: u32, _k: usize) -> Option<Vec<u32>> {
            self.drafts += 1;
            Some(Vec::new())
        }
        fn observe_hidden(&mut self, _hidden: &[f32]) {
            self.hidden += 1;
        }
        fn commit_rows(&mut self, _m: usize) {}
        fn reset(&mut self) {}
        fn error(&self) -> Option<String> {
            None
        }
    }
    let options = RunOptions {
        max_tokens: 12,
        draft_max: 0,
        adaptive: None,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            ..SamplingConfig::default()
        },
    };
    let plain = run(&mut toy(), None, &[0, 1], &options, &mut |_| true).unwrap();
    for two_pass in [false, true] {
        let mut head = Counting {
            two_pass,
            drafts: 0,
            hidden: 0,
        };
        let out = run(&mut toy(), Some(&mut head), &[0, 1], &options, &mut |_| {
            true
        })
        .unwrap();
        assert_eq!(out.tokens, plain.tokens);
        assert_eq!((head.drafts, head.hidden), (0, 0), "two_pass {two_pass}");
        assert_eq!(out.stats.rounds, 0);
        assert_eq!(out.stats.plain_steps, 11);
    }
}

fn options_with(temperature: f32, top_p: f32) -> RunOptions {
    RunOptions {
        max_tokens: 3,
        draft_max: 2,
        stop_tokens: vec![],
        sampling: SamplingConfig {
            temperature,
            top_p,
            seed: 0,
            ..SamplingConfig::default()
        },
        adaptive: None,
    }
}

/// An empty prompt has no last row to pick the first token from: refused by name
/// before the target runs (it used to underflow `prompt.len() - 1`).
#[test]
fn an_empty_prompt_is_refused_before_the_target_runs() {
    let mut base = toy();
    let err = run(&mut base, None, &[], &options_with(0.0, 1.0), &mut |_| true).unwrap_err();
    assert!(matches!(err, mtp::RunError::EmptyPrompt), "{err:?}");
    assert_eq!(
        err.to_string(),
        "mtp::run: the prompt is empty (at least one token is needed)"
    );
    assert_eq!(base.position(), 0, "the target ran on an empty prompt");
}

/// Out-of-range sampling parameters are refused by the sampler's constructor and by
/// `run`, with the parameter and its value in the message; the edges of the ranges
/// are accepted.
#[test]
fn sampling_parameters_out_of_range_are_refused_by_value() {
    for (temperature, top_p, message) in [
        (
            f32::NAN,
            1.0,
            "sampling: temperature must be a finite number >= 0, got NaN",
        ),
        (
            -1.0,
            1.0,
            "sampling: temperature must be a finite number >= 0, got -1",
        ),
        (
            f32::INFINITY,
            1.0,
            "sampling: temperature must be a finite number >= 0, got inf",
        ),
        (
            0.7,
            0.0,
            "sampling: top_p must be a number in (0, 1], got 0",
        ),
        (
            0.7,
            1.5,
            "sampling: top_p must be a number in (0, 1], got 1.5",
        ),
        (
            0.7,
            -0.1,
            "sampling: top_p must be a number in (0, 1], got -0.1",
        ),
        (
            0.0,
            f32::NAN,
            "sampling: top_p must be a number in (0, 1], got NaN",
        ),
    ] {
        let options = options_with(temperature, top_p);
        let err = mtp::Sampler::new(options.sampling).err().unwrap();
        assert_eq!(err.to_string(), message);
        let mut base = toy();
        let err = run(&mut base, None, &[1, 2], &options, &mut |_| true).unwrap_err();
        assert!(matches!(err, mtp::RunError::Sampling(_)), "{err:?}");
        assert_eq!(err.to_string(), message);
        assert_eq!(base.position(), 0, "the target ran with {message}");
    }
    for (temperature, top_p) in [(0.0, 1.0), (-0.0, 1.0), (1e-6, 1e-6), (100.0, 1.0)] {
        let sampler = mtp::Sampler::new(options_with(temperature, top_p).sampling);
        assert!(sampler.is_ok(), "t={temperature} top_p={top_p} refused");
    }
}
