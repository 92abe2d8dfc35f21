//! One row group's worth of rows, held column by column.
//!
//! The buffer is allocated once at its full size (rows × Σ column widths) and reused: rows are
//! scattered into it as they arrive, and the writer hands each column to Parquet in one call.

use crate::schema::{Kind, Schema};

/// The values of one column, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
}

impl Values {
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
    pub fn new(schema: &Schema, capacity: usize) -> Self {
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
            columns: kinds
                .iter()
                .map(|&k| Values::with_capacity(k, capacity))
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
        // takes its values from it: each pass appends to one contiguous column.
        let tile = (16 * 1024 / self.width).max(1) * self.width;
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
        let mut group = RowGroup::new(&schema, 4);
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
}
