//! forte's integration tests, one binary with a module per area: one link for all of them, and
//! the helpers in `common` are shared (an unused one is a warning, not silenced per file).
//!
//! Run one area with `cargo test -p forte --test it tamper::`.

#[macro_use]
mod common;

mod alerts;
mod artefacts;
mod bundles;
mod cli;
mod custody;
mod daemons;
mod dashboard;
mod failfast;
mod faults;
mod filters;
mod history;
mod ingest;
mod interop;
mod load;
mod network;
mod operate;
mod report;
mod resources;
mod rotation;
mod roundtrip;
mod s3;
mod scheduler;
mod startup;
mod tamper;
mod tasks;
mod workers;
