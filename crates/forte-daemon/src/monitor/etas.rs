//! The one ETA of each running batch: the daemon running it works it out every
//! [`PUBLISH_EVERY`] (with what only it knows, the parts on its wire) and publishes it in its
//! catalogue, where its own page, `forte dashboard` and the terminal's bar read it back.

use forte_catalog::{BatchKey, Catalog, Role};
use forte_view::model::{Order, Overview, Progress, PUBLISH_EVERY, RUNNING};

/// Publishes `role`'s running batches' ETAs from `catalog` on a thread of its own, for as long
/// as the process runs. Counted as the dashboard counts: parts of `part_size`, batches in
/// `order`.
pub fn publish_etas(role: Role, catalog: &Catalog, part_size: u64, order: Order) {
    let catalog = catalog.reader();
    let progress = Progress::publisher(part_size, order);
    let publish = move || loop {
        // Nothing running, nothing to estimate: an idle daemon reads no history.
        if !catalog.any_batch_in(&RUNNING).unwrap_or(true) {
            std::thread::sleep(PUBLISH_EVERY);
            continue;
        }
        let wire = match role {
            Role::Edge => super::wire_view(),
            Role::Core => None,
        };
        let now = forte_catalog::now_us();
        let read = Overview::read(
            std::slice::from_ref(&catalog),
            vec![],
            None,
            wire,
            &progress,
        );
        let etas: Vec<(BatchKey, f64)> = read
            .map(|o| o.in_flight)
            .unwrap_or_default()
            .into_iter()
            .filter(|b| b.role == role && b.running)
            .filter_map(|b| Some((BatchKey::parse(&b.key), b.eta_s?)))
            .collect();
        if !etas.is_empty() {
            if let Err(e) = catalog.publish_etas(now, &etas) {
                tracing::debug!("the ETAs were not published this time: {e:#}");
            }
        }
        std::thread::sleep(PUBLISH_EVERY);
    };
    if let Err(e) = std::thread::Builder::new()
        .name("forte-eta".into())
        .spawn(publish)
    {
        tracing::warn!("the ETAs are not published (each view works out its own): {e}");
    }
}
