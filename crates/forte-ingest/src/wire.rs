//! The wire format of a stream, and the TCP listener that accepts streams.
//!
//! A stream is one TCP connection (or one recording file). It starts with one ASCII line,
//! `FORTE-INGEST 1 SOURCE\n`, naming the source (`[A-Za-z0-9._-]`, at most 64 characters),
//! then carries rows back to back until the connection closes. A row is the timestamp (int64
//! nanoseconds since the Unix epoch, if the schema has one) followed by each column in schema
//! order, every value little-endian: float32/int32 in 4 bytes, float64/int64 in 8. There is no
//! framing: the schema fixes the row width. A stream that ends inside a row is an error; the
//! rows before it are kept.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::stream::{valid_source, Ingest, StreamStats};

pub const MAGIC: &str = "FORTE-INGEST 1";

/// The first line of a stream from `source`.
pub fn header(source: &str) -> String {
    format!("{MAGIC} {source}\n")
}

/// Reads and checks a stream's first line; returns the source name.
pub fn read_header(input: &mut impl BufRead) -> Result<String> {
    let mut line = Vec::new();
    input
        .take(MAGIC.len() as u64 + 67)
        .read_until(b'\n', &mut line)
        .context("reading the stream's first line")?;
    let Some(line) = line.strip_suffix(b"\n") else {
        bail!("a stream must start with the line `{MAGIC} SOURCE` (and a newline)");
    };
    let line = std::str::from_utf8(line).context("the stream's first line is not UTF-8")?;
    let Some(source) = line.strip_prefix(MAGIC).and_then(|r| r.strip_prefix(' ')) else {
        bail!("a stream must start with `{MAGIC} SOURCE`, not {line:?}");
    };
    valid_source(source)?;
    Ok(source.to_string())
}

/// The source named by a recording's first line, if it starts with one (recordings may be
/// bare rows); the line is consumed, the rows are left.
pub fn read_optional_header(input: &mut impl BufRead) -> Result<Option<String>> {
    if input.fill_buf()?.starts_with(MAGIC.as_bytes()) {
        read_header(input).map(Some)
    } else {
        Ok(None)
    }
}

/// Accepts streams on `listener` forever, each on its own thread, at most `max_streams` at
/// once (each holds two row groups of memory: the cap bounds what connecting clients can make
/// it allocate); `report` gets each one's outcome when it ends.
pub fn serve(
    ingest: Arc<Ingest>,
    listener: TcpListener,
    max_streams: usize,
    report: impl Fn(Result<StreamStats>) + Send + Sync + 'static,
) -> Result<()> {
    let report = Arc::new(report);
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                report(Err(anyhow::Error::from(e).context("accepting a stream")));
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= max_streams {
            let peer = conn
                .peer_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string());
            report(Err(anyhow::anyhow!(
                "refused the stream from {peer}: {max_streams} streams are open (--max-streams)"
            )));
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let (ingest, report, open) = (ingest.clone(), report.clone(), open.clone());
        std::thread::spawn(move || {
            let peer = conn
                .peer_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string());
            let outcome = (|| {
                conn.set_read_timeout(Some(Duration::from_secs(10)))?;
                let mut input = BufReader::with_capacity(1 << 16, conn);
                let source = read_header(&mut input)?;
                // From here a quiet connection only wakes the flush timer.
                input
                    .get_ref()
                    .set_read_timeout(Some(Duration::from_millis(250)))?;
                ingest.stream(&source, &mut input)
            })();
            open.fetch_sub(1, Ordering::SeqCst);
            report(outcome.with_context(|| format!("the stream from {peer}")));
        });
    }
    Ok(())
}
