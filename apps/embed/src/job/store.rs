//! Object stores named by URL, for the job's input and output alike: the
//! runtime's (checkpoints use the same).

pub(crate) use flotilla::object_url::{is_url, open_url};
