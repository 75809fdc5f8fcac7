//! Admission and sessions: the `--parallel` sessions over the one engine, the FIFO
//! queue of `--q-len` in front of them, and the choice of the session holding the
//! longest prefix of a prompt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onebit_engine::{Engine, EngineError, Session};
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::request::KeepAlive;
use crate::App;

/// The loaded model and its sessions.
pub(crate) struct Ready {
    pub(crate) engine: Arc<Engine>,
    /// `--parallel`: the sessions, and the permits when none is generating.
    pub(crate) parallel: usize,
    pub(crate) permits: Arc<Semaphore>,
    sessions: Mutex<Vec<Session>>,
    /// Size, modification time and a digest-like tag of the package's weights.
    pub(crate) package_bytes: u64,
    pub(crate) modified: String,
    pub(crate) digest: String,
}

impl Ready {
    /// `parallel` sessions over `engine`.
    pub(crate) fn new(engine: Arc<Engine>, parallel: usize) -> Result<Ready, EngineError> {
        let sessions = (0..parallel)
            .map(|_| engine.session())
            .collect::<Result<Vec<_>, _>>()?;
        let (package_bytes, modified, digest) =
            crate::routes::ollama::package_facts(&engine.config().model);
        Ok(Ready {
            parallel,
            permits: Arc::new(Semaphore::new(parallel)),
            sessions: Mutex::new(sessions),
            engine,
            package_bytes,
            modified,
            digest,
        })
    }

    /// The idle session holding the longest prefix of `ids` (the caller holds a permit,
    /// so one is idle).
    pub(crate) fn take_session(&self, ids: &[u32]) -> Session {
        let mut pool = self.sessions.lock().expect("session pool lock poisoned");
        let best = (0..pool.len())
            .max_by_key(|&i| pool[i].reusable(ids))
            .expect("a permit means a session is free");
        pool.swap_remove(best)
    }

    /// A session back into the pool (before its permit is released).
    pub(crate) fn give_back(&self, session: Session) {
        self.sessions
            .lock()
            .expect("session pool lock poisoned")
            .push(session);
    }
}

/// Counts a request waiting for a session while it lives.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Empties the KV caches of the idle sessions and gives their memory back (Ollama's
/// unload, `keep_alive: 0`, and the end of a `keep_alive` idle time); the weights stay.
pub(crate) fn release_idle(ready: &Ready) {
    let mut pool = ready.sessions.lock().expect("session pool lock poisoned");
    for session in pool.iter_mut() {
        session.release();
    }
}

impl Ready {
    /// Bytes the idle sessions' KV caches have allocated (`None` on backends whose
    /// buffers are fixed).
    pub(crate) fn idle_kv_bytes(&self) -> Option<usize> {
        let pool = self.sessions.lock().expect("session pool lock poisoned");
        pool.iter().map(Session::kv_capacity_bytes).sum()
    }
}

/// Ollama's `keep_alive` as an idle timeout: the last one a request gave, and a counter
/// of requests begun and ended (a timer armed at one count is void at another).
#[derive(Default)]
pub(crate) struct IdleTimer {
    after: Option<Duration>,
    epoch: u64,
}

/// A generation begins: any armed timer is void.
pub(crate) fn busy(app: &App) {
    app.idle.lock().expect("idle lock poisoned").epoch += 1;
}

/// A request ended (a generation, or a load call) with `keep_alive` (when it gave one,
/// it becomes the server's: a duration, or kept for ever). With a duration set and no
/// session generating, the idle sessions' KV caches are freed after that long unless a
/// generation begins first.
pub(crate) fn settle(app: &Arc<App>, keep_alive: Option<KeepAlive>) {
    let (after, epoch) = {
        let mut idle = app.idle.lock().expect("idle lock poisoned");
        match keep_alive {
            Some(KeepAlive::Idle(d)) => idle.after = Some(d),
            Some(KeepAlive::Forever) => idle.after = None,
            // Unload frees at once (the caller); the setting stays as it was.
            Some(KeepAlive::Unload) | None => {}
        }
        idle.epoch += 1;
        (idle.after, idle.epoch)
    };
    let (Some(after), Ok(handle)) = (after, tokio::runtime::Handle::try_current()) else {
        return;
    };
    let app = app.clone();
    handle.spawn(async move {
        tokio::time::sleep(after).await;
        let Ok(ready) = app.ready() else { return };
        if app.idle.lock().expect("idle lock poisoned").epoch != epoch
            || ready.permits.available_permits() != ready.parallel
        {
            // A request came since: its end arms the timer again.
            return;
        }
        release_idle(ready);
        app.log(&format!(
            "onebit serve: idle for {:.3} s (keep_alive): the KV caches are freed, the weights stay",
            after.as_secs_f64()
        ));
    });
}

/// A session slot: now, after waiting in the FIFO queue, or 503 when the queue is full.
pub(crate) async fn admit(app: &App) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    let ready = app.ready()?;
    if let Ok(p) = ready.permits.clone().try_acquire_owned() {
        return Ok(p);
    }
    // Reserve a place in the queue, or refuse.
    let mut n = app.waiting.load(Ordering::Acquire);
    loop {
        if n >= app.q_len {
            return Err(ApiError::queue_full(app.q_len));
        }
        match app
            .waiting
            .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(now) => n = now,
        }
    }
    let _waiting = Waiting(&app.waiting);
    ready
        .permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the session pool is closed"))
}
