//! Adaptive draft length: before each round, the k that maximises expected tokens per
//! second, from what a target pass costs by row count, what a draft round costs, and
//! the acceptance seen so far at each draft position.
//!
//! The parts are separate so tests can feed them synthetic numbers:
//! - [`PassCosts`]: seconds per target pass by row count (calibrated at load with
//!   [`calibrate`], then updated by every pass the run times);
//! - [`AcceptanceEstimate`]: the conditional acceptance at each draft position, with
//!   exponential decay so it follows the text;
//! - [`best_k`]: the pure choice rule;
//! - [`AdaptiveK`]: the per-run state around them (probes while drafting does not pay).

use std::time::Instant;

use npu_runtime::{Forward, TargetError};

/// Row counts past this are not tracked (a verify pass is `k + 1` rows).
pub const MAX_TRACKED_ROWS: usize = 64;

/// Weight of a new timing in the running estimate of a pass cost: timings below the
/// estimate count more than timings above it (a busy machine only ever adds time).
const COST_EMA_DOWN: f64 = 0.3;
const COST_EMA_UP: f64 = 0.1;

/// Seconds per target pass, by row count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassCosts {
    /// `[n - 1]`: the estimate for an n-row pass, once one was timed (or calibrated).
    known: Vec<Option<f64>>,
}

impl PassCosts {
    /// Nothing known yet: every row count costs the same until timed.
    pub fn new() -> PassCosts {
        PassCosts::default()
    }

    /// Costs given outright: `(rows, seconds)` pairs.
    pub fn from_points(points: &[(usize, f64)]) -> PassCosts {
        let mut c = PassCosts::new();
        for &(rows, secs) in points {
            if (1..=MAX_TRACKED_ROWS).contains(&rows) && secs.is_finite() && secs > 0.0 {
                c.slot(rows).replace(secs);
            }
        }
        c
    }

    fn slot(&mut self, rows: usize) -> &mut Option<f64> {
        if self.known.len() < rows {
            self.known.resize(rows, None);
        }
        &mut self.known[rows - 1]
    }

    /// A timed pass of `rows` rows: folded into that row count's running estimate
    /// (slower timings weigh less, and one counts at most 2x the estimate, so a stall
    /// does not swing it).
    pub fn record(&mut self, rows: usize, seconds: f64) {
        if !(1..=MAX_TRACKED_ROWS).contains(&rows) || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let slot = self.slot(rows);
        *slot = Some(match *slot {
            None => seconds,
            Some(old) if seconds < old => old + COST_EMA_DOWN * (seconds - old),
            Some(old) => old + COST_EMA_UP * (seconds.min(2.0 * old) - old),
        });
    }

    /// Row counts with an estimate, and their seconds.
    pub fn points(&self) -> Vec<(usize, f64)> {
        self.known
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.map(|c| (i + 1, c)))
            .collect()
    }

    /// The cost of an n-row pass: the estimate when there is one; otherwise linear
    /// between the nearest known row counts, proportional to the rows below the
    /// smallest (the pessimistic guess, so a run without a calibration soon times a
    /// plain step), and beyond the largest along the slope of the last two (never
    /// falling). `None` when nothing is known.
    pub fn cost(&self, rows: usize) -> Option<f64> {
        let points = self.points();
        let (&first, &last) = (points.first()?, points.last()?);
        if let Some(&(_, c)) = points.iter().find(|p| p.0 == rows) {
            return Some(c);
        }
        if rows < first.0 {
            return Some(first.1 * rows as f64 / first.0 as f64);
        }
        if rows >= last.0 {
            if points.len() < 2 {
                return Some(last.1);
            }
            let before = points[points.len() - 2];
            let slope = ((last.1 - before.1) / (last.0 - before.0) as f64).max(0.0);
            return Some(last.1 + slope * (rows - last.0) as f64);
        }
        let i = points.iter().position(|p| p.0 > rows)?;
        let (a, b) = (points[i - 1], points[i]);
        let t = (rows - a.0) as f64 / (b.0 - a.0) as f64;
        Some(a.1 + t * (b.1 - a.1))
    }

    /// `[n - 1]`: the cost of an n-row pass for n = 1..=max_rows (all 1.0 when
    /// nothing is known: only ratios matter to the choice), never more for fewer rows
    /// (a stale or stalled timing of a small pass is capped by the larger passes).
    pub fn table(&self, max_rows: usize) -> Vec<f64> {
        let mut t: Vec<f64> = (1..=max_rows)
            .map(|n| self.cost(n).unwrap_or(1.0))
            .collect();
        for i in (0..t.len().saturating_sub(1)).rev() {
            t[i] = t[i].min(t[i + 1]);
        }
        t
    }
}

