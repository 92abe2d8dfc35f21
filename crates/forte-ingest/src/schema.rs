//! What a stream's rows hold: an optional timestamp and N typed columns, from a TOML file.
//!
//! ```toml
//! timestamp = "time"          # int64 nanoseconds first in every row; `false` for none
//!
//! [[column]]
//! name = "s"                  # with `count`, the columns are s00, s01, …
//! count = 32
//! type = "float32"            # float32 | float64 | int32 | int64
//! # encoding = "byte_stream_split" is the default for floats; "plain" turns it off
//! # statistics = true          min/max per row group; default only for integers
//! ```
//!
//! The timestamp always has min/max per row group, so readers skip row groups by time. Float
//! columns have none by default: over the tens of thousands of samples of a row group, a noisy
//! sensor's min and max span nearly its whole range and would prune nothing, while computing
//! them costs a pass over every value.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// A value type on the wire (little-endian) and in the Parquet file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Float32,
    Float64,
    Int32,
    Int64,
}

impl Kind {
    /// Bytes of one value.
    pub fn width(self) -> usize {
        match self {
            Kind::Float32 | Kind::Int32 => 4,
            Kind::Float64 | Kind::Int64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Kind::Float32 | Kind::Float64)
    }
}

/// How a column's values are laid out in its pages before the codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Plain,
    /// Byte k of every value into stream k: the bytes that vary little (sign, exponent) end up
    /// together, which the codec compresses far better on noisy sensor values.
    ByteStreamSplit,
    /// For slowly changing integers such as timestamps.
    DeltaBinaryPacked,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub kind: Kind,
    pub encoding: Encoding,
    /// Min/max per row group in the file's metadata.
    pub statistics: bool,
}

/// The fixed layout of a stream's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// Name of the int64 nanosecond timestamp that starts every row, if rows have one.
    pub timestamp: Option<String>,
    pub columns: Vec<Column>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaFile {
    #[serde(default)]
    timestamp: TimestampField,
    #[serde(default)]
    column: Vec<ColumnEntry>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TimestampField {
    Named(String),
    Present(bool),
}

impl Default for TimestampField {
    fn default() -> Self {
        TimestampField::Named("time".into())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnEntry {
    name: String,
    #[serde(rename = "type")]
    kind: Kind,
    count: Option<usize>,
    encoding: Option<Encoding>,
    statistics: Option<bool>,
}

impl Schema {
    /// `count` float32 columns `s00…` after a timestamp `time`: the papers' turbine stream.
    pub fn sensors(count: usize) -> Self {
        Self {
            timestamp: Some("time".into()),
            columns: (0..count)
                .map(|i| Column {
                    name: format!("s{i:02}"),
                    kind: Kind::Float32,
                    encoding: Encoding::ByteStreamSplit,
                    statistics: false,
                })
                .collect(),
        }
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the schema {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in the schema {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let file: SchemaFile = toml::from_str(text)?;
        let timestamp = match file.timestamp {
            TimestampField::Named(name) => Some(name),
            TimestampField::Present(true) => Some("time".into()),
            TimestampField::Present(false) => None,
        };
        let mut columns = Vec::new();
        for entry in file.column {
            let encoding = entry.encoding.unwrap_or(if entry.kind.is_float() {
                Encoding::ByteStreamSplit
            } else {
                Encoding::Plain
            });
            if encoding == Encoding::DeltaBinaryPacked && entry.kind.is_float() {
                bail!(
                    "column {}: delta_binary_packed is for integers; use byte_stream_split or plain",
                    entry.name
                );
            }
            let statistics = entry.statistics.unwrap_or(!entry.kind.is_float());
            match entry.count {
                None => columns.push(Column {
                    name: entry.name,
                    kind: entry.kind,
                    encoding,
                    statistics,
                }),
                Some(0) => bail!("column {}: count must be at least 1", entry.name),
                Some(n) => {
                    let digits = (n - 1).to_string().len().max(2);
                    columns.extend((0..n).map(|i| Column {
                        name: format!("{}{i:0digits$}", entry.name),
                        kind: entry.kind,
                        encoding,
                        statistics,
                    }))
                }
            }
        }
        let schema = Self { timestamp, columns };
        schema.check()?;
        Ok(schema)
    }

    fn check(&self) -> Result<()> {
        if self.columns.is_empty() {
            bail!("no columns: add at least one [[column]] with a name and a type");
        }
        let mut seen = std::collections::HashSet::new();
        for name in self
            .timestamp
            .iter()
            .chain(self.columns.iter().map(|c| &c.name))
        {
            if name.is_empty() || name.contains('.') {
                bail!("column name {name:?}: names must be non-empty and contain no dot");
            }
            if !seen.insert(name) {
                bail!("column {name} appears twice");
            }
        }
        Ok(())
    }

    /// Bytes of one row on the wire.
    pub fn row_width(&self) -> usize {
        self.timestamp.as_ref().map_or(0, |_| 8)
            + self.columns.iter().map(|c| c.kind.width()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_file_expands_counts_and_defaults_encodings() {
        let s = Schema::parse(
            "timestamp = \"t\"\n\
             [[column]]\nname = \"s\"\ncount = 3\ntype = \"float32\"\n\
             [[column]]\nname = \"rpm\"\ntype = \"int64\"\n\
             [[column]]\nname = \"v\"\ntype = \"float64\"\nencoding = \"plain\"\n",
        )
        .unwrap();
        let names: Vec<_> = s.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["s00", "s01", "s02", "rpm", "v"]);
        assert_eq!(s.columns[0].encoding, Encoding::ByteStreamSplit);
        assert_eq!(s.columns[3].encoding, Encoding::Plain);
        assert_eq!(s.columns[4].encoding, Encoding::Plain);
        let stats: Vec<_> = s.columns.iter().map(|c| c.statistics).collect();
        assert_eq!(stats, [false, false, false, true, false]);
        assert_eq!(s.row_width(), 8 + 3 * 4 + 8 + 8);
        assert_eq!(s.timestamp.as_deref(), Some("t"));
    }

    #[test]
    fn bad_schemas_say_what_is_wrong() {
        let err = |t: &str| format!("{:#}", Schema::parse(t).unwrap_err());
        assert!(err("timestamp = false\n").contains("no columns"));
        assert!(err("[[column]]\nname = \"a\"\ntype = \"float16\"\n").contains("float16"));
        assert!(err("[[column]]\nname = \"time\"\ntype = \"int64\"\n").contains("appears twice"));
        assert!(err(
            "[[column]]\nname = \"a\"\ntype = \"float32\"\nencoding = \"delta_binary_packed\"\n"
        )
        .contains("for integers"));
        assert!(err("[[column]]\nname = \"a\"\ntype = \"int32\"\ncolour = 1\n").contains("colour"));
    }
}
