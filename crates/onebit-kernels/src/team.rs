//! A persistent thread team for the many small parallel regions of a decode step.
//!
//! A decode step runs ~150 parallel regions of a few microseconds each. A general
//! work-stealing pool lets its idle workers sleep on a futex between them, and waking
//! them costs more than the work. The team's workers instead spin on an epoch counter
//! for a short while after each region (then park), so the next region starts at once.
//! Tasks are claimed from one atomic counter; which thread runs a task never changes
//! its result (every kernel computes an element the same way whatever the split).
//!
//! Kernels call [`parallel_for`]: inside [`Team::install`] it runs on the team, elsewhere
//! on rayon's current pool.
//!
//! One team serves every session of a model: threads that post regions at the same
//! time take turns region by region (the team holds one job at a time), and a task that
//! itself calls [`parallel_for`] runs its inner loop on its own thread.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);
/// Spins of the posting thread, waiting for workers, before it starts yielding its core.
const YIELD_AFTER: u32 = 20_000;

/// A job: `task(i)` for `i` in `0..count`, the closure erased to a raw pointer valid
/// until the posting thread has seen every worker finish.
#[derive(Clone, Copy)]
struct Job {
    task: *const (dyn Fn(usize) + Sync),
    count: usize,
}

// SAFETY: the pointee is `Sync` and outlives every use (see `Team::run`).
unsafe impl Send for Job {}

/// The team's shared state. The counters each thread writes during a region (`next`,
/// `done`) and the one idle workers spin on (`epoch`) live on cache lines of their own,
/// so a claim does not evict the line a waiting worker reads, nor the other way round.
struct Shared {
    epoch: CachePadded<AtomicUsize>,
    next: CachePadded<AtomicUsize>,
    /// Tasks of the current job that have completed (each thread adds its own count
    /// once it finds nothing left to claim).
    done: CachePadded<AtomicUsize>,
    job: Mutex<Option<Job>>,
    /// Whether the current job still accepts workers.
    open: AtomicBool,
    /// Workers inside the current job (they may touch its closure).
    active: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: Mutex<Vec<Thread>>,
    /// Entries in `sleepers` (read without the lock: a post wakes no one when it is 0).
    sleeping: AtomicUsize,
    /// Threads of the team (the caller included), for the size of a claim.
    threads: usize,
}

/// The team: the calling thread plus `threads - 1` workers.
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held by the thread posting a job: the job slot serves one poster at a time.
    posting: Mutex<()>,
}

thread_local! {
    static CURRENT: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is inside [`Team::run`] (a nested region runs here, in order).
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
}

