//! Row groups into a Parquet file with arrow-rs's low-level column writer, one call per column,
//! and the file's atomic publication into the outbox as a batch `forte send` picks up.
//!
//! Columns the row group already holds BYTE_STREAM_SPLIT-encoded skip the column writer: their
//! streams are compressed as one data page and the chunk is spliced into the row group with
//! `append_column`. Everything else (the delta-encoded timestamp, plain columns, columns with
//! statistics) goes through the column writer.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use parquet::basic::{
    Compression, Encoding as ParquetEncoding, EncodingMask, LogicalType, PageType, Repetition,
    TimeUnit, Type as Physical,
};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::{DoubleType, FloatType, Int32Type, Int64Type};
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::{ColumnDescPtr, ColumnPath, Type};

use crate::rowgroup::{RowGroup, Split, Values};
use crate::schema::{Encoding, Kind, Schema};

/// The page codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Snappy,
    Lz4,
    Zstd(i32),
}

impl FromStr for Codec {
    type Err = anyhow::Error;

    /// `zstd` (level 1), `zstd:LEVEL`, `lz4`, `snappy` or `none`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.split_once(':') {
            None if s == "zstd" => Codec::Zstd(1),
            None if s == "lz4" => Codec::Lz4,
            None if s == "snappy" => Codec::Snappy,
            None if s == "none" => Codec::None,
            Some(("zstd", level)) => {
                let level: i32 = level
                    .parse()
                    .with_context(|| format!("zstd level {level:?} is not a number"))?;
                if !(1..=22).contains(&level) {
                    bail!("zstd level {level} is outside 1..=22");
                }
                Codec::Zstd(level)
            }
            _ => bail!("unknown codec {s:?}: use zstd, zstd:LEVEL, lz4, snappy or none"),
        })
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Snappy => f.write_str("snappy"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

impl Codec {
    /// The parquet crate's name for this codec.
    pub fn parquet(self) -> Compression {
        match self {
            Codec::None => Compression::UNCOMPRESSED,
            Codec::Snappy => Compression::SNAPPY,
            // LZ4_RAW: the plain LZ4 block format that Parquet readers agree on (the older
            // Hadoop-framed LZ4 is deprecated).
            Codec::Lz4 => Compression::LZ4_RAW,
            Codec::Zstd(level) => Compression::ZSTD(
                parquet::basic::ZstdLevel::try_new(level).expect("a level checked at parsing"),
            ),
        }
    }
}

/// How the Parquet files are written.
#[derive(Debug, Clone)]
pub struct FileOptions {
    pub codec: Codec,
    /// Ignore the schema's encodings and write the value columns plain, the timestamp still
    /// delta-encoded: the "codec alone" side of the comparison runs.
    pub plain: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            codec: Codec::Zstd(1),
            plain: false,
        }
    }
}

/// The Parquet schema of a stream's rows: required columns (rows have no nulls), the timestamp
/// as an int64 TIMESTAMP(NANOS, UTC).
pub fn parquet_schema(schema: &Schema) -> Result<Arc<Type>> {
    let mut fields = Vec::new();
    if let Some(name) = &schema.timestamp {
        fields.push(Arc::new(
            Type::primitive_type_builder(name, Physical::INT64)
                .with_repetition(Repetition::REQUIRED)
                .with_logical_type(Some(LogicalType::timestamp(true, TimeUnit::NANOS)))
                .build()?,
        ));
    }
    for column in &schema.columns {
        let physical = match column.kind {
            Kind::Float32 => Physical::FLOAT,
            Kind::Float64 => Physical::DOUBLE,
            Kind::Int32 => Physical::INT32,
            Kind::Int64 => Physical::INT64,
        };
        fields.push(Arc::new(
            Type::primitive_type_builder(&column.name, physical)
                .with_repetition(Repetition::REQUIRED)
                .build()?,
        ));
    }
    Ok(Arc::new(
        Type::group_type_builder("sensors")
            .with_fields(fields)
            .build()?,
    ))
}

/// Writer properties for a stream's files.
///
/// arrow-rs uses a column's chosen encoding only as the fallback of dictionary encoding, so
/// dictionary is turned off wherever an encoding is chosen (BYTE_STREAM_SPLIT for floats,
/// DELTA_BINARY_PACKED for the timestamp, which rises steadily).
pub fn properties(schema: &Schema, options: &FileOptions) -> Arc<WriterProperties> {
    let mut builder = WriterProperties::builder()
        .set_compression(options.codec.parquet())
        .set_dictionary_enabled(false)
        .set_created_by(format!("forte ingest {}", env!("CARGO_PKG_VERSION")))
        // Min/max per row group where the schema asks (the timestamp always, so readers skip
        // row groups by time); never per page, which would cost a pass per page for nothing.
        .set_statistics_enabled(EnabledStatistics::Chunk)
        // The column writer checks the page size after each mini-batch: larger ones cost less.
        .set_write_batch_size(65_536)
        .set_data_page_size_limit(1 << 20);
    if let Some(name) = &schema.timestamp {
        builder = builder.set_column_encoding(
            ColumnPath::from(name.as_str()),
            ParquetEncoding::DELTA_BINARY_PACKED,
        );
    }
    for column in &schema.columns {
        let encoding = match (options.plain, column.encoding) {
            (true, _) | (false, Encoding::Plain) => ParquetEncoding::PLAIN,
            (false, Encoding::ByteStreamSplit) => ParquetEncoding::BYTE_STREAM_SPLIT,
            (false, Encoding::DeltaBinaryPacked) => ParquetEncoding::DELTA_BINARY_PACKED,
        };
        let path = ColumnPath::from(column.name.as_str());
        let statistics = if column.statistics {
            EnabledStatistics::Chunk
        } else {
            EnabledStatistics::None
        };
        builder = builder
            .set_column_encoding(path.clone(), encoding)
            .set_column_statistics_enabled(path, statistics);
    }
    Arc::new(builder.build())
}

