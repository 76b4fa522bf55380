//! The newest version of each primary a driver has seen or written, so that no pass acts on an
//! older one (a watch cache behind the driver's own writes, or behind what it read).
//!
//! Rule: resourceVersions are opaque (API conventions), so the driver orders two versions of
//! an object only by what it knows for sure. A higher `metadata.generation` is newer (the spec
//! changed after). At the same generation a version is known current only when it is the one
//! the driver last wrote or read from the API server: until a pass is given that very version
//! (its watch cache has caught up; a watch delivers an object's versions in order), any other
//! version of that generation may be older, and the pass reads the object again (one GET)
//! instead of acting on it — unless it holds the same record of created children as that
//! version (a fingerprint of it is kept): the record is what a stale copy can lose, so a
//! version with the same record is as good to act on (someone's annotation on the object after
//! the driver's status write costs no request). A lower generation is older: read again too. Once caught up,
//! only the generation is remembered (a cache going back to an older generation, e.g. relisted
//! from a lagging API server, is still caught).
//!
//! This is what makes a stale cache safe for the owner's record of the children it created
//! ([`crate::apply::record`]): a pass given a primary from before the status write of a pass
//! that created children would not find them in its record, and could neither prune them nor
//! know them for its own.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;

/// More objects than this are forgotten at once (forgetting only gives up the check for them
/// until their next write or read).
const CAP: usize = 100_000;

/// What a driver knows of one object (by uid).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Known {
    /// The highest generation seen or written.
    generation: i64,
    /// The version last written or read from the API server (its generation and
    /// resourceVersion), until a pass is given it.
    pending: Option<(i64, String, u64)>,
}

/// Whether a pass may act on the primary it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// As new as anything the driver has seen or written of it (or unknown to it).
    Current,
    /// Older than (or not known to be as new as) a version the driver has seen or written:
    /// read it again.
    Stale,
}

/// The newest known version of each primary of one driver.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    known: Mutex<HashMap<String, Known>>,
}

fn version<K: Resource>(obj: &K) -> Option<(String, i64, String)> {
    let meta = obj.meta();
    Some((
        meta.uid.clone()?,
        meta.generation.unwrap_or(0),
        meta.resource_version.clone()?,
    ))
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Judges `obj`, the primary a pass was given, and remembers it as seen when current.
    /// `record` fingerprints `obj`'s record of created children (any constant for a kind
    /// without one).
    pub(crate) fn given<K: Resource>(&self, obj: &K, record: u64) -> Freshness {
        let Some((uid, generation, rv)) = version(obj) else {
            return Freshness::Current;
        };
        let mut known = self.lock();
        let Some(k) = known.get_mut(&uid) else {
            if known.len() >= CAP {
                known.clear();
            }
            known.insert(
                uid,
                Known {
                    generation,
                    pending: None,
                },
            );
            return Freshness::Current;
        };
        if generation < k.generation {
            return Freshness::Stale;
        }
        match &k.pending {
            Some((g, pending, r)) if *g == generation && *pending != rv && *r != record => {
                return Freshness::Stale;
            }
            _ => {}
        }
        k.generation = generation;
        k.pending = None;
        Freshness::Current
    }

    /// `obj` is the newest version there is: the answer of a write of the driver's, or a read
    /// from the API server.
    /// `record` fingerprints `obj`'s record of created children, as for [`Seen::given`].
    pub(crate) fn stored<K: Resource>(&self, obj: &K, record: u64) {
        let Some((uid, generation, rv)) = version(obj) else {
            return;
        };
        let mut known = self.lock();
        if known.len() >= CAP && !known.contains_key(&uid) {
            known.clear();
        }
        let k = known.entry(uid).or_default();
        if generation >= k.generation {
            k.generation = generation;
            k.pending = Some((generation, rv, record));
        }
    }

    /// The object `uid` is gone (its finalizer removed, or not found): forget it.
    pub(crate) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn at(generation: i64, rv: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                uid: Some("u".into()),
                generation: Some(generation),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_version_older_than_the_drivers_own_write_is_stale_until_the_cache_caught_up() {
        let seen = Seen::default();
        assert_eq!(seen.given(&at(2, "10"), 0), Freshness::Current);
        // The pass's status write met a conflict, re-read generation 3 and wrote it, with a
        // record (1) the versions before it lack (0).
        seen.stored(&at(3, "12"), 1);
        // The cache's generation 2, and its generation 3 from before the write: both older.
        assert_eq!(seen.given(&at(2, "10"), 0), Freshness::Stale);
        assert_eq!(seen.given(&at(3, "11"), 0), Freshness::Stale);
        // The written version itself: the cache caught up; what follows it is newer.
        assert_eq!(seen.given(&at(3, "12"), 1), Freshness::Current);
        assert_eq!(seen.given(&at(3, "13"), 0), Freshness::Current);
        // A newer generation is newer than any write of an older one.
        seen.stored(&at(3, "14"), 0);
        assert_eq!(seen.given(&at(4, "15"), 0), Freshness::Current);
        // Never back to an older generation (a cache relisted from a lagging API server).
        assert_eq!(seen.given(&at(3, "14"), 0), Freshness::Stale);
    }

    #[test]
    fn an_unknown_or_forgotten_object_is_current() {
        let seen = Seen::default();
        seen.stored(&at(3, "12"), 0);
        seen.forget("u");
        assert_eq!(seen.given(&at(1, "1"), 0), Freshness::Current);
    }

    #[test]
    fn a_version_with_the_written_record_is_current_whatever_its_resource_version() {
        let seen = Seen::default();
        seen.stored(&at(3, "12"), 7);
        // Someone's annotation after our status write: same generation, same record.
        assert_eq!(seen.given(&at(3, "13"), 7), Freshness::Current);
        seen.stored(&at(3, "14"), 8);
        // A copy from before that write: its record differs.
        assert_eq!(seen.given(&at(3, "13"), 7), Freshness::Stale);
    }
}