impl Team {
    /// A team of `threads` threads in all (at least 1), named `NAME-i`.
    pub fn new(threads: usize, name: &str) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            next: CachePadded::new(AtomicUsize::new(0)),
            done: CachePadded::new(AtomicUsize::new(0)),
            job: Mutex::new(None),
            open: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: Mutex::new(Vec::new()),
            sleeping: AtomicUsize::new(0),
            threads: threads.max(1),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = shared.clone();
            workers.push(
                thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || worker(&s))?,
            );
        }
        Ok(Team {
            shared,
            workers,
            posting: Mutex::new(()),
        })
    }

    /// Threads in the team, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f` with this team as the one [`parallel_for`] uses on this thread.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        let previous = CURRENT.with(|c| c.replace(self as *const Team));
        struct Restore(*const Team);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(previous);
        f()
    }

    /// `task(i)` for every `i` in `0..count`, spread over the team; returns when all ran.
    ///
    /// # Panics
    /// If a task panicked (on any thread).
    pub fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        if count == 0 {
            return;
        }
        if self.workers.is_empty() || count == 1 || IN_RUN.with(|r| r.get()) {
            (0..count).for_each(task);
            return;
        }
        // A poisoned lock only means another poster's task panicked (and it re-raised
        // that panic itself); the job slot is consistent again once `run` returns.
        let _turn = self.posting.lock().unwrap_or_else(|e| e.into_inner());
        IN_RUN.with(|r| r.set(true));
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                IN_RUN.with(|r| r.set(false));
            }
        }
        let _leave = Leave;
        let s = &*self.shared;
        // SAFETY (lifetime erasure): a worker dereferences the pointer only while it is
        // counted in `active` and saw `open`; this function closes the job and waits for
        // `active` to reach zero before it returns (or unwinds), so no use outlives `task`.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute(task as *const (dyn Fn(usize) + Sync)) };
        *s.job.lock().expect("team job lock") = Some(Job {
            task: erased,
            count,
        });
        s.next.store(0, Ordering::SeqCst);
        s.done.store(0, Ordering::SeqCst);
        s.open.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        // A worker registers in `sleeping` before its last look at `epoch` (both SeqCst),
        // so either it sees this epoch and does not park, or this load sees it.
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let mut sleepers = s.sleepers.lock().expect("team sleepers lock");
            s.sleeping.store(0, Ordering::SeqCst);
            for sleeper in sleepers.drain(..) {
                sleeper.unpark();
            }
        }
        // The caller works too; tasks no worker took are all run here, so an idle or
        // descheduled worker never holds the caller up.
        let mine = catch_unwind(AssertUnwindSafe(|| claim(s, task, count)));
        wait_until(|| s.done.load(Ordering::Acquire) >= count);
        // Close the job, then wait for workers still inside it (they can only be
        // finishing their claim loop: every task is done).
        s.open.store(false, Ordering::SeqCst);
        wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        *s.job.lock().expect("team job lock") = None;
        if mine.is_err() || s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a parallel task panicked");
        }
    }
}

