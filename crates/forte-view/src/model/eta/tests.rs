//! The ETAs of a node's running batches, in the cases met sending the test set.

use super::*;
use crate::live::{BatchWire, WaitingPart};
use crate::model::Phase;

fn sending(key: &str, started: i64, bytes: i64, done: i64) -> Batch {
    Batch {
        key: key.into(),
        role: Role::Edge,
        site: String::new(),
        name: key.into(),
        state: BatchState::Sending,
        files: 1,
        bytes,
        done_bytes: done,
        progress: done as f64 / bytes as f64,
        arrived_us: 0,
        started_us: Some(started),
        ended_us: None,
        updated_us: 0,
        rate_bytes_per_second: None,
        eta_s: None,
        running: true,
        error: None,
        phase: Phase::Sending,
        receipted: false,
        catalog: 0,
    }
}

#[test]
fn a_batch_is_done_when_it_and_the_batches_before_it_have_gone_at_the_nodes_rate() {
    let progress = Progress::new(16 << 20, Order::AsBegun);
    // A began first and uploads alone at 10 MB/s; B was read ahead and has sent nothing.
    let mut etas = (None, None);
    for t in 0..=4 {
        let mut running = [
            sending("b", 2, 100_000_000, 0),
            sending("a", 1, 100_000_000, t * 10_000_000),
        ];
        progress.queue_etas(&mut running, &EndedBytes::new(), None, t * S);
        etas = (running[1].eta_s, running[0].eta_s);
    }
    // At 4 s: A has 60 MB left (6 s), B its 100 MB after those (16 s). B's own mean rate
    // (nothing done) could tell nothing at all.
    assert_eq!(etas, (Some(6.0), Some(16.0)));
    // Served smallest remaining first, B (100 MB left) would wait for A (60 MB) all the same;
    // a smaller batch begun later would go first.
    let sjf = Progress::new(16 << 20, Order::LeastRemaining);
    for t in 0..=4 {
        let mut running = [
            sending("a", 1, 100_000_000, t * 10_000_000),
            sending("small", 3, 20_000_000, 0),
        ];
        sjf.queue_etas(&mut running, &EndedBytes::new(), None, t * S);
        etas = (running[0].eta_s, running[1].eta_s);
    }
    assert_eq!(etas, (Some(8.0), Some(2.0)));
    assert_eq!(progress.recent_eta("b", 5 * S), Some(15.0));
    // A ends at 10 s (its bytes count as done) and B goes on at the node's rate.
    for t in 5..=13 {
        let (mut running, ended) = if t < 10 {
            let running = vec![
                sending("b", 2, 100_000_000, 0),
                sending("a", 1, 100_000_000, t * 10_000_000),
            ];
            (running, EndedBytes::new())
        } else {
            let running = vec![sending("b", 2, 100_000_000, (t - 10) * 10_000_000)];
            (running, EndedBytes::from([(Role::Edge, 100_000_000)]))
        };
        progress.queue_etas(&mut running, &ended, None, t * S);
        etas.1 = running[0].eta_s;
    }
    assert_eq!(etas.1, Some(7.0));
}

#[test]
fn batches_that_began_and_ended_between_two_looks_count_in_the_nodes_rate() {
    // As seen sending A–N: at the first look nothing was sending; 5 s later A, B and M
    // (74 MB) had come and gone and L had sent 17 MB. The node moved 91 MB in 5 s; counting
    // only the batches seen running gave 17 MB, and ETAs of 4-5× the truth.
    let progress = Progress::new(16 << 20, Order::LeastRemaining);
    progress.queue_etas(&mut [], &EndedBytes::new(), None, 0);
    let mut running = [
        sending("l", 0, 49_000_000, 17_000_000),
        sending("e", 0, 65_000_000, 0),
    ];
    let ended = EndedBytes::from([(Role::Edge, 74_000_000)]);
    progress.queue_etas(&mut running, &ended, None, 5 * S);
    let rate = 91e6 / 5.0;
    assert_eq!(running[0].eta_s, Some(32e6 / rate));
    assert_eq!(running[1].eta_s, Some(97e6 / rate));
    // L fails a second later: its 17 MB leave the sum, which does not go back below the
    // 91 MB seen (a slope over a shrinking sum would be no rate at all).
    let mut running = [sending("e", 0, 65_000_000, 10_000_000)];
    progress.queue_etas(&mut running, &ended, None, 6 * S);
    assert_eq!(running[0].eta_s, Some(55e6 / (91e6 / 6.0)));
}

/// A part of `batch`, `seq`-th prepared, of 5 MB sealed; being sent, its connection
/// having taken `sent` bytes of it.
fn part(batch: &str, seq: u64, sent: Option<u64>) -> WaitingPart {
    WaitingPart {
        batch: batch.into(),
        seq,
        sealed: 5_000_000,
        sending: sent,
    }
}

