//! The lists over every catalogue a view reads: batches, files, failures and usage, and the
//! first catalogue that knows a batch.

use anyhow::Result;
use forte_catalog::{BatchKey, Catalog, Filter, UsageRow};

use super::phase::journey_of;
use super::{Batch, BatchDetail, FailureView, File, Progress, HOUR_US};

/// Batches over every catalogue that the filter selects, newest change first.
pub fn batches(catalogs: &[Catalog], filter: &Filter, progress: &Progress) -> Result<Vec<Batch>> {
    let now = forte_catalog::now_us();
    let mut all = vec![];
    for (index, catalog) in catalogs.iter().enumerate() {
        let mut mine = vec![];
        for row in catalog.batches_matching(filter)? {
            let mut batch = Batch::of(catalog, row, progress, now)?;
            batch.catalog = index;
            mine.push(batch);
        }
        // A running batch's ETA is the one its node published, as everywhere else.
        progress.show_published(catalog, &mut mine, now)?;
        all.extend(mine);
    }
    all.sort_by_key(|b| std::cmp::Reverse(b.updated_us));
    if let Some(limit) = filter.limit {
        all.truncate(limit.max(0) as usize);
    }
    Ok(all)
}

/// Files over every catalogue that the filter selects, newest change first.
pub fn files(catalogs: &[Catalog], filter: &Filter) -> Result<Vec<File>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(catalog.files_matching(filter)?.into_iter().map(File::from));
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.updated_us));
    if let Some(limit) = filter.limit {
        all.truncate(limit.max(0) as usize);
    }
    Ok(all)
}

/// The newest failures over every catalogue.
pub fn failures(catalogs: &[Catalog], limit: i64) -> Result<Vec<FailureView>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(
            catalog
                .failures(None, limit)?
                .into_iter()
                .map(FailureView::from),
        );
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.at_us));
    all.truncate(limit.max(0) as usize);
    Ok(all)
}

/// The batch `key` in the catalogue `in_catalog` (an index into `catalogs`: two edges'
/// catalogues may hold a batch of one id), else in the first catalogue that knows it, with its
/// detail and its phase over them all.
pub fn batch(
    catalogs: &[Catalog],
    key: &BatchKey,
    in_catalog: Option<usize>,
    progress: &Progress,
) -> Result<Option<BatchDetail>> {
    let asked = |index: &usize| in_catalog.is_none_or(|wanted| wanted == *index);
    for (index, catalog) in catalogs.iter().enumerate().filter(|(i, _)| asked(i)) {
        if let Some(mut detail) = BatchDetail::read(catalog, key, progress)? {
            detail.batch.catalog = index;
            // Where it is on its way, from every catalogue's rows of it.
            if let Some(journey) = journey_of(catalogs, index, key)? {
                detail.batch.phase = journey.phase();
                detail.batch.receipted = journey.receipted;
                if detail.batch.site.is_empty() {
                    detail.batch.site = journey.site;
                }
            }
            return Ok(Some(detail));
        }
    }
    Ok(None)
}

/// Utilisation samples since `since` (µs) over every catalogue, oldest first.
pub fn usage(catalogs: &[Catalog], since: i64) -> Result<Vec<UsageRow>> {
    let mut all = vec![];
    for catalog in catalogs {
        all.extend(catalog.usage_of(None, since)?);
    }
    all.sort_by_key(|u| u.at);
    Ok(all)
}

/// The last hour, in µs before now.
pub fn hour_ago() -> i64 {
    forte_catalog::now_us() - HOUR_US
}

/// The last day, in µs before now: what the report covers unless told otherwise.
pub fn day_ago() -> i64 {
    forte_catalog::now_us() - 24 * HOUR_US
}

#[cfg(test)]
mod tests {
    use forte_catalog::{BatchKey, BatchRecord, BatchState};

    use super::*;
    use crate::model::Order;

    /// The list of batches shows a running batch's ETA as its node published it, as the
    /// overview and the batch's page do (the review of issue 46 found the list working out
    /// its own: 150 s where the sender had published 12 s).
    #[test]
    fn the_list_shows_the_published_eta() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("edge.sqlite").to_str().unwrap()).unwrap();
        let key = BatchKey::edge("0a1b");
        let record = BatchRecord {
            key: &key,
            name: "run-9",
            files: 1,
            bytes: 40_000_000,
            state: BatchState::Sending,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&record).unwrap();
        catalog.flush().unwrap();
        let now = forte_catalog::now_us();
        catalog.publish_etas(now, &[(key, 12.0)]).unwrap();
        let progress = Progress::new(1 << 20, Order::AsBegun);
        let listed = batches(
            std::slice::from_ref(&catalog),
            &Filter::default(),
            &progress,
        )
        .unwrap();
        let eta = listed[0].eta_s.expect("an ETA");
        assert!((11.0..=12.0).contains(&eta), "{eta}");
    }
}
