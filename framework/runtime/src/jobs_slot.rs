//! Where a node's control service and its API find the jobs service once
//! the head serves jobs ([`crate::jobs`]): a slot filled once, shared by
//! both.

use std::sync::{Arc, OnceLock};

use flotilla_proto::jobs::{JobsReply, JobsRequest};
use futures::future::BoxFuture;

/// What serves jobs requests.
pub(crate) trait ServeJobs: Send + Sync {
    /// Answers one request.
    fn request(&self, request: JobsRequest) -> BoxFuture<'_, JobsReply>;
}

/// The jobs service, once there is one.
#[derive(Clone, Default)]
pub(crate) struct JobsSlot(Arc<OnceLock<Arc<dyn ServeJobs>>>);

impl JobsSlot {
    /// Fills the slot; false if it was filled already.
    pub(crate) fn set(&self, service: Arc<dyn ServeJobs>) -> bool {
        self.0.set(service).is_ok()
    }

    /// Serves a request, or says no service runs.
    pub(crate) async fn request(&self, request: JobsRequest) -> JobsReply {
        match self.0.get() {
            Some(s) => s.request(request).await,
            None => JobsReply::NotServed,
        }
    }
}
