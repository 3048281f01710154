//! Where a node's control service and its API find the jobs service once
//! the head serves jobs ([`crate::jobs`]): a slot filled once, shared by
//! both.

use std::sync::{Arc, OnceLock};

use flotilla_proto::authority::Unauthorized;
use flotilla_proto::jobs::{JobsReply, JobsRequest};
use futures::future::BoxFuture;

use crate::caller::Caller;

/// What serves jobs requests.
pub(crate) trait ServeJobs: Send + Sync {
    /// Answers one request of `caller` (`None`: the head itself), or
    /// refuses it by the permission table.
    fn request(
        &self,
        caller: Option<Caller>,
        request: JobsRequest,
    ) -> BoxFuture<'_, Result<JobsReply, Unauthorized>>;
}

/// The jobs service, once there is one.
#[derive(Clone, Default)]
pub(crate) struct JobsSlot(Arc<OnceLock<Arc<dyn ServeJobs>>>);

impl JobsSlot {
    /// Fills the slot; false if it was filled already.
    pub(crate) fn set(&self, service: Arc<dyn ServeJobs>) -> bool {
        self.0.set(service).is_ok()
    }

    /// Serves a request of `caller`, or says no service runs.
    pub(crate) async fn request(
        &self,
        caller: &Caller,
        request: JobsRequest,
    ) -> Result<JobsReply, Unauthorized> {
        self.request_as(Some(caller.clone()), request).await
    }

    /// Serves a request of `caller` (`None`: this node), or says no service
    /// runs.
    pub(crate) async fn request_as(
        &self,
        caller: Option<Caller>,
        request: JobsRequest,
    ) -> Result<JobsReply, Unauthorized> {
        match self.0.get() {
            Some(s) => s.request(caller, request).await,
            None => Ok(JobsReply::NotServed),
        }
    }
}
