//! Grouping small files into bundles ([`forte_format::bundle`]): one object, one part, one
//! upload and one seal for many files.

use std::collections::HashMap;
use std::path::PathBuf;

use forte_format::bundle::{header_len, member_len, END_OF_ARCHIVE};
use forte_format::{Kind, ObjectId};

use crate::source::SourceFile;
use crate::stages::PrepareJob;

/// Which files go into bundles, and how large a bundle grows.
#[derive(Debug, Clone, Copy)]
pub struct BundleLimits {
    /// Files smaller than this are bundled; 0 bundles nothing.
    pub below: u64,
    /// A bundle's tar stream stops growing at about this many bytes (one part in memory).
    pub bytes: u64,
    /// And at this many members, which bounds its manifest (about 250 bytes per member).
    pub members: usize,
}

impl BundleLimits {
    /// Files under 1 MiB, in bundles of up to 4 MiB and 4 096 files.
    pub const DEFAULT: Self = Self {
        below: 1 << 20,
        bytes: 4 << 20,
        members: 4096,
    };
}

/// Replaces the small files among `jobs` by bundles of them, in the order given (discovery's,
/// by path), each named by `bundle_id` of its members' ids, so that the same files give the
/// same bundles again and a second run resumes them. Files with parts already at the relay,
/// empty directories and large files stay objects of their own, as does a file that would be
/// alone in its bundle.
pub fn bundle_small(
    jobs: Vec<PrepareJob>,
    limits: BundleLimits,
    bundle_id: &dyn Fn(&[ObjectId]) -> ObjectId,
) -> Vec<PrepareJob> {
    let mut out = Vec::with_capacity(jobs.len());
    let mut open: Vec<PrepareJob> = Vec::new();
    let mut open_len = END_OF_ARCHIVE;
    for job in jobs {
        let small = job.source.kind == Kind::File
            && job.source.size < limits.below
            && job.held.is_empty()
            && job.members.is_empty();
        if !small {
            out.push(job);
            continue;
        }
        let len = member_len(&job.source.path, job.source.size);
        if !open.is_empty() && (open_len + len > limits.bytes || open.len() >= limits.members) {
            out.push(close(std::mem::take(&mut open), bundle_id));
            open_len = END_OF_ARCHIVE;
        }
        open_len += len;
        open.push(job);
    }
    if !open.is_empty() {
        out.push(close(open, bundle_id));
    }
    out
}

/// Puts the files an earlier run bundled (`earlier` gives the object a file's id travelled in)
/// back into the same bundles, where every member is still here unchanged: the bundle's id,
/// derived from its members' ids, comes out the same, so a late file or an interrupted deletion
/// does not regroup, and send again, what was sent. Returns those bundles, and the jobs left
/// for [`bundle_small`] in their order.
pub fn bundle_as_before(
    jobs: Vec<PrepareJob>,
    earlier: &dyn Fn(ObjectId) -> Option<ObjectId>,
    bundle_id: &dyn Fn(&[ObjectId]) -> ObjectId,
) -> (Vec<PrepareJob>, Vec<PrepareJob>) {
    let bundled_before = |job: &PrepareJob| {
        let file = job.source.kind == Kind::File && job.members.is_empty();
        earlier(job.id).filter(|bundle| file && *bundle != job.id)
    };
    let mut groups: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
    for job in &jobs {
        if let Some(bundle) = bundled_before(job) {
            groups.entry(bundle).or_default().push(job.id);
        }
    }
    groups.retain(|bundle, members| members.len() > 1 && bundle_id(members) == *bundle);
    let (mut order, mut members) = (Vec::new(), HashMap::<ObjectId, Vec<PrepareJob>>::new());
    let mut rest = Vec::new();
    for job in jobs {
        match bundled_before(&job).filter(|bundle| groups.contains_key(bundle)) {
            Some(bundle) => {
                let group = members.entry(bundle).or_default();
                if group.is_empty() {
                    order.push(bundle);
                }
                group.push(job);
            }
            None => rest.push(job),
        }
    }
    let bundles = order
        .into_iter()
        .map(|bundle| close(members.remove(&bundle).unwrap_or_default(), &|_| bundle))
        .collect();
    (bundles, rest)
}

