//! The tasks one cohort spawned, so that shutting it down stops all of them.

use std::future::Future;
use std::sync::Mutex;

use tokio::task::AbortHandle;

#[derive(Default)]
pub(crate) struct Tasks {
    inner: Mutex<TasksInner>,
}

#[derive(Default)]
struct TasksInner {
    closed: bool,
    handles: Vec<AbortHandle>,
}

impl Tasks {
    /// Spawns `fut`; once [`Tasks::abort_all`] has run, the task is aborted at once.
    pub(crate) fn spawn<F>(&self, fut: F) -> AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(fut).abort_handle();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.closed {
            handle.abort();
        } else {
            if inner.handles.len() >= 64 {
                inner.handles.retain(|h| !h.is_finished());
            }
            inner.handles.push(handle.clone());
        }
        handle
    }

    pub(crate) fn abort_all(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.closed = true;
        for h in inner.handles.drain(..) {
            h.abort();
        }
    }
}
