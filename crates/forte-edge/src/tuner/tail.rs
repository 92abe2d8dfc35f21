//! The end of a queue: its last objects are cut into smaller parts, so that the uploads finish
//! together rather than one at a time.
//!
//! When the queue runs dry, each upload still holds the rest of its last request, sent at its
//! share of the link. On a long round trip the uploads that finish leave the link to the others
//! only slowly (BBR raises a flow's rate by a quarter at most every eight round trips: 4.8 s at
//! 600 ms), so the last request of 7 MB at a 64th of 25 MB/s held the link nearly idle for
//! 10 s and more. Guided self-scheduling (Polychronopoulos and Kuck, 1987) bounds that end: each
//! object is cut into parts no larger than the bytes left over the uploads, so that the last
//! parts are small and all uploads run out of work at about the same time.
//!
//! Each request also waits a round trip for its answer, during which its upload's share of the
//! link idles: parts of half that (1 MiB at least) did no better at 600 ms than a whole share
//! (2 MiB at least), and sent 0.5 % more bytes (zstd does less with less): 43.9 against 43.4 s,
//! medians of 2 (docs/benchmarks.md).

/// The smallest part the end of a queue is cut into, and the step of the sizes: below it a
/// request's round trip costs more than the balance gains (2 MiB of data that compresses 3:1
/// is two seconds at a 64th of 25 MB/s, against a round trip of 0.6 s).
pub const SMALLEST_TAIL_PART: u64 = 2 << 20;

/// The part size for an object of `size` raw bytes taken from a queue that holds `after` more
/// and will get no more, with `uploads` in flight and `part_size` configured: the bytes left
/// (this object's and those after it) over the uploads, in steps of [`SMALLEST_TAIL_PART`],
/// when that is less than `part_size` and than the object. `None`: the configured size.
pub fn tail_part_size(size: u64, after: u64, uploads: usize, part_size: u64) -> Option<u64> {
    let share = (size + after) / (uploads.max(1) as u64);
    let cut = (share / SMALLEST_TAIL_PART * SMALLEST_TAIL_PART).max(SMALLEST_TAIL_PART);
    (cut < part_size && cut < size).then_some(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_queue_far_from_its_end_keeps_the_configured_part_size() {
        // 64 uploads of 16 MiB parts: 1 GiB left is the configured size over the uploads.
        assert_eq!(tail_part_size(100 * MIB, 924 * MIB, 64, 16 * MIB), None);
    }

    #[test]
    fn the_parts_shrink_with_the_bytes_left_down_to_two_mib() {
        assert_eq!(
            tail_part_size(100 * MIB, 412 * MIB, 64, 16 * MIB),
            Some(8 * MIB)
        );
        assert_eq!(
            tail_part_size(100 * MIB, 156 * MIB, 64, 16 * MIB),
            Some(4 * MIB)
        );
        assert_eq!(tail_part_size(100 * MIB, 0, 64, 16 * MIB), Some(2 * MIB));
    }

    #[test]
    fn fewer_uploads_shrink_the_parts_later() {
        assert_eq!(tail_part_size(100 * MIB, 412 * MIB, 8, 16 * MIB), None);
        assert_eq!(
            tail_part_size(60 * MIB, 4 * MIB, 8, 16 * MIB),
            Some(8 * MIB)
        );
    }

    #[test]
    fn an_object_smaller_than_its_share_is_not_cut_at_all() {
        assert_eq!(tail_part_size(3 * MIB, 500 * MIB, 64, 16 * MIB), None);
        assert_eq!(tail_part_size(MIB / 2, 0, 64, 16 * MIB), None);
    }
}
