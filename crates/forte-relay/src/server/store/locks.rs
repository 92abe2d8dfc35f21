//! One lock per object being written or sealed: a seal checks the parts held and writes its
//! record with no part of the object written in between, so parts and manifest never disagree
//! (in this process; relays sharing a bucket rely on create-only records).

use std::collections::HashMap;
use std::sync::Arc;

use forte_format::ObjectId;
use parking_lot::Mutex;

/// An object of a site, as a lock is kept for it.
type ObjectKey = (String, ObjectId);

/// The locks of the objects being written or sealed now; see the module's documentation.
#[derive(Default)]
pub(super) struct ObjectLocks {
    held: Mutex<HashMap<ObjectKey, Arc<Mutex<()>>>>,
}

/// The lock of one object, held while a part of it is written or it is sealed; dropped from
/// the map by the last holder.
pub(super) struct ObjectGuard<'s> {
    locks: &'s ObjectLocks,
    key: ObjectKey,
    lock: Arc<Mutex<()>>,
}

impl ObjectLocks {
    /// The lock of object `id` of `site`, to [`ObjectGuard::hold`].
    pub(super) fn of(&self, site: &str, id: ObjectId) -> ObjectGuard<'_> {
        let key = (site.to_string(), id);
        let lock = self.held.lock().entry(key.clone()).or_default().clone();
        ObjectGuard {
            locks: self,
            key,
            lock,
        }
    }
}

impl ObjectGuard<'_> {
    /// Runs `f` holding the object's lock.
    pub(super) fn hold<T>(&self, f: impl FnOnce() -> T) -> T {
        let _held = self.lock.lock();
        f()
    }
}

impl Drop for ObjectGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.locks.held.lock();
        // The map's own reference and this guard's: nobody else waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}
