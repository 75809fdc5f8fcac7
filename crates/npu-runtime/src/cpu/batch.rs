//! Passes shared across sessions: continuous batching on the CPU backend.
//!
//! A pass streams every weight once whatever its rows, so rows are cheap next to
//! passes: four sessions decoding one token each cost far less as one 4-row pass than
//! as four 1-row passes. A [`PassBatcher`] gathers the rows its member sessions submit
//! (a decode token, a speculative block, a prefill chunk), runs them as one
//! [`CpuModel::pass`] on the thread of whichever session completes the gathering, and
//! hands each session its own logits.
//!
//! **Same answers as alone.** Every kernel of the pass is batch invariant and rope, the
//! KV append and attention run per session against its own cache, so a session's
//! logits are bit for bit those of the same rows run alone: which sessions share a
//! pass, and when a pass runs, changes speed only, never a token.
//!
//! **When a pass runs.** As soon as every member is waiting (each member submits once
//! per step, so waiting longer gains nothing), or when the first waiting session has
//! waited [`PassBatcher::linger`] (a member busy elsewhere, e.g. drafting, does not
//! stall the others longer than that). Sessions are members while they generate
//! ([`PassBatcher::member`]); a member that finishes, fails or is cancelled leaves when
//! its [`Membership`] drops, so the others stop waiting for it at once. A session that
//! submits without being a member (a one-off pass) is run at the next opportunity.
//!
//! The session's state (KV cache, taps) moves into the batcher for the pass and back, so
//! no pass ever sees a session's state while its own thread does.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{CpuModel, PassPart, SessionState};
use crate::error::{Result, TargetError};
use crate::profile::Clock;

/// How long the first waiting session waits for the other members by default: a few
/// decode passes' worth, far above the host work between a member's passes (picking a
/// token, detokenizing: tens of microseconds), so it only ever bounds a member that is
/// busy elsewhere.
pub const DEFAULT_LINGER: Duration = Duration::from_millis(5);

/// Counters of the passes a batcher ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Passes run.
    pub passes: u64,
    /// Session parts in them (a pass of three sessions counts three).
    pub parts: u64,
    /// Rows in them.
    pub rows: u64,
    /// The most sessions one pass held.
    pub widest: usize,
}

/// One session's submitted rows, its state moved in with them.
struct Job {
    id: u64,
    state: SessionState,
    tokens: Vec<u32>,
    all_logits: bool,
}

#[derive(Default)]
struct Queue {
    /// Sessions inside a generation (live [`Membership`]s).
    members: usize,
    /// Submitted, not yet in a pass.
    waiting: Vec<Job>,
    /// When the oldest waiting job came.
    first_wait: Option<Instant>,
    /// A pass is running (its leader released the lock).
    running: bool,
    /// Finished jobs, each taken back by its own session.
    done: Vec<(u64, SessionState, Result<Vec<f32>>)>,
    next_id: u64,
    stats: BatchStats,
}

/// Gathers the member sessions' rows into shared passes over one [`CpuModel`]; see the
/// module docs. Sessions join with [`CpuTarget::join`](super::CpuTarget::join).
pub struct PassBatcher {
    model: Arc<CpuModel>,
    linger: Duration,
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// A session's membership of a [`PassBatcher`] while it generates: the batcher waits
/// for its rows before running a pass. Dropping it leaves (and wakes the waiting
/// sessions, which no longer wait for this one).
pub struct Membership {
    batcher: Arc<PassBatcher>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut q = self.batcher.lock();
        q.members = q.members.saturating_sub(1);
        self.batcher.changed.notify_all();
    }
}

impl PassBatcher {
    /// A batcher over `model` whose first waiting session waits at most `linger` for
    /// the other members.
    pub fn new(model: Arc<CpuModel>, linger: Duration) -> Arc<PassBatcher> {
        Arc::new(PassBatcher {
            model,
            linger,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        })
    }