/// Spins, then yields the core, until `ready()`.
fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        spins += 1;
        if spins < YIELD_AFTER {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

/// Claims and runs tasks until none are left, counting each as done (a panicking task
/// too, after noting the panic, so the caller never waits for it).
///
/// Claims are guided: a run of `left / (2 · threads)` consecutive tasks (at least one),
/// so each thread works through long contiguous stretches of a matrix first (one
/// sequential stream per core for the prefetchers, few contended atomics) and the runs
/// shrink toward single tasks at the end, which keeps the threads' finish times close.
/// Which thread runs a task never changes its result.
fn claim(s: &Shared, task: &(dyn Fn(usize) + Sync), count: usize) {
    let threads = s.threads;
    // Counted here and added once at the end: one contended write per thread and region.
    let mut ran = 0;
    loop {
        let first = s.next.load(Ordering::Relaxed);
        if first >= count {
            if ran > 0 {
                s.done.fetch_add(ran, Ordering::Release);
            }
            return;
        }
        let run = ((count - first) / (2 * threads)).max(1);
        if s.next
            .compare_exchange_weak(first, first + run, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        for i in first..first + run {
            if catch_unwind(AssertUnwindSafe(|| task(i))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        ran += run;
    }
}

fn worker(s: &Shared) {
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            // Read the clock only now and then (it is not free), and yield now and then
            // so a loaded machine can run the thread the caller waits for.
            if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
                if spins.is_multiple_of(4096) {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            {
                let mut sleepers = s.sleepers.lock().expect("team sleepers lock");
                sleepers.push(thread::current());
                s.sleeping.store(sleepers.len(), Ordering::SeqCst);
            }
            // Re-check after registering, so a post between the check and the push is
            // not missed (unpark before park makes park return at once). SeqCst, as the
            // poster's epoch increment and its load of `sleeping` are.
            if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::Acquire) {
                thread::park_timeout(Duration::from_millis(50));
            }
        }
        seen = s.epoch.load(Ordering::SeqCst);
        // Enter, then check the job is still open: the caller closes it and then waits
        // for `active` to drain, so either it sees us here or we see it closed.
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) && s.epoch.load(Ordering::SeqCst) == seen {
            let job = *s.job.lock().expect("team job lock");
            if let Some(job) = job {
                // SAFETY: see `Team::run`: the job is open and we are counted in `active`.
                let task = unsafe { &*job.task };
                claim(s, task, job.count);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for sleeper in self
            .shared
            .sleepers
            .lock()
            .expect("team sleepers lock")
            .drain(..)
        {
            sleeper.unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// `task(i)` for `i` in `0..count` in parallel: on the team installed on this thread
/// ([`Team::install`]), or else on rayon's current pool.
pub fn parallel_for(count: usize, task: &(dyn Fn(usize) + Sync)) {
    let team = CURRENT.with(|c| c.get());
    if team.is_null() {
        use rayon::prelude::*;
        (0..count).into_par_iter().for_each(task);
    } else {
        // SAFETY: `install` keeps the team alive and restores the pointer on exit.
        unsafe { &*team }.run(count, task);
    }
}

/// Threads [`parallel_for`] runs on here: the installed team's, else rayon's current pool's.
pub fn current_threads() -> usize {
    let team = CURRENT.with(|c| c.get());
    if team.is_null() {
        rayon::current_num_threads()
    } else {
        // SAFETY: `install` keeps the team alive and restores the pointer on exit.
        unsafe { &*team }.threads()
    }
}

/// Splits `data` into chunks of `chunk` values and runs `task(index, chunk)` on each in
/// parallel ([`parallel_for`]).
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    task: impl Fn(usize, &mut [T]) + Sync,
) {
    let count = data.len().div_ceil(chunk.max(1));
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    parallel_for(count, &|i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: chunks are disjoint ranges of `data`, each handed to one task once,
        // and `data` is borrowed mutably for the whole call.
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        task(i, part);
    });
}

/// One task's share of a row-major matrix: columns `start .. end` of every row. Tasks of
/// [`for_each_column_block`] get disjoint column ranges, so each can write its outputs
/// for every input row straight into the result (no scratch, no transpose).
pub struct ColumnBlock<'a, T> {
    base: *mut T,
    rows: usize,
    stride: usize,
    start: usize,
    end: usize,
    _data: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> ColumnBlock<'_, T> {
    /// Rows of the matrix (every one is in the share).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns in the share (the last share of a matrix may be narrower).
    pub fn width(&self) -> usize {
        self.end - self.start
    }

    /// Columns `from .. to` of this share (clipped to its width) as a share of their own,
    /// borrowed from this one.
    pub fn columns(&mut self, from: usize, to: usize) -> ColumnBlock<'_, T> {
        let start = (self.start + from).min(self.end);
        ColumnBlock {
            base: self.base,
            rows: self.rows,
            stride: self.stride,
            start,
            end: (self.start + to).clamp(start, self.end),
            _data: std::marker::PhantomData,
        }
    }

    /// The share's columns of row `i`.
    ///
    /// # Panics
    /// If `i` is not a row of the matrix.
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        assert!(i < self.rows, "team: row {i} of a {}-row matrix", self.rows);
        // SAFETY: `i · stride + end <= rows · stride = data.len()`; the range lies in
        // this share, which no other task touches, and `&mut self` keeps this slice
        // unique within the task.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.add(i * self.stride + self.start),
                self.end - self.start,
            )
        }
    }
}

