//! Steps 2 to 5: sample data packed and unpacked without a network, then compared.

use std::path::Path;

use anyhow::{bail, Result};
use forte_core::unpack::unpack;
use forte_daemon::settings::{CoreSettings, EdgeSettings, TrustedKeys};
use forte_daemon::units::human;
use forte_edge::pack::pack;
use forte_format::keys::KeyPaths;
use forte_format::{EdgeKey, Identities, Recipients, TrustSpec};
use forte_prepare::{BundleLimits, PrepareConfig};
use forte_restore::RestoreConfig;

use crate::data::{tree_digest, write_sample};

/// Steps 2 to 5: sample data packed and unpacked without a network, then compared.
pub(crate) fn offline(root: &Path, paths: &KeyPaths) -> Result<()> {
    let (sample, packed, restored) = (
        root.join("sample"),
        root.join("packed"),
        root.join("restored"),
    );
    let bytes = write_sample(&sample)?;
    println!(
        "2. sample data: {} of sensor recordings in {}",
        human(bytes),
        sample.display()
    );

    let edge = EdgeSettings {
        recipients: Recipients::load(&paths.core_pub)?,
        key: EdgeKey::load(&paths.edge_key)?,
        prepare: PrepareConfig::for_this_machine(),
        bundle: BundleLimits::DEFAULT,
        filter: Default::default(),
    };
    let summary = pack(&sample, &packed, "sample", edge, true)?;
    println!(
        "3. pack: {} files and {} empty directories in one pass (hash, zstd -{}, age, hash) into {} objects ({} bundles of small files) in {}: {:.1} MB/s, ratio {:.2}",
        summary.files,
        summary.directories,
        summary.level,
        summary.stored_objects,
        summary.bundles,
        packed.display(),
        summary.raw_mb_per_s,
        summary.ratio
    );
    if summary.failed > 0 {
        bail!("{} files failed to pack", summary.failed);
    }

    let core = CoreSettings {
        identities: Identities::load(&paths.core_key)?,
        trusted: TrustedKeys::load(vec![TrustSpec::any_site(&paths.edge_pub)], None)?,
        restore: RestoreConfig::for_this_machine(),
    };
    let (delivered, _) = unpack(&packed, &restored, core, true)?;
    println!(
        "4. unpack: verified ciphertext hashes, signatures, AEAD and raw hashes; restored {} files and {} empty directories into {}",
        delivered.files,
        delivered.directories,
        restored.display()
    );

    let before = tree_digest(&sample)?;
    let after = tree_digest(&restored)?;
    if before != after {
        bail!("restored tree differs from the sample: this is a bug, please report it");
    }
    println!(
        "5. compare: all {} entries identical to the source (SHA-256 of every file, mtimes, empty directories)",
        before.len()
    );
    println!(
        "   try: age -d -i {} {}/<id>/part-000000.zst.age | zstd -d | head",
        paths.core_key.display(),
        packed.display()
    );
    Ok(())
}
