//! Streams in, Parquet files out: read back with the parquet crate's own reader, every value
//! compared bit for bit, the encodings taken from the file's metadata.

use std::io::Cursor;
use std::time::Duration;

use forte_ingest::{Codec, FileOptions, Ingest, IngestOptions, Schema};
use forte_pipeline::{Scheduler, Scheduling};
use parquet::basic::Encoding;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

/// Rows of `schema` (timestamp, float32 columns) with NaN, ±inf, -0.0 and subnormals mixed in.
fn rows(columns: usize, count: usize) -> (Vec<u8>, Vec<Vec<u32>>) {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE / 2.0,
    ];
    let mut bytes = Vec::new();
    let mut values = vec![Vec::new(); columns];
    for r in 0..count {
        bytes.extend_from_slice(&(1_795_305_600_000_000_000i64 + r as i64 * 39_062).to_le_bytes());
        for (c, column) in values.iter_mut().enumerate() {
            let v = if (r + c) % 97 == 0 {
                specials[(r / 97 + c) % specials.len()]
            } else {
                100.0 + c as f32 + ((r * 7919 + c * 104_729) % 1000) as f32 / 997.0
            };
            bytes.extend_from_slice(&v.to_le_bytes());
            column.push(v.to_bits());
        }
    }
    (bytes, values)
}

#[test]
fn rows_arrive_as_columns_bit_for_bit_with_the_configured_encodings() {
    for scheduler in [Scheduler::Ordo, Scheduler::Threads, Scheduler::Rayon] {
        let scheduling = Scheduling {
            scheduler,
            worker_kills: None,
        };
        let ingest = rows_arrive_bit_for_bit(1000, scheduling);
        assert_eq!(ingest.reading().scheduler, scheduler);
        ingest.shut_down();
    }
}

#[test]
fn writers_killed_every_few_milliseconds_lose_no_row_and_are_replaced() {
    let scheduling = Scheduling {
        scheduler: Scheduler::Ordo,
        worker_kills: Some("0.6,0.002".parse().unwrap()),
    };
    let ingest = rows_arrive_bit_for_bit(50, scheduling);
    let reading = ingest.reading();
    assert!(reading.workers_replaced > 0, "{reading:?}");
    // Every buffer's latency from handed over to written is measured: the 150 row groups',
    // and the empty last one that closes the file.
    assert_eq!(reading.latency.items, 151);
    ingest.shut_down();
}

/// Streams 7 500 rows through an ingest in row groups of `rows_per_group` (3 to a file) and
/// checks that the files hold them bit for bit, with the configured encodings.
fn rows_arrive_bit_for_bit(rows_per_group: usize, scheduling: Scheduling) -> Ingest {
    let out = tempfile::tempdir().unwrap();
    let options = IngestOptions {
        rows_per_group,
        row_groups_per_file: 3,
        flush_after: Duration::from_secs(60),
        writers: 2,
        scheduling,
        file: FileOptions::default(),
    };
    let (ingest, removed) = Ingest::start(out.path(), Schema::sensors(4), options).unwrap();
    assert_eq!(removed, 0);
    let (bytes, expected) = rows(4, 7_500);
    // Reads of odd sizes cut rows in two: they must be joined again.
    let mut input = Cursor::new(bytes).take_in_chunks(777);
    let stats = ingest.stream("turbine-1", &mut input).unwrap();
    let groups = 7_500_usize.div_ceil(rows_per_group);
    assert_eq!((stats.rows, stats.row_groups), (7_500, groups as u64));
    // 3 row groups per file, the last one closed at the end of the stream.
    assert_eq!(stats.files.len(), groups.div_ceil(3));

    let mut got = vec![Vec::new(); 4];
    let mut times = Vec::new();
    for file in &stats.files {
        assert!(file.parent().unwrap().join(".ready").exists());
        let reader = SerializedFileReader::new(std::fs::File::open(file).unwrap()).unwrap();
        for rg in reader.metadata().row_groups() {
            for (i, column) in rg.columns().iter().enumerate() {
                let encodings: Vec<Encoding> = column.encodings().collect();
                let wanted = if i == 0 {
                    Encoding::DELTA_BINARY_PACKED
                } else {
                    Encoding::BYTE_STREAM_SPLIT
                };
                assert!(encodings.contains(&wanted), "column {i}: {encodings:?}");
                assert!(
                    !encodings.contains(&Encoding::RLE_DICTIONARY),
                    "column {i}: {encodings:?}"
                );
            }
        }
        for row in reader.get_row_iter(None).unwrap() {
            for (i, (_, field)) in row.unwrap().get_column_iter().enumerate() {
                match field {
                    Field::Long(t) | Field::TimestampMicros(t) => times.push(*t),
                    Field::Float(v) => got[i - 1].push(v.to_bits()),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
    assert_eq!(got, expected);
    assert_eq!(times.len(), 7_500);
    assert!(times.windows(2).all(|w| w[1] - w[0] == 39_062));
    ingest
}

#[test]
fn a_stream_cut_inside_a_row_keeps_the_rows_before_it() {
    let out = tempfile::tempdir().unwrap();
    let options = IngestOptions {
        rows_per_group: 100,
        file: FileOptions {
            codec: Codec::Lz4,
            plain: false,
        },
        ..Default::default()
    };
    let (ingest, _) = Ingest::start(out.path(), Schema::sensors(2), options).unwrap();
    let (mut bytes, _) = rows(2, 250);
    bytes.truncate(bytes.len() - 3);
    let err = ingest.stream("cut", &mut Cursor::new(bytes)).unwrap_err();
    assert!(format!("{err:#}").contains("ended inside a row"), "{err:#}");
    let files: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert_eq!(files.len(), 1);
    let file = std::fs::read_dir(files[0].path())
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .unwrap();
    let reader = SerializedFileReader::new(std::fs::File::open(file.path()).unwrap()).unwrap();
    assert_eq!(reader.metadata().file_metadata().num_rows(), 249);
}

/// A reader that returns at most `n` bytes per read.
trait Chunked: Sized {
    fn take_in_chunks(self, n: usize) -> ChunkedReader<Self>;
}

impl<R: std::io::Read> Chunked for R {
    fn take_in_chunks(self, n: usize) -> ChunkedReader<Self> {
        ChunkedReader(self, n)
    }
}

struct ChunkedReader<R>(R, usize);

impl<R: std::io::Read> std::io::Read for ChunkedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.1);
        self.0.read(&mut buf[..n])
    }
}
