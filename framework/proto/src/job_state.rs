//! Where a detached job is: pending, running, or at its end.

use rkyv::{Archive, Deserialize, Serialize};

/// Where a job is.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its bundle or its first start.
    Pending,
    /// Its actor runs.
    Running,
    /// It reported success.
    Succeeded,
    /// It reported failure, was stopped, or its supervisor gave up.
    Failed,
}

impl JobState {
    /// Its name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// Whether the job is over.
    pub fn is_end(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}
