//! The adaptive draft length on synthetic costs and acceptance: the choice rule
//! (`best_k`), the per-run policy (`AdaptiveK`: probes, shadow probes, decay) and the
//! pass-cost model (`PassCosts`) and its calibration (`calibrate`, `warmed_up`).

mod common;

use mtp::{
    best_k, calibrate, expected_accepted, warmed_up, AcceptanceEstimate, AdaptiveConfig, AdaptiveK,
    PassCosts, WARM_UP_MAX_PASSES, WARM_UP_SETTLED,
};
use npu_runtime::Forward;

/// `[n - 1]`: seconds of an n-row pass, `base + per_row * (n - 1)`, n = 1..=rows.
fn linear(rows: usize, base: f64, per_row: f64) -> Vec<f64> {
    (0..rows).map(|i| base + per_row * i as f64).collect()
}

/// A memory-bound target: an 8-row pass costs 1.35 one-row passes.
fn cheap_rows() -> Vec<f64> {
    linear(16, 0.010, 0.0005)
}

fn policy() -> AdaptiveK {
    AdaptiveK::new(AdaptiveConfig::default())
}

#[test]
fn expected_accepted_is_the_sum_of_prefix_products() {
    let p = [0.5, 0.5, 1.0, 0.0];
    assert_eq!(expected_accepted(&p, 0), 0.0);
    assert_eq!(expected_accepted(&p, 1), 0.5);
    assert_eq!(expected_accepted(&p, 2), 0.75);
    assert_eq!(expected_accepted(&p, 3), 1.0);
    assert_eq!(expected_accepted(&p, 4), 1.0);
    assert_eq!(
        expected_accepted(&p, 6),
        1.0,
        "positions past the estimates count 0"
    );
}

#[test]
fn best_k_maximises_tokens_per_second() {
    let costs = cheap_rows();
    // Perfect acceptance on cheap rows: as many as allowed.
    assert_eq!(best_k(&costs, 0.0, &[1.0; 15], 7, false), 7);
    // Nothing accepted: a plain step.
    assert_eq!(best_k(&costs, 0.0, &[0.0; 15], 7, false), 0);
    // Brute force over k against the formula, on a few settings.
    for (p, draft) in [(0.3, 0.0), (0.6, 0.004), (0.9, 0.02), (0.2, 0.001)] {
        let acc = vec![p; 15];
        let rate = |k: usize| {
            if k == 0 {
                1.0 / costs[0]
            } else {
                (1.0 + expected_accepted(&acc, k)) / (costs[k] + draft)
            }
        };
        let k = best_k(&costs, draft, &acc, 10, false);
        for other in 0..=10 {
            assert!(
                rate(k) >= rate(other),
                "p {p} draft {draft}: k {k} vs {other}"
            );
        }
    }
}

#[test]
fn a_higher_multi_row_cost_lowers_k() {
    let acc = [0.8; 15];
    let flat = best_k(&cheap_rows(), 0.0, &acc, 7, false);
    // Compute-bound: each extra row costs half a one-row pass.
    let steep = best_k(&linear(16, 0.010, 0.005), 0.0, &acc, 7, false);
    assert_eq!(flat, 7);
    assert_eq!(steep, 2);
    // Two rows cost more than two single steps: drafting never pays.
    assert_eq!(best_k(&linear(16, 0.010, 0.011), 0.0, &acc, 7, false), 0);
    // The same through the policy.
    let (mut a, mut b) = (policy(), policy());
    for round in 0..40 {
        // Accepted 0..=7 in turn: conditional acceptance falls from 7/8 to 1/2.
        a.record_round(7, round % 8);
        b.record_round(7, round % 8);
    }
    let ka = a.choose(&cheap_rows(), 0.0, 7, false).k;
    let kb = b.choose(&linear(16, 0.010, 0.008), 0.0, 7, false).k;
    assert!(kb < ka, "steep {kb} vs flat {ka}");
}