/// The batches' prepared bytes: (key, raw prepared, sealed prepared, raw waiting).
fn prepared(batches: &[(&str, u64, u64, u64)]) -> HashMap<String, BatchWire> {
    batches
        .iter()
        .map(|&(key, raw, sealed, waiting_raw)| {
            let wire = BatchWire {
                prepared_raw: raw,
                prepared_sealed: sealed,
                waiting_raw,
                ..BatchWire::default()
            };
            (key.to_owned(), wire)
        })
        .collect()
}

/// The edge's ETAs of the `running` batches, in their order, after two looks at the edge's
/// `wire`: at 0 s with nothing sent, and at 4 s with 20 MB sent (the link's 5 MB/s).
fn edge_etas(
    order: Order,
    running: &[(&str, i64, i64)],
    wire: impl Fn(u64) -> WireView,
) -> Vec<Option<f64>> {
    let progress = Progress::new(16 << 20, order);
    let mut batches = vec![];
    for (t, sent) in [(0, 0), (4, 20_000_000)] {
        batches = running
            .iter()
            .map(|&(key, started, bytes)| sending(key, started, bytes, 0))
            .collect();
        progress.queue_etas(&mut batches, &EndedBytes::new(), Some(&wire(sent)), t * S);
    }
    batches.iter().map(|b| b.eta_s).collect()
}

#[test]
fn at_the_edge_a_batch_that_compresses_less_is_timed_in_the_sealed_bytes_the_link_paces() {
    // As seen sending A–N at 5 MB/s: the first batches (100 MB raw) compressed 5x and went
    // in 4 s, 25 MB/s raw; E (60 MB) compresses 3x, its four parts prepared and waiting for
    // the link; F (30 MB) is not prepared yet.
    let wire = |sent: u64| WireView {
        sent,
        resumed: None,
        prepared_raw: 160_000_000,
        prepared_sealed: 40_000_000,
        batches: prepared(&[("e", 60_000_000, 20_000_000, 60_000_000)]),
        waiting: (0..4).map(|seq| part("e", seq, None)).collect(),
        ..WireView::default()
    };
    let running = || {
        [
            sending("e", 1, 60_000_000, 0),
            sending("f", 2, 30_000_000, 0),
        ]
    };
    let (by_sealed, by_raw) = (
        Progress::new(16 << 20, Order::AsBegun),
        Progress::new(16 << 20, Order::AsBegun),
    );
    let mut etas = (running(), running());
    for (t, sent, ended) in [(0, 0, 0), (4, 20_000_000, 100_000_000)] {
        etas = (running(), running());
        by_sealed.queue_etas(&mut etas.0, &EndedBytes::new(), Some(&wire(sent)), t * S);
        let ended = EndedBytes::from([(Role::Edge, ended)]);
        by_raw.queue_etas(&mut etas.1, &ended, None, t * S);
    }
    // E's 20 MB sealed at 5 MB/s: 4 s; then F's 30 MB raw at the node's 4x: 7.5 MB more.
    assert_eq!((etas.0[0].eta_s, etas.0[1].eta_s), (Some(4.0), Some(5.5)));
    // Counted in raw bytes at the first batches' 25 MB/s, E read 2.4 s: 40 % short.
    assert_eq!(etas.1[0].eta_s, Some(2.4));
}

#[test]
fn a_batch_whose_data_changes_is_timed_by_the_estimate_of_what_it_has_not_prepared() {
    // As K of the test set: 60 MB raw, its first 20 MB prepared and sealed to 5 MB (a
    // quarter: the windows said a half at zstd's fastest level), the other 40 MB estimated
    // at 0.9 (0.45 at the level in use: 18 MB). The link carries 5 MB/s.
    let k = BatchWire {
        estimated_left: (40_000_000, 36_000_000),
        estimated_prepared: (10_000_000, 5_000_000),
        ..prepared(&[("k", 20_000_000, 5_000_000, 20_000_000)])["k"]
    };
    let wire = |sent: u64, k: BatchWire| WireView {
        sent,
        prepared_raw: 20_000_000,
        prepared_sealed: 5_000_000,
        batches: HashMap::from([("k".to_owned(), k)]),
        waiting: vec![part("k", 0, None)],
        ..WireView::default()
    };
    let eta = |k: BatchWire| {
        edge_etas(Order::AsBegun, &[("k", 1, 60_000_000)], |sent| {
            wire(sent, k)
        })[0]
    };
    // 5 MB waiting and 18 MB to come: 4.6 s.
    assert_eq!(eta(k), Some(4.6));
    // At its compression so far the 40 MB would seal to 10 MB: 3 s, a third short.
    let unestimated = BatchWire {
        estimated_left: (0, 0),
        estimated_prepared: (0, 0),
        ..k
    };
    assert_eq!(eta(unestimated), Some(3.0));
}

