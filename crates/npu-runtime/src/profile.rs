//! Where a CPU pass's time goes: the stages of [`crate::CpuTarget`]'s forward, timed when
//! a session asks for it ([`crate::CpuTarget::set_profiling`]). `onebit bench --profile`
//! prints them for passes of 1, 2, 4, 8 and 16 rows. A pass that is not profiled reads
//! no clock.

use std::time::{Duration, Instant};

/// One stage of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The token embeddings.
    Embed,
    /// RMS norms before attention, before the MLP, and the final one.
    Norms,
    /// Activations quantized for the integer projections.
    Quantize,
    /// The projections' matrix products (q/k/v, o, gate/up, down).
    Projections,
    /// Q/K norms and rotary embeddings.
    Rope,
    /// Keys and values appended to the cache.
    KvAppend,
    /// Attention over the cache.
    Attention,
    /// The MLP's activation and the stacked outputs split into their parts.
    Activation,
    /// Residual additions.
    Residual,
    /// The head's logits.
    Head,
}

impl Stage {
    /// Every stage, in pass order.
    pub const ALL: [Stage; 10] = [
        Stage::Embed,
        Stage::Norms,
        Stage::Quantize,
        Stage::Projections,
        Stage::Rope,
        Stage::KvAppend,
        Stage::Attention,
        Stage::Activation,
        Stage::Residual,
        Stage::Head,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Embed => "embed",
            Stage::Norms => "norms",
            Stage::Quantize => "quantize",
            Stage::Projections => "projections",
            Stage::Rope => "rope",
            Stage::KvAppend => "kv-append",
            Stage::Attention => "attention",
            Stage::Activation => "activation",
            Stage::Residual => "residual",
            Stage::Head => "head",
        }
    }
}

/// The time of each stage over the passes profiled since the last
/// [`crate::CpuTarget::take_profile`], and the passes' whole time (the difference is
/// everything else: allocation, the team's hand-offs between regions, taps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassProfile {
    stages: [Duration; Stage::ALL.len()],
    total: Duration,
    passes: usize,
}

impl PassProfile {
    /// Time spent in `stage`.
    pub fn stage(&self, stage: Stage) -> Duration {
        self.stages[stage as usize]
    }
    /// The passes' whole time.
    pub fn total(&self) -> Duration {
        self.total
    }
    /// Passes profiled.
    pub fn passes(&self) -> usize {
        self.passes
    }
    /// What no stage accounts for.
    pub fn other(&self) -> Duration {
        self.total
            .saturating_sub(self.stages.iter().sum::<Duration>())
    }
    pub(crate) fn add(&mut self, stage: Stage, time: Duration) {
        self.stages[stage as usize] += time;
    }
    pub(crate) fn add_pass(&mut self, time: Duration) {
        self.total += time;
        self.passes += 1;
    }
}

/// A pass's clock: times stages into a profile when there is one, else reads nothing.
pub(crate) struct Clock {
    profile: Option<PassProfile>,
    /// The profile as it was before the pass, for a pass that does not count.
    before: Option<PassProfile>,
    start: Option<Instant>,
}

impl Clock {
    pub(crate) fn new(profile: Option<PassProfile>) -> Clock {
        let start = profile.as_ref().map(|_| Instant::now());
        Clock {
            before: profile.clone(),
            profile,
            start,
        }
    }

    /// Runs `f`, adding its time to `stage` when profiling.
    #[inline]
    pub(crate) fn time<R>(&mut self, stage: Stage, f: impl FnOnce() -> R) -> R {
        match &mut self.profile {
            None => f(),
            Some(profile) => {
                let start = Instant::now();
                let result = f();
                profile.add(stage, start.elapsed());
                result
            }
        }
    }

    /// Starts timing `stage` (for code a closure cannot hold, such as a call borrowing
    /// the session mutably); [`Clock::stop`] ends it.
    #[inline]
    pub(crate) fn start(&self, stage: Stage) -> Option<(Stage, Instant)> {
        self.profile.as_ref().map(|_| (stage, Instant::now()))
    }

    /// Ends a [`Clock::start`].
    #[inline]
    pub(crate) fn stop(&mut self, started: Option<(Stage, Instant)>) {
        if let (Some(profile), Some((stage, at))) = (&mut self.profile, started) {
            profile.add(stage, at.elapsed());
        }
    }

    /// The profile, if profiling, with this pass counted when `counted` (else as it was
    /// before the pass: a refused pass adds nothing).
    pub(crate) fn finish(self, counted: bool) -> Option<PassProfile> {
        match (self.profile, self.start) {
            (Some(mut profile), Some(start)) if counted => {
                profile.add_pass(start.elapsed());
                Some(profile)
            }
            (Some(_), _) => self.before,
            (None, _) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_without_a_profile_times_nothing_and_one_with_counts_every_stage() {
        let mut off = Clock::new(None);
        assert_eq!(off.time(Stage::Head, || 7), 7);
        assert!(off.finish(true).is_none());

        // A pass that does not count (refused, empty) leaves the profile as it was.
        let mut refused = Clock::new(Some(PassProfile::default()));
        refused.time(Stage::Head, || std::thread::sleep(Duration::from_millis(1)));
        assert_eq!(refused.finish(false), Some(PassProfile::default()));

        let mut on = Clock::new(Some(PassProfile::default()));
        on.time(Stage::Attention, || {
            std::thread::sleep(Duration::from_millis(2))
        });
        on.time(Stage::Head, || ());
        let profile = on.finish(true).unwrap();
        assert_eq!(profile.passes(), 1);
        assert!(profile.stage(Stage::Attention) >= Duration::from_millis(2));
        assert_eq!(profile.stage(Stage::Norms), Duration::ZERO);
        assert!(profile.total() >= profile.stage(Stage::Attention));
        assert_eq!(
            profile.other(),
            profile.total() - profile.stage(Stage::Attention) - profile.stage(Stage::Head)
        );
    }
}