    /// The model its passes run.
    pub fn model(&self) -> &Arc<CpuModel> {
        &self.model
    }

    /// The longest the first waiting session waits for the other members.
    pub fn linger(&self) -> Duration {
        self.linger
    }

    /// Enters a generating session: passes wait for its rows until the returned
    /// membership drops.
    pub fn member(self: &Arc<Self>) -> Membership {
        self.lock().members += 1;
        Membership {
            batcher: self.clone(),
        }
    }

    /// Sessions currently members.
    pub fn members(&self) -> usize {
        self.lock().members
    }

    /// What the batcher ran so far.
    pub fn stats(&self) -> BatchStats {
        self.lock().stats
    }

    /// A poisoned lock only means a thread panicked while holding it; the queue's
    /// fields are each left consistent, so the batcher goes on.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `tokens` for the session whose state is `state` in the next shared pass and
    /// returns its logits (all rows', or the last row's), as a pass of its own would.
    pub(crate) fn submit(
        &self,
        state: &mut SessionState,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>> {
        let mut q = self.lock();
        let id = q.next_id;
        q.next_id += 1;
        q.waiting.push(Job {
            id,
            state: std::mem::replace(state, SessionState::away()),
            tokens: tokens.to_vec(),
            all_logits,
        });
        q.first_wait.get_or_insert_with(Instant::now);
        self.changed.notify_all();
        loop {
            if let Some(at) = q.done.iter().position(|d| d.0 == id) {
                let (_, back, answer) = q.done.swap_remove(at);
                *state = back;
                return answer;
            }
            if q.running || q.waiting.is_empty() {
                // Our job is in the running pass; its leader wakes us.
                q = self.changed.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Not running and not done: our job is still waiting.
            let waited = q.first_wait.map_or(Duration::ZERO, |t| t.elapsed());
            if q.waiting.len() < q.members.max(1) && waited < self.linger {
                q = self
                    .changed
                    .wait_timeout(q, self.linger - waited)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            let mut jobs = std::mem::take(&mut q.waiting);
            q.first_wait = None;
            q.running = true;
            drop(q);
            let answers = self.run(&mut jobs);
            q = self.lock();
            q.running = false;
            let stats = &mut q.stats;
            stats.passes += 1;
            stats.parts += jobs.len() as u64;
            stats.rows += jobs.iter().map(|j| j.tokens.len() as u64).sum::<u64>();
            stats.widest = stats.widest.max(jobs.len());
            for (job, answer) in jobs.into_iter().zip(answers) {
                q.done.push((job.id, job.state, answer));
            }
            self.changed.notify_all();
        }
    }

    /// One pass over `jobs` inside the team, timed into the first job's profile. A
    /// panic inside it becomes every job's error (the sessions reset on errors), so no
    /// waiting session is left without an answer.
    fn run(&self, jobs: &mut [Job]) -> Vec<Result<Vec<f32>>> {
        let model = &*self.model;
        let count = jobs.len();
        let pass = AssertUnwindSafe(|| {
            model.team.install(|| {
                let profile = jobs[0].state.profile.take();
                let mut clock = Clock::new(profile.map(|p| *p));
                let mut parts: Vec<PassPart<'_>> = jobs
                    .iter_mut()
                    .map(|j| PassPart {
                        state: &mut j.state,
                        tokens: &j.tokens,
                        all_logits: j.all_logits,
                    })
                    .collect();
                let answers = model.pass(&mut parts, &mut clock);
                let counted = answers.iter().any(|a| a.is_ok());
                parts[0].state.profile = clock.finish(counted).map(Box::new);
                answers
            })
        });
        catch_unwind(pass).unwrap_or_else(|_| {
            (0..count)
                .map(|_| {
                    Err(TargetError::Unsupported(
                        "cpu: a shared pass panicked; its sessions are reset".into(),
                    ))
                })
                .collect()
        })
    }
}