#[test]
fn a_batchs_first_parts_are_weighed_against_the_nodes_scale_before_they_time_its_rest() {
    // N's first part (4 MB raw) sealed to 1.5 × the estimate; the node's parts so far to
    // the estimate. Its other 60 MB raw are estimated at 24 MB.
    let n = BatchWire {
        estimated_left: (60_000_000, 24_000_000),
        estimated_prepared: (4_000_000, 6_000_000),
        ..prepared(&[("n", 4_000_000, 6_000_000, 4_000_000)])["n"]
    };
    let wire = |sent: u64| WireView {
        sent,
        prepared_raw: 64_000_000,
        prepared_sealed: 64_000_000,
        estimated_prepared: (64_000_000, 64_000_000),
        batches: HashMap::from([("n".to_owned(), n)]),
        waiting: vec![part("n", 0, None)],
        ..WireView::default()
    };
    let eta = edge_etas(Order::AsBegun, &[("n", 1, 64_000_000)], wire)[0].unwrap();
    // Its scale: (6 + 8 MB at the node's 1.0) / (4 + 8 MB) = 1.17, so 28 MB to come beside
    // the 5 MB waiting: 6.6 s at 5 MB/s (at its first part's 1.5 alone, 41 MB: 8.2 s).
    assert!((eta - 6.6).abs() < 1e-9, "{eta}");
}

#[test]
fn a_batch_prepared_whole_is_done_once_the_parts_prepared_before_its_last_have_gone() {
    // E's parts were prepared 1st and 3rd, F's 2nd and 4th: the uploads take them in that
    // order, so E waits for F's first part too (15 MB at 5 MB/s), F for all four.
    let wire = |sent: u64| WireView {
        sent,
        resumed: None,
        prepared_raw: 40_000_000,
        prepared_sealed: 20_000_000,
        batches: prepared(&[
            ("e", 20_000_000, 10_000_000, 20_000_000),
            ("f", 20_000_000, 10_000_000, 20_000_000),
        ]),
        waiting: [
            part("e", 0, None),
            part("f", 1, None),
            part("e", 2, None),
            part("f", 3, None),
        ]
        .into(),
        ..WireView::default()
    };
    let running = [("e", 1, 20_000_000), ("f", 1, 20_000_000)];
    let etas = edge_etas(Order::LeastRemaining, &running, wire);
    assert_eq!(etas, [Some(3.0), Some(4.0)]);
}

#[test]
fn a_last_part_sent_beside_others_takes_its_share_of_the_link() {
    // E's last part (5 MB, prepared 4th) and F's next three (5 MB each) were all taken by
    // the uploads at 4 s, each getting a quarter of the 5 MB/s; F's last part waits.
    let wire = |sent: u64| WireView {
        sent,
        batches: prepared(&[
            ("e", 20_000_000, 10_000_000, 20_000_000),
            ("f", 40_000_000, 20_000_000, 40_000_000),
        ]),
        waiting: vec![
            part("e", 3, Some(0)),
            part("f", 4, Some(0)),
            part("f", 5, Some(0)),
            part("f", 6, Some(0)),
            part("f", 7, None),
        ],
        ..WireView::default()
    };
    let etas = edge_etas(
        Order::AsBegun,
        &[("e", 1, 20_000_000), ("f", 1, 40_000_000)],
        wire,
    );
    // E's part ends with the three beside it: 20 MB of the link, 4 s (counted alone, its
    // own 5 MB: 1 s). F's last part then goes alone: 1 s more.
    assert_eq!(etas, [Some(4.0), Some(5.0)]);
}

#[test]
fn parts_still_to_prepare_take_the_slots_that_free_up_beside_a_batchs_last_part() {
    // E's two parts, 1 MB and 5 MB, both taken by the uploads at 4 s; G has 20 MB still to
    // prepare, whose parts (3 MB, as large as those waiting) take each slot that frees up.
    let wire = |sent: u64| WireView {
        sent,
        prepared_raw: 6_000_000,
        prepared_sealed: 6_000_000,
        batches: prepared(&[("e", 6_000_000, 6_000_000, 6_000_000)]),
        waiting: vec![
            WaitingPart {
                sealed: 1_000_000,
                ..part("e", 0, Some(0))
            },
            part("e", 1, Some(0)),
        ],
        ..WireView::default()
    };
    let etas = edge_etas(
        Order::AsBegun,
        &[("e", 1, 6_000_000), ("g", 2, 20_000_000)],
        wire,
    );
    // 1 MB each until the small part ends; then 4 MB left beside a 3-MB part of G, and 1 MB
    // beside the next: 10 MB of the link, 2 s (alone once the small part ended: 1.2 s).
    assert_eq!(etas[0], Some(2.0));
}