/// Rounds of timed passes a calibration takes by default (each row count keeps its best).
pub const CALIBRATION_ROUNDS: usize = 3;
/// Untimed 1-row passes at most before calibrating, however unsettled the timings.
pub const WARM_UP_MAX_PASSES: usize = 32;
/// Warm-up passes in a row that must bring no new best before timing starts.
pub const WARM_UP_SETTLED: usize = 3;
/// What counts as a new best: a pass this much faster than every one before it.
pub const WARM_UP_GAIN: f64 = 0.05;

/// Whether a series of 1-row pass timings has settled: the last [`WARM_UP_SETTLED`]
/// passes were none of them [`WARM_UP_GAIN`] faster than the best pass before them.
pub fn warmed_up(timings: &[f64]) -> bool {
    if timings.len() <= WARM_UP_SETTLED {
        return false;
    }
    let (before, recent) = timings.split_at(timings.len() - WARM_UP_SETTLED);
    let best = before.iter().copied().fold(f64::INFINITY, f64::min);
    recent.iter().all(|&t| t >= best * (1.0 - WARM_UP_GAIN))
}

/// Times target passes of 1, 2, 4, 8, ... and `max_rows` rows and rolls the target
/// back to where it was; the rows between are interpolated until the run times them.
///
/// The first passes after a load (or a long prefill) are slow: on the session-9 Xeon
/// the first 1-row passes of a process took 5.3–9.5 ms and settled at 3.0 ms over
/// about ten passes, while the weights came back into the cache. Timed then, a 1-row
/// pass looked almost as dear as a 4-row one and the choice of k followed a cost curve
/// that was not there. So 1-row passes run untimed until their timings settle
/// ([`warmed_up`], at most [`WARM_UP_MAX_PASSES`]); then `reps` rounds each time every
/// row count once (interleaved, so drift weighs on all alike) and each keeps its best.
/// Run it before a drafter's layer taps are set: the passes would write tap rows.
pub fn calibrate(
    base: &mut dyn Forward,
    max_rows: usize,
    reps: usize,
) -> Result<PassCosts, TargetError> {
    let start = base.position();
    let token = base.config().bos_token_id.unwrap_or(0);
    let mut rows: Vec<usize> = [1usize, 2, 4, 8, 16, 32, 64]
        .into_iter()
        .filter(|&n| n <= max_rows.min(MAX_TRACKED_ROWS))
        .collect();
    if (1..=MAX_TRACKED_ROWS).contains(&max_rows) && !rows.contains(&max_rows) {
        rows.push(max_rows);
    }
    let mut warm_up = Vec::new();
    while warm_up.len() < WARM_UP_MAX_PASSES && !warmed_up(&warm_up) {
        warm_up.push(timed_pass(base, &[token], start)?);
    }
    let mut best = vec![f64::INFINITY; rows.len()];
    for _ in 0..reps.max(1) {
        for (n, best) in rows.iter().zip(best.iter_mut()) {
            *best = best.min(timed_pass(base, &vec![token; *n], start)?);
        }
    }
    let points: Vec<(usize, f64)> = rows.into_iter().zip(best).collect();
    Ok(PassCosts::from_points(&points))
}

/// Seconds of one pass over `batch`, rolled back to `start` after.
fn timed_pass(base: &mut dyn Forward, batch: &[u32], start: usize) -> Result<f64, TargetError> {
    let t = Instant::now();
    base.forward(batch)?;
    let seconds = t.elapsed().as_secs_f64();
    base.truncate(start)?;
    Ok(seconds)
}

/// Conditional acceptance by draft position: `p[i]` estimates the chance that the
/// draft at position i is accepted given that every draft before it was. Counts decay
/// by `decay` every round, so old text weighs less; a position seldom reached leans on
/// the one before it (and the first on `prior`).
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptanceEstimate {
    reached: Vec<f64>,
    accepted: Vec<f64>,
    decay: f64,
    prior: f64,
    prior_weight: f64,
}

impl AcceptanceEstimate {
    /// An estimate that forgets by `decay` per round and starts every position at `prior`.
    pub fn new(decay: f64, prior: f64) -> AcceptanceEstimate {
        AcceptanceEstimate {
            reached: Vec::new(),
            accepted: Vec::new(),
            decay: decay.clamp(0.0, 1.0),
            prior: prior.clamp(0.0, 1.0),
            prior_weight: 1.0,
        }
    }

