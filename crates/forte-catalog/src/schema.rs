//! The schema: one migration per entry, applied in order and recorded in `forte_migrations`.
//! Append a migration for a change; never edit one that was released.

use sqlx::{AnyConnection, Executor, Row};

use crate::now_us;

/// The schema, one migration per entry, applied in order and recorded in `forte_migrations`.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE batches (
        batch_key TEXT PRIMARY KEY,
        role TEXT NOT NULL,
        site TEXT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        files BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    CREATE TABLE files (
        object_id TEXT NOT NULL,
        batch_key TEXT NOT NULL,
        path TEXT NOT NULL,
        size BIGINT NOT NULL,
        raw_sha256 TEXT,
        delivered_to TEXT,
        state TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (batch_key, object_id)
    );
    CREATE INDEX files_by_object ON files (object_id);
    CREATE INDEX files_by_path ON files (path);
    CREATE TABLE parts (
        object_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        raw_sha256 TEXT,
        ciphertext_sha256 TEXT,
        ciphertext_length BIGINT,
        state TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (object_id, idx)
    );
    CREATE TABLE events (
        id TEXT PRIMARY KEY,
        at BIGINT NOT NULL,
        batch_key TEXT NOT NULL,
        object_id TEXT,
        part BIGINT,
        state TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_by_object ON events (object_id, at);
    CREATE TABLE attempts (
        id TEXT PRIMARY KEY,
        task TEXT NOT NULL,
        batch_key TEXT NOT NULL,
        object_id TEXT,
        part BIGINT,
        started_at BIGINT NOT NULL,
        ended_at BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        error TEXT
    );
    CREATE TABLE stages (
        batch_key TEXT NOT NULL,
        stage TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        ended_at BIGINT,
        PRIMARY KEY (batch_key, stage)
    )",
    // 2: resource utilisation, sampled once a second on each node.
    "CREATE TABLE usage (
        node TEXT NOT NULL,
        at BIGINT NOT NULL,
        seconds DOUBLE PRECISION NOT NULL,
        cpu_percent DOUBLE PRECISION NOT NULL,
        memory_used BIGINT NOT NULL,
        disk_read_bps DOUBLE PRECISION NOT NULL,
        disk_write_bps DOUBLE PRECISION NOT NULL,
        net_rx_bps DOUBLE PRECISION NOT NULL,
        net_tx_bps DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, at)
    )",
    // 3: the object that carries a file at the relay: its own, or the bundle it travels in.
    "ALTER TABLE files ADD COLUMN carrier TEXT",
    // 4: the send's tuning: the setting that worked per relay, size cluster and hour of day
    // (the next run's starting point), and every interval's setting and goodput (its
    // timeline).
    "CREATE TABLE tuning (
        relay TEXT NOT NULL,
        cluster TEXT NOT NULL,
        hour BIGINT NOT NULL,
        uploads BIGINT NOT NULL,
        goodput DOUBLE PRECISION NOT NULL,
        at BIGINT NOT NULL,
        PRIMARY KEY (relay, cluster, hour)
    );
    CREATE TABLE tuning_samples (
        node TEXT NOT NULL,
        at BIGINT NOT NULL,
        uploads BIGINT NOT NULL,
        level BIGINT NOT NULL,
        goodput DOUBLE PRECISION NOT NULL,
        reason TEXT,
        PRIMARY KEY (node, at)
    )",
    // 5: leases of core workers on batches (`claims`): who holds each batch, until when (the
    // database's clock, microseconds), and the attempt number that fences out older holders.
    "CREATE TABLE batch_claims (
        batch_key TEXT PRIMARY KEY,
        worker TEXT NOT NULL,
        attempt BIGINT NOT NULL,
        lease_until BIGINT NOT NULL,
        claimed_at BIGINT NOT NULL
    )",
    // 6, 7: forte's own share of the machine's CPU and its resident memory, beside the
    // machine's, in each utilisation sample (0 in samples taken before).
    "ALTER TABLE usage ADD COLUMN own_cpu_percent DOUBLE PRECISION NOT NULL DEFAULT 0",
    "ALTER TABLE usage ADD COLUMN own_memory BIGINT NOT NULL DEFAULT 0",
    // 8: the sampling process's parts' latency from read to sink (percentiles since it
    // started) in each utilisation sample (0 before).
    "ALTER TABLE usage ADD COLUMN latency_items BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN latency_p50_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN latency_p87_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN latency_p99_ms DOUBLE PRECISION NOT NULL DEFAULT 0",
    // 9: every try of a site's own task (`[[task]]`) on a batch or one of its files: when it
    // was queued, ran and ended, and how (its queueing and processing times, per task).
    "CREATE TABLE task_runs (
        id TEXT PRIMARY KEY,
        batch_key TEXT NOT NULL,
        task TEXT NOT NULL,
        object_id TEXT,
        try_number BIGINT NOT NULL,
        queued_at BIGINT NOT NULL,
        started_at BIGINT NOT NULL,
        ended_at BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX task_runs_by_batch ON task_runs (batch_key, started_at)",
    // 10: batch instances (`custody`): at the edge each instance it sealed (its id, the site's
    // sequence number) and the core's receipt once verified; at the core each instance it
    // delivered, the ids of its files and the receipt it signed, so a replay is known, an
    // object delivered before is never delivered again in another instance, and a sequence gap
    // is seen. And the process (HOST:PID) holding each lease, so a worker name already in use
    // by a live process is refused.
    "CREATE TABLE batch_instances (
        role TEXT NOT NULL,
        site TEXT NOT NULL,
        instance TEXT NOT NULL,
        sequence BIGINT NOT NULL,
        batch_key TEXT NOT NULL,
        content TEXT NOT NULL,
        objects TEXT NOT NULL,
        sealed_at BIGINT NOT NULL,
        recorded_at BIGINT NOT NULL,
        receipt TEXT,
        PRIMARY KEY (role, site, instance)
    );
    CREATE INDEX batch_instances_by_batch ON batch_instances (batch_key);
    ALTER TABLE batch_claims ADD COLUMN process TEXT",
    // The raw bytes per part an object was cut into, beside each uploaded part: a later run
    // resumes the object from its parts at the relay only at that size.
    "ALTER TABLE parts ADD COLUMN part_size BIGINT",
    // The ETA of each running batch as the node running it works it out (with what only it
    // knows: the parts on its wire), so that every view shows that one estimate.
    "CREATE TABLE batch_etas (
        batch_key TEXT PRIMARY KEY,
        at BIGINT NOT NULL,
        eta_s DOUBLE PRECISION NOT NULL
    )",
    // Each instance's place in its batch's history (`custody`): the edge's sequence epoch and
    // its first number, the instance's generation and the earlier instances it supersedes
    // (`INSTANCE:SEQUENCE:CONTENT`, space-separated), so the core never delivers an instance
    // older than one it knows and the gap check knows numbers replaced from numbers dropped.
    // And the edge's epoch per site: chosen at this catalogue's first seal for the site.
    "ALTER TABLE batch_instances ADD COLUMN epoch TEXT NOT NULL DEFAULT '';
    ALTER TABLE batch_instances ADD COLUMN epoch_from BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE batch_instances ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE batch_instances ADD COLUMN supersedes TEXT NOT NULL DEFAULT '';
    CREATE TABLE sequence_epochs (
        site TEXT PRIMARY KEY,
        epoch TEXT NOT NULL,
        first_sequence BIGINT NOT NULL,
        started_at BIGINT NOT NULL
    )",
    // A year of history costs what a day costs: every periodic read goes through an index.
    // Events by batch (a running batch's last change, a report's follow-ups); files by where
    // they were delivered (`status --file`) and by last change (the newest first, limited);
    // failures by their own partial indexes (the overview asks every second); usage by time
    // (windowed reads); and the files delivered but not yet acknowledged, which a pull
    // confirms at its start (partial: nearly every file is acknowledged).
    "CREATE INDEX events_by_batch ON events (batch_key, at);
    CREATE INDEX files_by_delivered_to ON files (delivered_to) WHERE delivered_to IS NOT NULL;
    CREATE INDEX files_by_updated ON files (updated_at);
    CREATE INDEX attempts_failed ON attempts (batch_key, ended_at) WHERE outcome = 'failed';
    CREATE INDEX task_runs_not_passed ON task_runs (batch_key, ended_at) WHERE outcome <> 'passed';
    CREATE INDEX events_failures ON events (batch_key, at)
        WHERE state IN ('failed', 'damaged', 'refused', 'quarantined') AND detail IS NOT NULL;
    CREATE INDEX usage_by_at ON usage (at);
    CREATE INDEX files_delivered ON files (batch_key, path) WHERE state = 'delivered';
    CREATE INDEX batch_instances_by_time ON batch_instances (role, recorded_at);
    CREATE INDEX batches_by_updated ON batches (updated_at);
    CREATE INDEX batches_by_site ON batches (site, updated_at);
    CREATE INDEX batches_by_state ON batches (state);
    CREATE TABLE usage_rollups (
        node TEXT NOT NULL,
        resolution_s BIGINT NOT NULL,
        at BIGINT NOT NULL,
        seconds DOUBLE PRECISION NOT NULL,
        cpu_percent DOUBLE PRECISION NOT NULL,
        memory_used BIGINT NOT NULL,
        disk_read_bps DOUBLE PRECISION NOT NULL,
        disk_write_bps DOUBLE PRECISION NOT NULL,
        net_rx_bps DOUBLE PRECISION NOT NULL,
        net_tx_bps DOUBLE PRECISION NOT NULL,
        own_cpu_percent DOUBLE PRECISION NOT NULL,
        own_memory BIGINT NOT NULL,
        latency_items BIGINT NOT NULL,
        latency_p50_ms DOUBLE PRECISION NOT NULL,
        latency_p87_ms DOUBLE PRECISION NOT NULL,
        latency_p99_ms DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, resolution_s, at)
    );
    CREATE INDEX usage_rollups_by_at ON usage_rollups (at)",
    // 15: a batch found by its name (`forte status --batch`), whatever its age; the tuning
    // timeline of a window (`forte report --since`).
    "CREATE INDEX batches_by_name ON batches (name, site);
    CREATE INDEX tuning_samples_by_at ON tuning_samples (at)",
];

/// Brings the schema up to date on `conn`, inside the caller's transaction.
pub(crate) async fn apply_migrations(
    conn: &mut AnyConnection,
) -> std::result::Result<(), sqlx::Error> {
    conn.execute("CREATE TABLE IF NOT EXISTS forte_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)")
        .await?;
    let applied: i64 = sqlx::query("SELECT COUNT(*) FROM forte_migrations")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        for statement in migration.split(';').filter(|s| !s.trim().is_empty()) {
            conn.execute(statement).await?;
        }
        sqlx::query("INSERT INTO forte_migrations (version, applied_at) VALUES ($1, $2)")
            .bind(i as i64 + 1)
            .bind(now_us())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
