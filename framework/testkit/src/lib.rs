//! Flotilla's test kit: what tests, examples and benches share.
//!
//! ```text
//! ca       throw-away cluster certificates, free loopback addresses
//! cluster  real `node` processes: scratch folders, spawn, kill, status, eventually
//! netns    real partitions: nodes in network namespaces on a bridge, links cut and healed
//! probe    echo and relay actors (the `test-node` binary registers them)
//! corpus   a synthetic English-like corpus, the same on every machine
//! rng      a seeded generator, the same on every machine
//! s3       an S3-compatible server on loopback, for leases and object-store data
//! sim      the control plane's proto machines on a virtual clock, with faults
//! units    systemd units: their settings, example configuration, and the sandbox they describe
//! ```

#![warn(clippy::too_many_lines)]

pub mod ca;
pub mod cluster;
pub mod corpus;
pub mod fleet;
pub mod netns;
pub mod probe;
pub mod rng;
pub mod s3;
pub mod sim;
pub mod units;
