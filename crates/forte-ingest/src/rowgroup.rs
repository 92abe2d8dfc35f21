//! One row group's worth of rows, held column by column.
//!
//! The buffer is allocated once at its full size (rows × Σ column widths) and reused: rows are
//! scattered into it as they arrive, and the writer hands each column to Parquet in one call.
//! Columns written with BYTE_STREAM_SPLIT are scattered straight into their byte streams, so
//! the buffer already holds the page's encoded bytes: no encoder pass and no copy before the
//! codec.

use crate::schema::{Column, Encoding, Kind, Schema};

/// A column kept as its BYTE_STREAM_SPLIT encoding: byte k of every value in stream k.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Bytes per value: the number of streams.
    width: usize,
    capacity: usize,
    len: usize,
    /// Stream k at `k × capacity`.
    streams: Vec<u8>,
}

impl Split {
    /// Values transposed at a time.
    const TILE: usize = 64;

    fn new(width: usize, capacity: usize) -> Self {
        Self {
            width,
            capacity,
            len: 0,
            streams: vec![0; width * capacity],
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The encoded values: the streams one after the other. A partly filled buffer has its
    /// streams moved together first (which is why this needs `&mut`); the buffer is cleared
    /// after writing anyway.
    pub fn encoded(&mut self) -> &[u8] {
        if self.len < self.capacity {
            for k in 1..self.width {
                let from = k * self.capacity;
                self.streams
                    .copy_within(from..from + self.len, k * self.len);
            }
            // The layout is now the packed one; only `clear` may follow.
            self.capacity = self.len;
        }
        &self.streams[..self.width * self.len]
    }

    /// Empties the streams for a new row group, in the layout of a full one.
    fn clear(&mut self) {
        self.len = 0;
        self.capacity = self.streams.len() / self.width;
    }

    /// Appends byte k of the `N`-byte value at `offset` of each `width`-byte row to stream k.
    fn scatter<const N: usize>(&mut self, rows: &[u8], width: usize, offset: usize) {
        // Tiles of 64 values: gathered from the rows (in L1) as integers, then each stream
        // takes byte k of all 64 at once, a shift and narrowing the compiler vectorises.
        const TILE: usize = Split::TILE;
        let capacity = self.capacity;
        let mut at = self.len;
        let mut tiles = rows.chunks_exact(width * TILE);
        for tile in &mut tiles {
            let mut values = [0u64; TILE];
            for (value, row) in values.iter_mut().zip(tile.chunks_exact(width)) {
                let mut bytes = [0u8; 8];
                bytes[..N].copy_from_slice(&row[offset..offset + N]);
                *value = u64::from_le_bytes(bytes);
            }
            for k in 0..N {
                let stream = &mut self.streams[k * capacity + at..k * capacity + at + TILE];
                for (byte, value) in stream.iter_mut().zip(&values) {
                    *byte = (value >> (8 * k)) as u8;
                }
            }
            at += TILE;
        }
        for row in tiles.remainder().chunks_exact(width) {
            for k in 0..N {
                self.streams[k * capacity + at] = row[offset + k];
            }
            at += 1;
        }
        self.len = at;
    }
}

/// The values of one column, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    /// Already BYTE_STREAM_SPLIT-encoded (see [`Values::for_column`]).
    Split(Split),
}

impl Values {
    /// The buffer of `column`: its encoded byte streams where it is written with
    /// BYTE_STREAM_SPLIT and without statistics (min/max need the values), else its values.
    fn for_column(column: &Column, rows: usize, plain: bool) -> Self {
        if column.encoding == Encoding::ByteStreamSplit && !column.statistics && !plain {
            Values::Split(Split::new(column.kind.width(), rows))
        } else {
            Values::with_capacity(column.kind, rows)
        }
    }

