//! The edge's prepare path: every source byte is read once and flows, part by part, through
//!
//! ```text
//! read ─▶ hash ─▶ compress ─▶ encrypt ─▶ hash_ciphertext ─▶ seal ─▶ sink
//! ```
//!
//! joined by bounded in-memory queues (see `forte-pipeline`). Nothing intermediate touches
//! disk. A fixed number of *parts in flight* bounds memory whatever the file sizes; a CPU
//! budget bounds how many workers compute at once. The sink decides where sealed parts and
//! manifests go: a directory for `forte pack` ([`DirSink`]), the relay for `forte send`.

mod adapt;
mod bundle;
mod filter;
mod probe;
mod sink;
mod source;
mod stages;

pub use bundle::{bundle_as_before, bundle_small, BundleLimits, BundleMember};
pub use filter::{parse_moment, parse_size as parse_filter_size, Excluded, Filter, FilterSpec};
pub use probe::{probe, Compressibility};
pub use sink::{DirSink, Sink};
pub use source::{discover, Discovery, SourceFile};
pub use stages::{
    FileOutcome, HeldPart, JobQueue, Origin, Prepare, PrepareConfig, PrepareJob, Totals,
};