/// A Parquet file being written: row groups go in as they fill; it is visible in the outbox
/// only once closed.
pub struct OpenFile {
    writer: SerializedFileWriter<File>,
    columns: Vec<ColumnDescPtr>,
    compression: Compression,
    /// The codec of the split columns' pages, made once per file.
    codec: PageCodec,
    /// The compressed page, reused.
    page: Vec<u8>,
    /// The batch directory, under the outbox's hidden work directory until published.
    staging: PathBuf,
    name: String,
    pub row_groups: usize,
    pub rows: u64,
}

impl OpenFile {
    /// Starts `name` (a batch name, unique in the outbox) in the outbox's work directory.
    pub fn create(
        outbox: &Path,
        name: &str,
        schema: &Arc<Type>,
        props: &Arc<WriterProperties>,
    ) -> Result<Self> {
        let staging = work_dir(outbox).join(name);
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        let path = staging.join(format!("{name}.parquet"));
        let file =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let writer = SerializedFileWriter::new(file, schema.clone(), props.clone())
            .with_context(|| format!("cannot start the Parquet file {}", path.display()))?;
        let columns = writer.schema_descr().columns().to_vec();
        let compression = props.compression(&ColumnPath::new(Vec::new()));
        let codec = PageCodec::new(compression)?;
        Ok(Self {
            writer,
            columns,
            compression,
            codec,
            page: Vec::new(),
            staging,
            name: name.to_string(),
            row_groups: 0,
            rows: 0,
        })
    }

    /// Appends `group` as one row group, handing each column to the writer in one call (split
    /// columns as one finished page each).
    pub fn write(&mut self, group: &mut RowGroup) -> Result<()> {
        let (name, index) = (self.name.clone(), self.row_groups);
        let context = |column: &ColumnDescPtr| {
            format!(
                "writing column {} of row group {index} of {name}",
                column.name()
            )
        };
        let mut row_group = self
            .writer
            .next_row_group()
            .with_context(|| format!("starting row group {index} of {name}"))?;
        for (values, descr) in group.columns.iter_mut().zip(&self.columns) {
            if let Values::Split(split) = values {
                let (chunk, close) = split_chunk(
                    split,
                    descr,
                    self.compression,
                    &mut self.codec,
                    &mut self.page,
                )
                .with_context(|| context(descr))?;
                row_group
                    .append_column(&chunk, close)
                    .with_context(|| context(descr))?;
                continue;
            }
            let mut column = row_group
                .next_column()
                .with_context(|| context(descr))?
                .expect("a column writer per schema field");
            let written = match values {
                Values::Float32(v) => column.typed::<FloatType>().write_batch(v, None, None),
                Values::Float64(v) => column.typed::<DoubleType>().write_batch(v, None, None),
                Values::Int32(v) => column.typed::<Int32Type>().write_batch(v, None, None),
                Values::Int64(v) => column.typed::<Int64Type>().write_batch(v, None, None),
                Values::Split(_) => unreachable!("split columns are appended above"),
            };
            written.with_context(|| context(descr))?;
            column.close().with_context(|| context(descr))?;
        }
        row_group
            .close()
            .with_context(|| format!("closing row group {index} of {name}"))?;
        self.row_groups += 1;
        self.rows += group.rows() as u64;
        Ok(())
    }

    /// Writes the footer, makes the file durable and moves its batch directory, marked ready,
    /// into the outbox in one rename. Returns the published file.
    pub fn publish(self, outbox: &Path) -> Result<PathBuf> {
        let file = self
            .writer
            .into_inner()
            .with_context(|| format!("cannot finish the Parquet file {}", self.name))?;
        file.sync_all()
            .with_context(|| format!("cannot sync {}", self.name))?;
        drop(file);
        let marker = self.staging.join(".ready");
        File::create(&marker)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot mark {} ready", self.staging.display()))?;
        let target = outbox.join(&self.name);
        std::fs::rename(&self.staging, &target)
            .with_context(|| format!("cannot move {} into {}", self.name, outbox.display()))?;
        File::open(outbox)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", outbox.display()))?;
        Ok(target.join(format!("{}.parquet", self.name)))
    }
}