    fn with_capacity(kind: Kind, rows: usize) -> Self {
        match kind {
            Kind::Float32 => Values::Float32(Vec::with_capacity(rows)),
            Kind::Float64 => Values::Float64(Vec::with_capacity(rows)),
            Kind::Int32 => Values::Int32(Vec::with_capacity(rows)),
            Kind::Int64 => Values::Int64(Vec::with_capacity(rows)),
        }
    }

    fn clear(&mut self) {
        match self {
            Values::Float32(v) => v.clear(),
            Values::Float64(v) => v.clear(),
            Values::Int32(v) => v.clear(),
            Values::Int64(v) => v.clear(),
            Values::Split(s) => s.clear(),
        }
    }

    /// Appends the value at byte `offset` of each `width`-byte row in `rows`.
    fn scatter(&mut self, rows: &[u8], width: usize, offset: usize) {
        // Generic over the conversion (not a fn pointer) so it inlines into the loop.
        fn take<const N: usize, T>(
            rows: &[u8],
            width: usize,
            offset: usize,
            out: &mut Vec<T>,
            from: impl Fn([u8; N]) -> T,
        ) {
            out.extend(
                rows.chunks_exact(width)
                    .map(|row| from(row[offset..offset + N].try_into().expect("a value's bytes"))),
            );
        }
        match self {
            Values::Float32(v) => take(rows, width, offset, v, f32::from_le_bytes),
            Values::Float64(v) => take(rows, width, offset, v, f64::from_le_bytes),
            Values::Int32(v) => take(rows, width, offset, v, i32::from_le_bytes),
            Values::Int64(v) => take(rows, width, offset, v, i64::from_le_bytes),
            Values::Split(s) if s.width == 4 => s.scatter::<4>(rows, width, offset),
            Values::Split(s) => s.scatter::<8>(rows, width, offset),
        }
    }
}

/// A column-major buffer of up to `capacity` rows.
#[derive(Debug)]
pub struct RowGroup {
    /// The timestamp column first, if the schema has one, then the schema's columns.
    pub columns: Vec<Values>,
    offsets: Vec<usize>,
    width: usize,
    capacity: usize,
    rows: usize,
}

impl RowGroup {
    /// A buffer for `capacity` rows; `plain` keeps every column as values, for files written
    /// without BYTE_STREAM_SPLIT ([`crate::FileOptions::plain`]).
    pub fn new(schema: &Schema, capacity: usize, plain: bool) -> Self {
        let kinds: Vec<Kind> = schema
            .timestamp
            .iter()
            .map(|_| Kind::Int64)
            .chain(schema.columns.iter().map(|c| c.kind))
            .collect();
        let mut offsets = Vec::with_capacity(kinds.len());
        let mut at = 0;
        for kind in &kinds {
            offsets.push(at);
            at += kind.width();
        }
        Self {
            columns: schema
                .timestamp
                .iter()
                .map(|_| Values::with_capacity(Kind::Int64, capacity))
                .chain(
                    schema
                        .columns
                        .iter()
                        .map(|c| Values::for_column(c, capacity, plain)),
                )
                .collect(),
            offsets,
            width: at,
            capacity,
            rows: 0,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Rows that still fit.
    pub fn room(&self) -> usize {
        self.capacity - self.rows
    }

    /// Scatters whole rows from `bytes` (a multiple of the row width, at most `room()` rows).
    pub fn push_rows(&mut self, bytes: &[u8]) {
        debug_assert_eq!(bytes.len() % self.width, 0);
        let rows = bytes.len() / self.width;
        assert!(
            rows <= self.room(),
            "{rows} rows do not fit in {}",
            self.room()
        );
        // Column by column over a tile of rows small enough to stay in L1 while every column
        // takes its values from it: each pass appends to one contiguous column. A whole number
        // of split tiles (64 rows), or most rows would take the split columns' scalar tail.
        let tile = (32 * 1024 / self.width / Split::TILE).max(1) * Split::TILE * self.width;
        for rows in bytes.chunks(tile) {
            for (values, &offset) in self.columns.iter_mut().zip(&self.offsets) {
                values.scatter(rows, self.width, offset);
            }
        }
        self.rows += rows;
    }

    /// Empties the buffer for reuse, keeping its allocation.
    pub fn clear(&mut self) {
        self.columns.iter_mut().for_each(Values::clear);
        self.rows = 0;
    }

    /// Bytes the buffer holds when full: what two of them per stream cost in memory.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity * self.width
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_scattered_into_their_columns() {
        let schema = Schema::parse(
            "[[column]]\nname = \"a\"\ntype = \"float32\"\n[[column]]\nname = \"b\"\ntype = \"int32\"\n",
        )
        .unwrap();
        let mut group = RowGroup::new(&schema, 4, true);
        let mut bytes = Vec::new();
        for i in 0..3i64 {
            bytes.extend_from_slice(&(1000 + i).to_le_bytes());
            bytes.extend_from_slice(&(i as f32 * 0.5).to_le_bytes());
            bytes.extend_from_slice(&(-(i as i32)).to_le_bytes());
        }
        group.push_rows(&bytes);
        assert_eq!(group.rows(), 3);
        assert_eq!(group.room(), 1);
        assert_eq!(group.columns[0], Values::Int64(vec![1000, 1001, 1002]));
        assert_eq!(group.columns[1], Values::Float32(vec![0.0, 0.5, 1.0]));
        assert_eq!(group.columns[2], Values::Int32(vec![0, -1, -2]));
        group.clear();
        assert!(group.is_empty());
        assert_eq!(group.capacity_bytes(), 4 * 16);
    }

    #[test]
    fn split_columns_hold_the_byte_streams_of_their_values() {
        let schema = Schema::parse(
            "[[column]]\nname = \"a\"\ntype = \"float32\"\nencoding = \"byte_stream_split\"\n[[column]]\nname = \"b\"\ntype = \"float64\"\nencoding = \"byte_stream_split\"\n",
        )
        .unwrap();
        // 150 rows: two whole tiles of 64 and a remainder, in a buffer for 200 (partly full).
        let (rows, capacity) = (150usize, 200);
        let a: Vec<f32> = (0..rows).map(|i| i as f32 * 1.25 - 7.0).collect();
        let b: Vec<f64> = (0..rows).map(|i| (i as f64).sqrt() * -3.5).collect();
        let mut bytes = Vec::new();
        for i in 0..rows {
            bytes.extend_from_slice(&(i as i64).to_le_bytes());
            bytes.extend_from_slice(&a[i].to_le_bytes());
            bytes.extend_from_slice(&b[i].to_le_bytes());
        }
        let mut group = RowGroup::new(&schema, capacity, false);
        // In two pieces, so the second scatter continues where the first stopped.
        group.push_rows(&bytes[..70 * 20]);
        group.push_rows(&bytes[70 * 20..]);
        let streams = |values: Vec<Vec<u8>>, width: usize| -> Vec<u8> {
            (0..width)
                .flat_map(|k| values.iter().map(move |v| v[k]))
                .collect()
        };
        let want_a = streams(a.iter().map(|v| v.to_le_bytes().to_vec()).collect(), 4);
        let want_b = streams(b.iter().map(|v| v.to_le_bytes().to_vec()).collect(), 8);
        let Values::Split(split) = &mut group.columns[1] else {
            panic!("float32 with byte_stream_split is kept split")
        };
        assert_eq!(split.len(), rows);
        assert_eq!(split.encoded(), &want_a[..]);
        let Values::Split(split) = &mut group.columns[2] else {
            panic!("float64 with byte_stream_split is kept split")
        };
        assert_eq!(split.encoded(), &want_b[..]);
        // Cleared, the buffer takes a full group again.
        group.clear();
        let full: Vec<u8> = bytes.iter().cycle().take(capacity * 20).copied().collect();
        group.push_rows(&full);
        let Values::Split(split) = &mut group.columns[1] else {
            unreachable!()
        };
        assert_eq!(split.encoded().len(), capacity * 4);
    }
}