/// Splits the columns of the row-major matrix `data` (rows of `stride` values) into
/// shares of `width` columns and runs `task(index, share)` on each in parallel
/// ([`parallel_for`]).
///
/// # Panics
/// If `stride` is 0 or `data.len()` is not a multiple of `stride`.
pub fn for_each_column_block<T: Send>(
    data: &mut [T],
    stride: usize,
    width: usize,
    task: impl Fn(usize, ColumnBlock<'_, T>) + Sync,
) {
    assert!(
        stride > 0 && data.len().is_multiple_of(stride),
        "team: {} values are not rows of {stride}",
        data.len()
    );
    let width = width.max(1);
    let rows = data.len() / stride;
    let count = stride.div_ceil(width);
    let base = SendPtr(data.as_mut_ptr());
    parallel_for(count, &|b| {
        let start = b * width;
        task(
            b,
            ColumnBlock {
                base: base.get(),
                rows,
                stride,
                start,
                end: (start + width).min(stride),
                _data: std::marker::PhantomData,
            },
        );
    });
}

struct SendPtr<T>(*mut T);
impl<T> SendPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}
// SAFETY: used only to hand disjoint sub-slices of a `&mut [T: Send]` to tasks.
unsafe impl<T: Send> Sync for SendPtr<T> {}
unsafe impl<T: Send> Send for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_once_on_the_team_and_off_it() {
        let team = Team::new(2, "test").unwrap();
        for round in 0..200 {
            let count = round % 37;
            let hits: Vec<AtomicU64> = (0..count).map(|_| AtomicU64::new(0)).collect();
            team.install(|| {
                parallel_for(count, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                })
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            if round % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2)); // let workers park
            }
        }
        let mut data = vec![0u32; 100];
        team.install(|| {
            for_each_chunk(&mut data, 7, |i, c| {
                c.iter_mut().for_each(|v| *v = i as u32)
            })
        });
        assert!(data.iter().enumerate().all(|(j, &v)| v == (j / 7) as u32));
        let mut off = vec![0u32; 10];
        for_each_chunk(&mut off, 3, |i, c| c.fill(i as u32 + 1));
        assert_eq!(off, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
    }

    #[test]
    fn column_blocks_cover_every_element_once_on_the_team_and_off_it() {
        let team = Team::new(2, "test").unwrap();
        for (rows, stride, width) in [(1, 7, 3), (5, 64, 32), (3, 50, 16), (4, 9, 20), (2, 5, 1)] {
            let mut data = vec![0u32; rows * stride];
            let fill = |b: usize, mut share: ColumnBlock<'_, u32>| {
                assert_eq!(share.rows(), rows);
                // In two narrower shares, the second possibly empty.
                let half = share.width().div_ceil(2);
                for (from, to) in [(0, half), (half, width)] {
                    let mut part = share.columns(from, to);
                    for i in 0..rows {
                        for (c, v) in part.row_mut(i).iter_mut().enumerate() {
                            *v += (i * stride + b * width + from + c) as u32 + 1;
                        }
                    }
                }
            };
            team.install(|| for_each_column_block(&mut data, stride, width, fill));
            let expect: Vec<u32> = (1..=rows * stride).map(|v| v as u32).collect();
            assert_eq!(data, expect, "{rows}×{stride} in shares of {width}");
            data.fill(0);
            for_each_column_block(&mut data, stride, width, fill);
            assert_eq!(
                data, expect,
                "{rows}×{stride} in shares of {width}, off the team"
            );
        }
    }

    #[test]
    #[should_panic(expected = "team: 10 values are not rows of 4")]
    fn column_blocks_refuse_a_matrix_of_partial_rows() {
        for_each_column_block(&mut [0u8; 10], 4, 2, |_, _| {});
    }

    #[test]
    #[should_panic(expected = "team: row 3 of a 3-row matrix")]
    fn a_column_block_refuses_a_row_past_the_matrix() {
        for_each_column_block(&mut [0u8; 12], 4, 2, |_, mut share| {
            share.row_mut(3);
        });
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_team_survives() {
        let team = Team::new(2, "test").unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.install(|| parallel_for(8, &|i| assert!(i != 5, "task 5")))
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        team.install(|| {
            parallel_for(8, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn posters_on_several_threads_share_one_team_and_nested_regions_run_inline() {
        let team = Team::new(2, "test").unwrap();
        std::thread::scope(|scope| {
            for poster in 0..3u64 {
                let team = &team;
                scope.spawn(move || {
                    for round in 0..300u64 {
                        let count = (round % 23) as usize + 2;
                        let hits: Vec<AtomicU64> = (0..count).map(|_| AtomicU64::new(0)).collect();
                        team.install(|| {
                            parallel_for(count, &|i| {
                                // A nested region: must not deadlock on the posting turn.
                                parallel_for(2, &|_| {
                                    hits[i].fetch_add(poster + 1, Ordering::Relaxed);
                                });
                            })
                        });
                        assert!(hits
                            .iter()
                            .all(|h| h.load(Ordering::Relaxed) == 2 * (poster + 1)));
                    }
                });
            }
        });
    }
}
