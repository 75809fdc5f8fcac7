//! Speculative sampling keeps the target's distribution: a chi-squared comparison of
//! the first three sampled tokens (64 outcomes) under plain sampling and under
//! speculation, on a toy base with a 4-token vocabulary.

mod common;
use common::{chi2, Toy};

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

fn histogram(mut head: impl FnMut(u64) -> Option<Box<dyn DraftHead>>, trials: u64) -> Vec<f64> {
    let mut counts = vec![0f64; 64];
    for seed in 0..trials {
        let mut base = toy();
        let options = RunOptions {
            max_tokens: 3,
            draft_max: 3,
            adaptive: None,
            stop_tokens: vec![],
            sampling: SamplingConfig {
                temperature: 1.0,
                top_p: 1.0,
                seed,
            },
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

#[test]
fn speculative_sampling_matches_plain_sampling() {
    let trials = 6000;
    let plain = histogram(|_| None, trials);
    let exact = histogram(|_| Some(Box::new(Guesser)), trials);
    let q = histogram(
        |seed| {
            Some(Box::new(QDrafter {
                state: seed * 7919 + 1,
                q: vec![0.4, 0.3, 0.2, 0.1],
                last_k: 0,
            }))
        },
        trials,
    );
    for (name, spec) in [("exact-match rule", &exact), ("min(1, p/q) rule", &q)] {
        let (stat, df) = chi2(&plain, spec);
        // 99.9th percentile of chi-squared with df <= 63 is at most 103.4.
        eprintln!("{name}: chi2 {stat:.1} with {df} degrees of freedom");
        assert!(
            stat < 103.4,
            "{name}: chi2 {stat:.1} (df {df}) says the distributions differ"
        );
    }
    // And the test can fail: a biased sampler is detected.
    let mut biased = plain.clone();
    biased[0] += 300.0;
    biased[63] = (biased[63] - 300.0).max(0.0);
    assert!(chi2(&plain, &biased).0 > 103.4);
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

/// `Sampler::distribution` against an independent float64 computation: softmax at a
/// temperature, then the smallest top-p nucleus (ties by index), renormalised.
#[test]
fn distribution_matches_a_float64_reference() {
    let logits: Vec<f32> = (0..40)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.31 + (i as f32) * 0.01)
        .collect();
    for (temperature, top_p) in [
        (1.0f32, 1.0f32),
        (0.7, 1.0),
        (1.3, 0.9),
        (0.5, 0.5),
        (2.0, 0.3),
    ] {
        let sampler = mtp::Sampler::new(SamplingConfig {
            temperature,
            top_p,
            seed: 0,
        })
        .unwrap();
        assert!(!sampler.is_greedy());
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - max) / temperature as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut keep = Vec::new();
        let mut mass = 0.0;
        for &i in &order {
            keep.push(i);
            mass += p[i];
            if mass >= top_p as f64 - 1e-7 {
                break;
            }
        }
        let kept: f64 = keep.iter().map(|&i| p[i]).sum();
        let got = sampler.distribution(&logits);
        assert_eq!(got.len(), logits.len());
        for i in 0..p.len() {
            let expected = if keep.contains(&i) { p[i] / kept } else { 0.0 };
            assert!(
                (got[i] as f64 - expected).abs() < 1e-6,
                "t={temperature} top_p={top_p}: p[{i}] = {} vs {expected}",
                got[i]
            );
        }
        let sum: f64 = got.iter().map(|&v| v as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5);
    }
    let greedy = mtp::Sampler::new(SamplingConfig {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    })
    .unwrap();
    assert!(greedy.is_greedy());
    let g = greedy.distribution(&logits);
    assert_eq!(g[npu_runtime::argmax(&logits)], 1.0);
    assert_eq!(g.iter().filter(|&&v| v > 0.0).count(), 1);
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
