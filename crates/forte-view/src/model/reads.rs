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
    for catalog in catalogs {
        for row in catalog.batches_matching(filter)? {
            all.push(Batch::of(catalog, row, progress, now)?);
        }
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

/// The first catalogue that knows the batch `key`, with its detail and its phase over them all.
pub fn batch(
    catalogs: &[Catalog],
    key: &BatchKey,
    progress: &Progress,
) -> Result<Option<BatchDetail>> {
    for (index, catalog) in catalogs.iter().enumerate() {
        if let Some(mut detail) = BatchDetail::read(catalog, key, progress)? {
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
        all.extend(
            catalog
                .usage_of(None)?
                .into_iter()
                .filter(|u| u.at >= since),
        );
    }
    all.sort_by_key(|u| u.at);
    Ok(all)
}

/// The last hour, in µs before now.
pub fn hour_ago() -> i64 {
    forte_catalog::now_us() - HOUR_US
}
