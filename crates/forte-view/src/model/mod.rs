//! The API's answers, built from catalogue rows and the daemon's live counters: what
//! docs/api.md documents, field by field. They are types of their own rather than the
//! catalogue's rows serialised: the API is versioned, so a column renamed or added in the
//! catalogue must not change an answer, and its names follow the API's conventions (`_us` for
//! times).
//!
//! By job: `batch` (a batch as the API shows it: how far it has come, its rate and ETA, read
//! from its rows), `eta` (the ETAs of a node's running batches, from its rate and the batches
//! served before each), `records` (files, stages, failures, parts, events and usage as the API
//! shows them; one batch whole, one file's lineage), `reads` (the lists over every catalogue),
//! `phase` (one batch across the catalogues: where it is on its way), `overview` (the front page in one answer) and `alerts` (what needs a look).

mod alerts;
mod batch;
mod eta;
mod overview;
mod phase;
mod reads;
mod records;

pub use alerts::{Alert, AlertLevel, FILL_CRITICAL, FILL_WARNING};
pub use batch::{running, Batch, RUNNING};
pub use eta::{Order, Progress, PUBLISHED_FRESH_US, PUBLISH_EVERY, RATE_WINDOW_US};
pub use overview::{Overview, Totals};
pub use phase::Phase;
pub use reads::{batch, batches, day_ago, failures, files, hour_ago, usage};
pub use records::{
    BatchDetail, EventView, FailureView, File, Lineage, PartView, ReceiptView, StageSpan, UsageView,
};

/// An hour in µs: how long a batch held back stays an alert, and how far back usage is read
/// unless asked otherwise.
const HOUR_US: i64 = 3_600 * 1_000_000;