/// The codecs of [`Codec`], for pages forte compresses itself; each makes the bytes arrow-rs's
/// own codec would (zstd frames with their content size, raw LZ4 blocks, raw Snappy).
pub enum PageCodec {
    None,
    /// Boxed: its hash table is 2 KiB.
    Snappy(Box<snap::raw::Encoder>),
    Lz4,
    /// One context for every page of the file.
    Zstd(zstd::bulk::Compressor<'static>),
}

impl PageCodec {
    pub fn new(compression: Compression) -> Result<Self> {
        Ok(match compression {
            Compression::UNCOMPRESSED => PageCodec::None,
            Compression::SNAPPY => PageCodec::Snappy(Box::new(snap::raw::Encoder::new())),
            Compression::LZ4_RAW => PageCodec::Lz4,
            Compression::ZSTD(level) => PageCodec::Zstd(
                zstd::bulk::Compressor::new(level.compression_level())
                    .context("cannot make a zstd context")?,
            ),
            other => bail!("{other} is not a codec of forte ingest"),
        })
    }

    /// `input` compressed into `out` (replacing what it held).
    pub fn compress(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        match self {
            PageCodec::None => out.extend_from_slice(input),
            PageCodec::Snappy(encoder) => {
                out.resize(snap::raw::max_compress_len(input.len()), 0);
                let n = encoder.compress(input, out)?;
                out.truncate(n);
            }
            PageCodec::Lz4 => {
                out.resize(lz4_flex::block::get_maximum_output_size(input.len()), 0);
                let n = lz4_flex::block::compress_into(input, out)?;
                out.truncate(n);
            }
            PageCodec::Zstd(context) => {
                out.reserve(zstd::zstd_safe::compress_bound(input.len()));
                context.compress_to_buffer(input, out)?;
            }
        }
        Ok(())
    }
}

/// A split column's chunk: its streams compressed as one data page (v1, as the column writer
/// writes them), and the metadata the column writer would have given it.
fn split_chunk(
    split: &mut Split,
    descr: &ColumnDescPtr,
    compression: Compression,
    codec: &mut PageCodec,
    page: &mut Vec<u8>,
) -> Result<(Bytes, ColumnCloseResult)> {
    let values = split.len();
    let encoded = split.encoded();
    codec.compress(encoded, page)?;
    let data_page = Page::DataPage {
        buf: Bytes::copy_from_slice(page),
        num_values: values as u32,
        encoding: ParquetEncoding::BYTE_STREAM_SPLIT,
        // Required columns have no levels; these name what the levels would use.
        def_level_encoding: ParquetEncoding::RLE,
        rep_level_encoding: ParquetEncoding::RLE,
        statistics: None,
    };
    let mut sink = TrackedWrite::new(Vec::with_capacity(page.len() + 64));
    let spec = SerializedPageWriter::new(&mut sink)
        .write_page(CompressedPage::new(data_page, encoded.len()))?;
    let chunk = Bytes::from(sink.into_inner()?);
    let encodings = [ParquetEncoding::BYTE_STREAM_SPLIT, ParquetEncoding::RLE];
    let metadata = ColumnChunkMetaData::builder(descr.clone())
        .set_compression(compression)
        .set_encodings_mask(EncodingMask::new_from_encodings(encodings.iter()))
        .set_page_encoding_stats(vec![PageEncodingStats {
            page_type: PageType::DATA_PAGE,
            encoding: ParquetEncoding::BYTE_STREAM_SPLIT,
            count: 1,
        }])
        .set_total_compressed_size(spec.compressed_size as i64)
        .set_total_uncompressed_size(spec.uncompressed_size as i64)
        .set_num_values(values as i64)
        .set_data_page_offset(0)
        .build()?;
    let offset_index = OffsetIndexMetaData {
        page_locations: vec![PageLocation {
            offset: 0,
            compressed_page_size: spec.compressed_size as i32,
            first_row_index: 0,
        }],
        unencoded_byte_array_data_bytes: None,
    };
    let close = ColumnCloseResult {
        bytes_written: chunk.len() as u64,
        rows_written: values as u64,
        metadata,
        bloom_filter: None,
        column_index: None,
        offset_index: Some(offset_index),
    };
    Ok((chunk, close))
}

/// Where files are written until they are closed. Hidden, so `forte send` never takes it for
/// a batch.
pub fn work_dir(outbox: &Path) -> PathBuf {
    outbox.join(".forte-ingest")
}

/// Removes what a killed ingest left half-written (files without a footer cannot be read);
/// returns how many files that was.
pub fn remove_unfinished(outbox: &Path) -> Result<usize> {
    let work = work_dir(outbox);
    let Ok(entries) = std::fs::read_dir(&work) else {
        return Ok(0);
    };
    let mut removed = 0;
    for entry in entries {
        let path = entry?.path();
        std::fs::remove_dir_all(&path)
            .with_context(|| format!("cannot remove the unfinished {}", path.display()))?;
        removed += 1;
    }
    Ok(removed)
}