#[test]
fn a_costly_draft_makes_plain_steps_pay_and_two_pass_rounds_pay_their_first_pass() {
    let acc = [0.6; 15];
    let costs = cheap_rows();
    assert_eq!(best_k(&costs, 0.0, &acc, 7, false), 4);
    // A draft round costing 60% of a pass: only the longer rounds still pay for it.
    assert_eq!(best_k(&costs, 0.006, &acc, 7, false), 5);
    // Five passes' worth: never.
    assert_eq!(best_k(&costs, 0.050, &acc, 7, false), 0);
    // A two-pass round adds a 1-row pass and the token it yields: the same choice as a
    // one-pass round whenever that round pays, never a worse one.
    let two = best_k(&costs, 0.0, &acc, 7, true);
    assert!(two > 0);
}

#[test]
fn k_never_exceeds_the_cap() {
    let mut state = 99u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    for cap in 0..12 {
        for _ in 0..50 {
            let costs: Vec<f64> = (0..16).map(|i| 0.01 + next() * 0.002 * i as f64).collect();
            let acc: Vec<f64> = (0..16).map(|_| next()).collect();
            let k = best_k(&costs, next() * 0.001, &acc, cap, false);
            assert!(k <= cap, "cap {cap}: k {k}");
        }
        let mut p = policy();
        for _ in 0..30 {
            p.record_round(cap, cap);
            assert!(p.choose(&cheap_rows(), 0.0, cap, false).k <= cap);
        }
    }
    // Perfect acceptance reaches the cap; a cost table shorter than cap + 1 rows bounds k.
    let mut p = policy();
    for _ in 0..30 {
        p.record_round(5, 5);
    }
    assert_eq!(p.choose(&cheap_rows(), 0.0, 5, false).k, 5);
    assert_eq!(best_k(&cheap_rows()[..4], 0.0, &[1.0; 15], 9, false), 3);
}

/// An expensive drafter (no shadow probes): nil acceptance drives k to 0; paid
/// probes come after `probe_after` plain steps, then twice as far apart while they fail.
#[test]
fn k_falls_to_zero_when_nothing_is_accepted_and_probes_back_off() {
    let costs = cheap_rows();
    let draft = 0.002; // a fifth of a pass: no shadow probes
    let mut p = policy();
    let first = p.choose(&costs, draft, 7, false);
    assert!(first.k > 0, "the prior drafts at first");
    p.record_round(first.k, 0);
    let mut ks = Vec::new();
    for _ in 0..20 {
        let c = p.choose(&costs, draft, 7, false);
        if c.k > 0 {
            p.record_round(c.k, 0);
        }
        ks.push(c.k);
    }
    let settled = ks.iter().rposition(|&k| k > 1).map_or(0, |i| i + 1);
    assert!(settled < 10, "k still above 1 late: {ks:?}");
    // From then on: plain steps and 1-draft probes, spaced 8, 16, 32, 64, 64 apart.
    let mut gaps = Vec::new();
    let mut since = 0;
    for _ in 0..300 {
        let c = p.choose(&costs, draft, 7, false);
        assert!(!c.shadow);
        since += 1;
        if c.k > 0 {
            assert!(c.probe && c.k == 1, "{c:?}");
            p.record_round(1, 0);
            gaps.push(since);
            since = 0;
        }
    }
    assert!(gaps.len() >= 5, "{gaps:?}");
    let tail = &gaps[gaps.len() - 5..];
    assert!(tail.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
    assert_eq!(*gaps.last().unwrap(), 64, "{gaps:?}");
}

#[test]
fn drafting_returns_when_acceptance_recovers() {
    let costs = cheap_rows();
    for (draft, shadow) in [(0.002, false), (0.00001, true)] {
        let mut p = policy();
        for _ in 0..40 {
            p.record_round(4, 0);
        }
        assert_eq!(p.choose(&costs, draft, 7, false).k, 0);
        // The text turns predictable: every draft would be accepted.
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 60, "drafting did not resume (draft cost {draft})");
            let c = p.choose(&costs, draft, 7, false);
            if c.k == 0 {
                assert_eq!(c.shadow, shadow);
                if c.shadow {
                    p.record_shadow(true);
                }
                continue;
            }
            p.record_round(c.k, c.k);
            if c.k >= 4 && !c.probe {
                break;
            }
        }
        // It stays there.
        for _ in 0..20 {
            let c = p.choose(&costs, draft, 7, false);
            assert!(c.k >= 4, "{c:?}");
            p.record_round(c.k, c.k);
        }
    }
}

