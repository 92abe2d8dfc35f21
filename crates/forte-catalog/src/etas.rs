//! The ETA of each running batch as the node running it last worked it out: one estimate
//! that every view (the daemon's page, `forte dashboard`, the terminal's bar) shows, counted
//! down from when it was made, instead of one per view from what each view happens to see.

use std::collections::HashMap;

use anyhow::{Context, Result};
use sqlx::Row;

use crate::{BatchKey, Catalog};

/// An ETA as published: when it was worked out (µs since the epoch) and the seconds left then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublishedEta {
    pub at: i64,
    pub eta_s: f64,
}

impl Catalog {
    /// Publishes the ETAs of running batches, worked out at `at`.
    pub fn publish_etas(&self, at: i64, etas: &[(BatchKey, f64)]) -> Result<()> {
        self.runtime
            .block_on(async {
                let mut tx = self.pool.begin().await?;
                for (key, eta_s) in etas {
                    sqlx::query(
                        "INSERT INTO batch_etas (batch_key, at, eta_s) VALUES ($1, $2, $3)
                         ON CONFLICT (batch_key) DO UPDATE SET at = excluded.at, eta_s = excluded.eta_s",
                    )
                    .bind(key.to_string())
                    .bind(at)
                    .bind(*eta_s)
                    .execute(&mut *tx)
                    .await?;
                }
                // Those of batches no longer running are history, not estimates.
                sqlx::query("DELETE FROM batch_etas WHERE at < $1")
                    .bind(at - 60_000_000)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            })
            .with_context(|| format!("cannot publish ETAs in the catalogue {}", self.url))
    }

    /// The ETAs published, by batch key.
    pub fn published_etas(&self) -> Result<HashMap<String, PublishedEta>> {
        let rows = self
            .runtime
            .block_on(
                sqlx::query("SELECT batch_key, at, eta_s FROM batch_etas").fetch_all(&self.pool),
            )
            .with_context(|| format!("cannot read ETAs from the catalogue {}", self.url))?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0)?,
                    PublishedEta {
                        at: r.try_get(1)?,
                        eta_s: r.try_get(2)?,
                    },
                ))
            })
            .collect()
    }
}
