//! How well the objects of a batch will compress, told before they are prepared, from a few
//! small windows of their bytes.
//!
//! The edge's ETA counts what the link carries, sealed bytes, and the bytes of a batch not
//! prepared yet have no sealed size. Taking the batch's compression so far for the rest fails
//! when its data changes along the way (a batch of logs then video; the test set's batch K
//! seals its first third to a quarter and the rest to a half, and its ETA read 18 s where 25 s
//! were left). Compressing windows spread evenly over the batch's bytes, in the order they are
//! prepared, tells which objects compress better than others; the sealed bytes of the parts
//! prepared so far against their windows' estimate scale that to the level in use.
//!
//! The cost is bounded per batch, whatever its size: [`WINDOWS`] windows of [`WINDOW`] bytes
//! (4 MiB read and compressed at zstd level 1, some 10 ms of one core).

use std::fs::File;
use std::os::unix::fs::FileExt;

use forte_format::ObjectId;

use crate::PrepareJob;
use forte_format::manifest::Kind;

/// Windows per batch.
pub const WINDOWS: usize = 64;
/// Bytes per window.
pub const WINDOW: usize = 64 * 1024;
/// The zstd level of the estimate: the fastest; what it misses in ratio against the level in
/// use is the same for every object and the calibration takes it out.
const LEVEL: i32 = 1;

/// An object of a batch and its estimated compression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compressibility {
    pub id: ObjectId,
    /// Raw bytes it reads.
    pub raw: u64,
    /// Compressed bytes per raw byte of its windows (or of the nearest object's before it
    /// that had one).
    pub per_raw: f64,
}

/// The estimated compression of each object of `jobs`, in their order, from windows at evenly
/// spaced places of their bytes taken one after another. Objects that cannot be read (they
/// fail when prepared, with the reason) and those no window fell on take the estimate of the
/// nearest object before them that has one (after them, for the first ones); none if no
/// window could be read.
pub fn probe(jobs: &[PrepareJob]) -> Vec<Compressibility> {
    let total: u64 = jobs.iter().map(raw_len).sum();
    if total == 0 {
        return Vec::new();
    }
    let step = (total / WINDOWS as u64).max(WINDOW as u64);
    let mut found: Vec<Option<f64>> = vec![None; jobs.len()];
    let (mut start, mut next) = (0u64, step / 2);
    let mut compressor = zstd::bulk::Compressor::new(LEVEL).ok();
    let mut window = vec![0u8; WINDOW];
    for (job, found) in jobs.iter().zip(&mut found) {
        let end = start + raw_len(job);
        let mut ratios = Vec::new();
        while next < end {
            let read = read_window(job, next - start, &mut window);
            if let (Some(read), Some(c)) = (read.filter(|n| *n > 0), compressor.as_mut()) {
                if let Ok(packed) = c.compress(&window[..read]) {
                    ratios.push(packed.len() as f64 / read as f64);
                }
            }
            next += step;
        }
        if !ratios.is_empty() {
            *found = Some(ratios.iter().sum::<f64>() / ratios.len() as f64);
        }
        start = end;
    }
    let first = found.iter().flatten().next().copied();
    let Some(mut last) = first else {
        return Vec::new();
    };
    jobs.iter()
        .zip(found)
        .map(|(job, found)| {
            last = found.unwrap_or(last);
            Compressibility {
                id: job.id,
                raw: raw_len(job),
                per_raw: last,
            }
        })
        .collect()
}

/// The raw bytes an object reads: a file's size, a bundle's members'.
fn raw_len(job: &PrepareJob) -> u64 {
    if job.members.is_empty() {
        match job.source.kind {
            Kind::File => job.source.size,
            _ => 0,
        }
    } else {
        job.members.iter().map(|m| m.source.size).sum()
    }
}

/// Reads a window of `job`'s bytes around `at` (of its raw bytes: a bundle's members one after
/// another), or as much of the file `at` falls in as it has; how many it read.
fn read_window(job: &PrepareJob, at: u64, window: &mut [u8]) -> Option<usize> {
    let (path, size, at) = if job.members.is_empty() {
        (&job.source.local, job.source.size, at)
    } else {
        let mut start = 0;
        let member = job.members.iter().find(|m| {
            start += m.source.size;
            at < start
        })?;
        let size = member.source.size;
        (&member.source.local, size, at - (start - size))
    };
    let len = window.len() as u64;
    let from = at.saturating_sub(len / 2).min(size.saturating_sub(len));
    let file = File::open(path).ok()?;
    let mut read = 0;
    while read < window.len() {
        match file.read_at(&mut window[read..], from + read as u64).ok()? {
            0 => break,
            n => read += n,
        }
    }
    Some(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bundle_small, discover, BundleLimits};

    /// Bytes zstd cannot shrink.
    fn noise(len: u64) -> Vec<u8> {
        use std::io::Read;
        let mut bytes = Vec::new();
        let random = File::open("/dev/urandom").unwrap();
        random.take(len).read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn each_object_is_estimated_from_its_own_bytes_and_the_unread_take_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let text = b"2026-11-26T06:00:00Z engine 3 rpm 1450 temp 88.5\n".repeat(80_000);
        std::fs::write(dir.path().join("a-log.txt"), &text).unwrap();
        std::fs::write(dir.path().join("b-video.mp4"), noise(4 << 20)).unwrap();
        std::fs::write(dir.path().join("c-gone.txt"), &text).unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("d-{i:02}.bin")), noise(50_000)).unwrap();
        }
        let files = discover(dir.path()).unwrap().files;
        let jobs: Vec<PrepareJob> = files.into_iter().map(PrepareJob::fresh).collect();
        let jobs = bundle_small(jobs, BundleLimits::DEFAULT, &|_| ObjectId::random());
        assert_eq!(jobs.len(), 4, "three files and a bundle of 20");
        std::fs::remove_file(dir.path().join("c-gone.txt")).unwrap();
        let probed = probe(&jobs);
        let ids: Vec<ObjectId> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(probed.iter().map(|p| p.id).collect::<Vec<_>>(), ids);
        let per_raw: Vec<f64> = probed.iter().map(|p| p.per_raw).collect();
        assert!(per_raw[0] < 0.05, "{per_raw:?}");
        assert!(per_raw[1] > 0.99, "{per_raw:?}");
        // Unreadable: its estimate is the video's before it.
        assert_eq!(per_raw[2], per_raw[1]);
        assert!(per_raw[3] > 0.99, "the bundle's members: {per_raw:?}");
        assert_eq!(probed[3].raw, 20 * 50_000);
        assert_eq!(probed[0].raw, text.len() as u64);
    }

    #[test]
    fn nothing_to_read_gives_no_estimate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let files = discover(dir.path()).unwrap().files;
        let jobs: Vec<PrepareJob> = files.into_iter().map(PrepareJob::fresh).collect();
        assert_eq!(jobs.len(), 1);
        assert!(probe(&jobs).is_empty());
        assert!(probe(&[]).is_empty());
    }
}