#[test]
fn acceptance_estimate_is_conditional_and_decays() {
    let mut e = AcceptanceEstimate::new(0.5, 0.5);
    assert_eq!(e.estimates(2), vec![0.5, 0.5]);
    // 3 drafted, 1 accepted: position 0 accepted, 1 rejected, 2 never reached.
    e.record(3, 1);
    let p = e.estimates(3);
    assert_eq!(p[0], (1.0 + 0.5) / (1.0 + 1.0));
    assert_eq!(p[1], (0.0 + p[0]) / (1.0 + 1.0));
    assert_eq!(p[2], p[1], "unreached: leans on the position before");
    // Decay: old rejections fade under new acceptances.
    let mut d = AcceptanceEstimate::new(0.5, 0.5);
    let mut keep = AcceptanceEstimate::new(1.0, 0.5);
    for _ in 0..10 {
        d.record(1, 0);
        keep.record(1, 0);
    }
    for _ in 0..4 {
        d.record(1, 1);
        keep.record(1, 1);
    }
    assert!(d.estimates(1)[0] > 0.78, "{:?}", d.estimates(1));
    assert!(keep.estimates(1)[0] < 0.35, "{:?}", keep.estimates(1));
}

#[test]
fn pass_costs_interpolate_and_follow_timings() {
    assert_eq!(PassCosts::new().cost(3), None);
    assert_eq!(PassCosts::new().table(3), vec![1.0; 3]);
    let mut c = PassCosts::from_points(&[(1, 0.010), (4, 0.016), (8, 0.020)]);
    assert_eq!(c.cost(1), Some(0.010));
    assert!((c.cost(2).unwrap() - 0.012).abs() < 1e-12);
    assert!((c.cost(6).unwrap() - 0.018).abs() < 1e-12);
    assert!(
        (c.cost(10).unwrap() - 0.022).abs() < 1e-12,
        "the last slope"
    );
    assert_eq!(PassCosts::from_points(&[(4, 0.02)]).cost(1), Some(0.005));
    assert_eq!(PassCosts::from_points(&[(4, 0.02)]).cost(9), Some(0.02));
    // A falling pair never extrapolates below the last point.
    assert_eq!(
        PassCosts::from_points(&[(2, 0.03), (3, 0.02)]).cost(7),
        Some(0.02)
    );
    // A slower timing moves the estimate a tenth of the way (a stall counts as 2x at
    // most), a faster one three tenths.
    c.record(4, 0.026);
    assert!((c.cost(4).unwrap() - 0.017).abs() < 1e-12);
    c.record(4, 0.007);
    assert!((c.cost(4).unwrap() - 0.014).abs() < 1e-12);
    c.record(1, 1.0);
    assert!((c.cost(1).unwrap() - 0.011).abs() < 1e-12);
    c.record(2, 0.011);
    assert_eq!(c.cost(2), Some(0.011));
    // The table never charges fewer rows more than more rows.
    let stalled = PassCosts::from_points(&[(1, 0.030), (2, 0.012), (8, 0.020)]);
    assert_eq!(stalled.cost(1), Some(0.030));
    let t = stalled.table(3);
    assert_eq!(t[..2], [0.012, 0.012]);
    assert!((t[2] - (0.012 + 0.008 / 6.0)).abs() < 1e-12, "{t:?}");
    // Out of range or nonsense timings are ignored.
    let before = c.clone();
    c.record(0, 0.1);
    c.record(65, 0.1);
    c.record(3, f64::NAN);
    c.record(3, -1.0);
    assert_eq!(c, before);
}