/// One bundle of `members`, or the member itself when it is alone.
fn close(mut members: Vec<PrepareJob>, bundle_id: &dyn Fn(&[ObjectId]) -> ObjectId) -> PrepareJob {
    if members.len() == 1 {
        return members.pop().expect("one");
    }
    let ids: Vec<ObjectId> = members.iter().map(|m| m.id).collect();
    let id = bundle_id(&ids);
    let newest = members
        .iter()
        .map(|m| (m.source.mtime_s, m.source.mtime_ns))
        .max()
        .unwrap_or_default();
    let (batch, origin) = (members[0].batch.clone(), members[0].origin.clone());
    // Each member's data starts after its header; the next member's header after its padding.
    let mut end = 0;
    let members: Vec<BundleMember> = members
        .into_iter()
        .map(|m| {
            let offset = end + header_len(&m.source.path);
            end += member_len(&m.source.path, m.source.size);
            BundleMember {
                source: m.source,
                id: m.id,
                offset,
            }
        })
        .collect();
    let size = end + END_OF_ARCHIVE;
    PrepareJob {
        source: SourceFile {
            local: PathBuf::new(),
            path: format!("bundle-{id}.tar"),
            kind: Kind::Bundle,
            size,
            mode: 0o644,
            mtime_s: newest.0,
            mtime_ns: newest.1,
        },
        id,
        batch,
        origin,
        held: Default::default(),
        members,
        part_size: None,
    }
}

/// A file inside a bundle job.
#[derive(Debug, Clone)]
pub struct BundleMember {
    pub source: SourceFile,
    pub id: ObjectId,
    /// Where its bytes start in the bundle's tar stream (after its header).
    pub offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(path: &str, size: u64) -> PrepareJob {
        PrepareJob::fresh(SourceFile {
            local: PathBuf::from(path),
            path: path.into(),
            kind: Kind::File,
            size,
            mode: 0o644,
            mtime_s: 1,
            mtime_ns: 0,
        })
    }

    /// A bundle id derived from its members' ids, as the edge derives them.
    fn derive(ids: &[ObjectId]) -> ObjectId {
        let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let names: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
        ObjectId::derive(b"k", &names)
    }

    #[test]
    fn small_files_share_bundles_up_to_the_limits_and_large_ones_stay_alone() {
        let limits = BundleLimits {
            below: 1000,
            bytes: 4 * 1024,
            members: 3,
        };
        let jobs = vec![
            job("a", 10),
            job("big", 5000),
            job("b", 10),
            job("c", 10),
            job("d", 10),
            job("e", 999),
        ];
        let out = bundle_small(jobs, limits, &|_| ObjectId::random());
        let shape: Vec<Vec<&str>> = out
            .iter()
            .map(|j| match j.source.kind {
                Kind::Bundle => j.members.iter().map(|m| m.source.path.as_str()).collect(),
                _ => vec![j.source.path.as_str()],
            })
            .collect();
        // Three members at most; "d" and "e" (1024 + 1536 bytes of tar plus the end) fit one.
        assert_eq!(shape, [vec!["big"], vec!["a", "b", "c"], vec!["d", "e"]]);
        let b = &out[1];
        assert_eq!(b.source.size, 3 * 1024 + 1024);
    }

    #[test]
    fn a_file_alone_is_not_bundled_and_ids_follow_the_members() {
        let limits = BundleLimits::DEFAULT;
        let out = bundle_small(vec![job("a", 1)], limits, &|_| ObjectId::random());
        assert_eq!(out[0].source.kind, Kind::File);
        let jobs = || vec![job("a", 1), job("b", 2)];
        let first = bundle_small(jobs(), limits, &derive);
        let again = bundle_small(
            first[0]
                .members
                .iter()
                .map(|m| PrepareJob {
                    id: m.id,
                    ..job(&m.source.path, m.source.size)
                })
                .collect(),
            limits,
            &derive,
        );
        assert_eq!(first[0].id, again[0].id);
    }

    /// A late file or a deleted member must not regroup what was bundled before: whole
    /// bundles come back as they were, and only what is left is bundled afresh.
    #[test]
    fn files_bundled_before_go_back_into_the_same_bundles_while_all_are_here() {
        let limits = BundleLimits::DEFAULT;
        let small = BundleLimits {
            members: 2,
            ..limits
        };
        let files = [job("a", 1), job("b", 1), job("c", 1), job("d", 1)];
        let sent = bundle_small(files.to_vec(), small, &derive);
        assert_eq!(sent.len(), 2, "a+b and c+d");
        let carrier: HashMap<ObjectId, ObjectId> = sent
            .iter()
            .flat_map(|b| b.members.iter().map(|m| (m.id, b.id)))
            .collect();
        // A late file before the others, and "d" deleted once acknowledged.
        let now = vec![
            job("0-late", 1),
            files[0].clone(),
            files[1].clone(),
            files[2].clone(),
        ];
        let (kept, rest) = bundle_as_before(now, &|id| carrier.get(&id).copied(), &derive);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].id, sent[0].id, "a+b is the same bundle");
        let rest: Vec<&str> = rest.iter().map(|j| j.source.path.as_str()).collect();
        assert_eq!(rest, ["0-late", "c"], "c's bundle lost a member");
    }
}