#[test]
fn the_last_part_of_a_batch_still_being_prepared_shares_the_link_with_the_parts_after_it() {
    // E's four parts and F's first four (5 MB each) are all being uploaded, eight at once;
    // F has 20 MB raw still to prepare, 10 MB sealed at its compression so far, and G,
    // served after it, 100 MB.
    let wire = |sent: u64| WireView {
        sent,
        prepared_raw: 80_000_000,
        prepared_sealed: 40_000_000,
        batches: prepared(&[
            ("e", 40_000_000, 20_000_000, 40_000_000),
            ("f", 40_000_000, 20_000_000, 40_000_000),
        ]),
        waiting: (0..8)
            .map(|seq| part(if seq < 4 { "e" } else { "f" }, seq, Some(0)))
            .collect(),
        ..WireView::default()
    };
    let (e, f, g) = (
        ("e", 1, 40_000_000),
        ("f", 2, 60_000_000),
        ("g", 3, 100_000_000),
    );
    let etas = edge_etas(Order::AsBegun, &[e, f, g], wire);
    // The 40 MB waiting, F's 10 MB to come, and what the seven uploads beside its last
    // part get of G's parts while it is sent, half a part each: 67.5 MB at 5 MB/s (counted
    // alone, 50 MB: 10 s).
    assert_eq!(etas[1], Some(13.5));
    // Without G nothing is left to take the slots beside F's last part.
    assert_eq!(edge_etas(Order::AsBegun, &[e, f], wire)[1], Some(10.0));
}

#[test]
fn the_edge_rate_runs_from_when_the_link_got_busy_and_uploads_under_way_count_what_they_sent() {
    // Looked at 0 s, nothing prepared; the first part prepared at 3 s; at 5 s the uploads'
    // connections have taken 10 MB (5 MB/s since 3 s, where the looks alone say 2 MB/s).
    // E waits with four 5 MB parts, the first two being uploaded: their connections have
    // taken 2.5 MB and 1.25 MB of them.
    let progress = Progress::new(16 << 20, Order::AsBegun);
    progress.queue_etas(&mut [], &EndedBytes::new(), Some(&WireView::default()), 0);
    let wire = WireView {
        sent: 10_000_000,
        resumed: Some((3 * S, 0)),
        prepared_raw: 60_000_000,
        prepared_sealed: 30_000_000,
        batches: prepared(&[("e", 40_000_000, 20_000_000, 40_000_000)]),
        waiting: vec![
            part("e", 0, Some(2_500_000)),
            part("e", 1, Some(1_250_000)),
            part("e", 2, None),
            part("e", 3, None),
        ],
        ..WireView::default()
    };
    let mut running = [sending("e", 1, 40_000_000, 0)];
    progress.queue_etas(&mut running, &EndedBytes::new(), Some(&wire), 5 * S);
    // 16.25 MB left at 5 MB/s.
    assert_eq!(running[0].eta_s, Some(3.25));
}

const S: i64 = 1_000_000;

#[test]
fn a_running_batchs_rate_leaves_out_the_time_before_it_moved_and_follows_changes() {
    let progress = Progress::new(16 << 20, Order::AsBegun);
    // Read ahead for 10 s while the batch before it uploads: nothing done, no rate.
    for t in 0..=10 {
        assert_eq!(progress.windowed_rate("b", t * S, 0), None, "at {t} s");
    }
    // Then 10 MB/s, in bursts of 20 MB every 2 s: 10 MB/s from when it began to move,
    // where the mean since the stage began (at 0 s) says 40e6 / 14 s = 2.9 MB/s.
    let mut rate = None;
    for t in (12..=14).step_by(2) {
        rate = progress.windowed_rate("b", t * S, (t - 10) * 10_000_000);
    }
    assert_eq!(rate, Some(10e6));
    // The link slows to 5 MB/s at 20 s: 30 s later the window sees only the new rate.
    for t in 15..=50 {
        let done = if t <= 20 {
            (t - 10) * 10_000_000
        } else {
            100_000_000 + (t - 20) * 5_000_000
        };
        rate = progress.windowed_rate("b", t * S, done);
    }
    assert_eq!(rate, Some(5e6));
    // A batch that no longer runs is forgotten.
    progress.queue_etas(&mut [], &EndedBytes::new(), None, 60 * S);
    assert!(progress.seen.lock().batches.is_empty());
}