/// A drafter that is never right and costs 0.4 of a plain step: after it falls to
/// k = 0, its paid probes (the round plus the verify's extra row) cost at most the
/// probe budget (1%) of the time the plain steps between them take.
#[test]
fn probes_of_a_costly_never_right_drafter_stay_within_the_budget() {
    let costs = cheap_rows();
    let draft = 0.004;
    let mut p = policy();
    let (mut plain, mut probing, mut since, mut gaps) = (0.0, 0.0, 0usize, Vec::new());
    for step in 0..2000 {
        let c = p.choose(&costs, draft, 7, false);
        assert!(!c.shadow);
        since += 1;
        if c.k == 0 {
            plain += costs[0];
            continue;
        }
        p.record_round(c.k, 0);
        if step >= 20 {
            assert!(c.probe && c.k == 1, "step {step}: {c:?}");
            probing += draft + costs[1];
            plain += costs[0];
            gaps.push(since);
        }
        since = 0;
    }
    let overhead = (probing - costs[0] * gaps.len() as f64) / plain;
    assert!(!gaps.is_empty(), "the drafter is still probed");
    assert!(
        gaps.iter().skip(1).all(|&g| g >= 45),
        "probes closer than their cost allows: {gaps:?}"
    );
    assert!(
        overhead <= 0.0105,
        "probes cost {overhead:.4} of the time: {gaps:?}"
    );
}

#[test]
fn warm_up_waits_for_the_timings_to_settle() {
    // Too few timings to judge.
    assert!(!warmed_up(&[]));
    assert!(!warmed_up(&[3.0; WARM_UP_SETTLED]));
    // A steady machine settles as soon as there is one pass before the settled ones.
    assert!(warmed_up(&[3.0; WARM_UP_SETTLED + 1]));
    // A cold start (the session-9 Xeon's first 1-row passes, ms): each pass is a new
    // best by more than 5% until the plateau, and the warm-up waits for it.
    let cold = [6.8, 6.0, 5.4, 4.9, 3.7, 3.3, 3.3, 3.3, 3.2];
    let settled_at = (1..=cold.len())
        .find(|&n| warmed_up(&cold[..n]))
        .expect("the plateau settles");
    assert_eq!(
        settled_at, 9,
        "the first 3.3 is a new best (3.7 before it); three passes within 5% follow it"
    );
    assert!(
        !warmed_up(&cold[..8]),
        "3.3 after 3.7 is a new best among the last three: not settled"
    );
    // Noise above the best does not hold the warm-up back; a new best does.
    assert!(warmed_up(&[3.0, 3.6, 3.1, 4.0]));
    assert!(!warmed_up(&[3.0, 3.6, 2.8, 3.0]));
    // Within 5% of the best is no new best.
    assert!(warmed_up(&[3.0, 2.9, 2.9, 2.86]));
}

#[test]
fn calibration_warms_up_then_times_every_row_count_in_interleaved_rounds() {
    let mut target = common::Toy::new(4, 0, 0.0);
    target.forward(&[1, 2, 3, 1, 2]).unwrap();
    target.passes.clear();
    let costs = calibrate(&mut target, 6, 3).unwrap();
    assert_eq!(target.position(), 5, "every pass is rolled back");
    assert_eq!(
        costs.points().iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2, 4, 6]
    );
    // Untimed 1-row passes first, as many as the timings need to settle (at least
    // one before the settled ones, at most the cap) ...
    let rounds = 3 * 4;
    let warm_up = target.passes.len() - rounds;
    assert!(
        (WARM_UP_SETTLED + 1..=WARM_UP_MAX_PASSES).contains(&warm_up),
        "{warm_up} warm-up passes"
    );
    assert!(target.passes[..warm_up].iter().all(|&n| n == 1));
    // ... then three rounds, each over every row count.
    assert_eq!(
        target.passes[warm_up..],
        [1, 2, 4, 6, 1, 2, 4, 6, 1, 2, 4, 6]
    );
}
