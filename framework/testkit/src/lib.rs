//! Flotilla's test kit: what tests, examples and benches share.
//!
//! ```text
//! corpus   a synthetic English-like corpus, the same on every machine
//! rng      a seeded generator, the same on every machine
//! sim      the control plane's proto machines on a virtual clock, with faults
//! ```

pub mod corpus;
pub mod rng;
pub mod sim;
