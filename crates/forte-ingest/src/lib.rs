//! `forte ingest`: row-oriented sensor streams into Parquet files at the edge.
//!
//! Acquisition systems emit rows (every sensor sampled at one instant); analysts want columns.
//! Following Karlstetter et al., "Living on the Edge: Efficient Handling of Large Scale Sensor
//! Data" (the edge Parquet paper), each stream scatters its rows into one of two pre-allocated
//! column-major row-group buffers ([`rowgroup`]); a pool of writers hands each full buffer to arrow-rs's low-level column
//! writer, one call per column, with BYTE_STREAM_SPLIT for floats and zstd level 1
//! ([`parquet_file`]); files rotate after N row groups and are published atomically into an
//! outbox as batches that `forte send` picks up. A slow writer slows the stream's reader, which
//! stops reading its socket: back-pressure, never loss ([`stream`]). The wire format and the
//! TCP listener are in [`wire`]; the schema in [`schema`].

pub mod parquet_file;
pub mod rowgroup;
pub mod run;
pub mod schema;
pub mod stream;
pub mod wire;

pub use parquet_file::{Codec, FileOptions};
pub use schema::Schema;
pub use stream::{Ingest, IngestOptions, StreamStats};