    /// A verified round: `drafted` drafts, the first `accepted` of them accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        for (r, a) in self.reached.iter_mut().zip(self.accepted.iter_mut()) {
            *r *= self.decay;
            *a *= self.decay;
        }
        if self.reached.len() < drafted {
            self.reached.resize(drafted, 0.0);
            self.accepted.resize(drafted, 0.0);
        }
        // Positions 0..=accepted were reached (the one at `accepted` was rejected).
        for i in 0..drafted.min(accepted + 1) {
            self.reached[i] += 1.0;
            if i < accepted {
                self.accepted[i] += 1.0;
            }
        }
    }

    /// The estimates for positions 0..n.
    pub fn estimates(&self, n: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(n);
        let mut lean = self.prior;
        for i in 0..n {
            let (r, a) = (
                self.reached.get(i).copied().unwrap_or(0.0),
                self.accepted.get(i).copied().unwrap_or(0.0),
            );
            let p = (a + self.prior_weight * lean) / (r + self.prior_weight);
            out.push(p);
            lean = p;
        }
        out
    }
}

/// Expected accepted drafts when `k` are drafted: the sum over j <= k of the chance
/// that the first j are all accepted.
pub fn expected_accepted(acceptance: &[f64], k: usize) -> f64 {
    let (mut all, mut sum) = (1.0, 0.0);
    for j in 0..k {
        let p = acceptance.get(j).copied().unwrap_or(0.0);
        all *= p.clamp(0.0, 1.0);
        sum += all;
    }
    sum
}

/// The choice rule. `costs[n - 1]` is the seconds of an n-row target pass (n up to at
/// least `cap + 1`), `draft_cost` the seconds of one draft round, `acceptance[i]` the
/// conditional acceptance at draft position i. A round of k drafts costs a (k + 1)-row
/// pass plus the draft (plus a 1-row first pass for two-pass heads) and yields the
/// expected accepted drafts plus the target's own token (plus the first pass's); k = 0
/// is a plain step: one token for one 1-row pass. Returns the k in 0..=cap with the
/// most expected tokens per second (the smallest on a tie).
pub fn best_k(
    costs: &[f64],
    draft_cost: f64,
    acceptance: &[f64],
    cap: usize,
    two_pass: bool,
) -> usize {
    let cost = |rows: usize| -> f64 {
        costs
            .get(rows - 1)
            .or(costs.last())
            .copied()
            .unwrap_or(1.0)
            .max(f64::MIN_POSITIVE)
    };
    let mut best = (0, 1.0 / cost(1));
    let cap = cap.min(costs.len().saturating_sub(1));
    for k in 1..=cap {
        let extra = if two_pass { 1.0 } else { 0.0 };
        let tokens = 1.0 + extra + expected_accepted(acceptance, k);
        let pass = cost(k + 1);
        let seconds = pass + draft_cost.max(0.0) + extra * cost(1);
        let rate = tokens / seconds;
        if rate > best.1 {
            best = (k, rate);
        }
    }
    best.0
}

/// Settings of the adaptive draft length.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveConfig {
    /// Pass costs timed at load ([`calibrate`]); `None`: learnt as the run goes.
    pub calibration: Option<PassCosts>,
    /// Per-round decay of the acceptance counts (0.9: a round 7 rounds back weighs half).
    pub decay: f64,
    /// Acceptance assumed before any evidence.
    pub prior: f64,
    /// Plain steps chosen in a row before a probe (a 1-draft round) tests the text again.
    pub probe_after: usize,
    /// A failed probe doubles the wait before the next, up to this many steps.
    pub probe_max: usize,
    /// The share of the time paid probes may cost a drafter that is never right: the
    /// wait before a probe is at least its cost (the draft round plus the verify
    /// pass's extra row) over this fraction of a plain step, whatever `probe_after`
    /// and `probe_max` say (0: no floor).
    pub probe_budget: f64,
    /// When a draft round costs less than this fraction of a 1-row pass, plain steps
    /// still ask the drafter for one token and compare it with the target's: free
    /// evidence of acceptance (a "shadow" probe).
    pub shadow_below: f64,
}

impl Default for AdaptiveConfig {
    fn default() -> AdaptiveConfig {
        AdaptiveConfig {
            calibration: None,
            decay: 0.9,
            prior: 0.5,
            probe_after: 8,
            probe_max: 64,
            probe_budget: 0.01,
            shadow_below: 0.05,
        }
    }
}

