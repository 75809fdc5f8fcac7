//! Admission and sessions: the `--parallel` sessions over the one engine, the FIFO
//! queue of `--q-len` in front of them, and the choice of the session holding the
//! longest prefix of a prompt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use onebit_engine::{Engine, EngineError, Session};
use tokio::sync::Semaphore;

use crate::error::ApiError;
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

/// Empties the KV caches of the idle sessions (Ollama's unload, `keep_alive: 0`).
pub(crate) fn forget_prompts(ready: &Ready) {
    let mut pool = ready.sessions.lock().expect("session pool lock poisoned");
    for session in pool.iter_mut() {
        session.reset();
    }
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