/// What to do this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Drafts to verify (0: a plain step).
    pub k: usize,
    /// A 1-draft round run to test the text although the estimates say it does not pay.
    pub probe: bool,
    /// With k = 0: ask the drafter for one token anyway and compare it after the step.
    pub shadow: bool,
}

/// The per-run state of the adaptive draft length.
#[derive(Clone, Debug)]
pub struct AdaptiveK {
    config: AdaptiveConfig,
    estimate: AcceptanceEstimate,
    /// Plain steps chosen in a row.
    streak: usize,
    /// Plain steps to wait before the next probe.
    gap: usize,
    probing: bool,
    /// The last probe succeeded: the next probes follow at once, not held back by
    /// the probe budget (which is for a drafter that keeps failing).
    recovering: bool,
    /// A probe has failed: from then on the probe budget holds probes back (the first
    /// probe comes after `probe_after` steps whatever it costs: without one, nothing
    /// is ever learnt about the drafter).
    failed_probe: bool,
}

impl AdaptiveK {
    /// Per-run state for `config`, with no costs or acceptance seen yet.
    pub fn new(config: AdaptiveConfig) -> AdaptiveK {
        AdaptiveK {
            estimate: AcceptanceEstimate::new(config.decay, config.prior),
            gap: config.probe_after.max(1),
            streak: 0,
            probing: false,
            recovering: false,
            failed_probe: false,
            config,
        }
    }

    /// The acceptance estimates for positions 0..n.
    pub fn acceptance(&self, n: usize) -> Vec<f64> {
        self.estimate.estimates(n)
    }

    /// The choice for the next round, at most `cap` drafts. `costs[n - 1]`: seconds of
    /// an n-row pass; `draft_cost`: seconds of a draft round.
    pub fn choose(&mut self, costs: &[f64], draft_cost: f64, cap: usize, two_pass: bool) -> Choice {
        let acceptance = self.estimate.estimates(cap);
        let k = best_k(costs, draft_cost, &acceptance, cap, two_pass);
        if k > 0 || cap == 0 {
            self.streak = 0;
            return Choice {
                k,
                probe: false,
                shadow: false,
            };
        }
        let one = costs.first().copied().unwrap_or(1.0);
        if !two_pass && draft_cost < self.config.shadow_below * one {
            // Cheap drafts: every plain step brings evidence; no paid probes needed.
            return Choice {
                k: 0,
                probe: false,
                shadow: true,
            };
        }
        self.streak += 1;
        let floor = match self.failed_probe && !self.recovering {
            true => self.probe_floor(costs, draft_cost),
            false => 0,
        };
        if self.streak >= self.gap.max(floor) {
            self.streak = 0;
            self.probing = true;
            return Choice {
                k: 1,
                probe: true,
                shadow: false,
            };
        }
        Choice {
            k: 0,
            probe: false,
            shadow: false,
        }
    }

    /// Plain steps a probe must wait for its cost to stay within the probe budget: a
    /// 1-draft probe costs the draft round and a 2-row pass instead of a 1-row one.
    fn probe_floor(&self, costs: &[f64], draft_cost: f64) -> usize {
        let one = costs.first().copied().unwrap_or(1.0);
        let extra_row = costs.get(1).map_or(0.0, |two| (two - one).max(0.0));
        let cost = draft_cost.max(0.0) + extra_row;
        let steps = cost / (self.config.probe_budget * one);
        if steps.is_finite() && steps > 0.0 {
            steps.ceil().min(1e6) as usize
        } else {
            0
        }
    }

    /// A verified round (a probe's outcome sets the wait before the next probe: at
    /// once after a success, twice as long after a failure).
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        self.estimate.record(drafted, accepted);
        if std::mem::take(&mut self.probing) {
            self.recovering = accepted > 0;
            self.failed_probe |= accepted == 0;
            self.gap = if accepted > 0 {
                1
            } else {
                (self.gap * 2)
                    .max(self.config.probe_after)
                    .min(self.config.probe_max.max(1))
            };
        }
    }

    /// A shadow probe: the drafter's token did (or did not) equal the target's.
    pub fn record_shadow(&mut self, matched: bool) {
        self.estimate.record(1, matched as usize);
    }

    /// The drafter had nothing to propose this round.
    pub fn record_empty(&mut self) {
        self.probing = false;
    }
}
