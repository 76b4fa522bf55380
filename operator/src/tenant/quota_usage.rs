//! The usage the quota split believes: a namespace's usage going down only once the lower value has held for a while.
//!
//! Quota admission charges `status.used` before the object it admits is stored, and every
//! change of a quota makes the controller-manager's quota controller recount the namespace
//! from its own object cache. A recount that runs before that cache has seen the newly
//! admitted object writes a usage lower than the truth, and it stays until the next recount:
//! the quota controller recounts on a change of the quota's `spec.hard`, on the deletion of an
//! object it counts, and on its periodic resync (5 minutes by default), not on its own status
//! writes. Room the split gave away on such a dip would let a namespace admit past the
//! tenant's total. So a usage lower than the highest seen is taken
//! only once lower usages have been seen for [`USAGE_SETTLE`], and then only down to the
//! highest of them (one seen a moment ago waits its own time); until then the split works
//! with the highest, and the Tenant looks again after [`super::quota_split::HELD_POLL`]. A
//! higher usage is taken at once (it gives nothing away). A dip that outlasts [`USAGE_SETTLE`]
//! is believed: the tenant's total can then be passed by what admission let in meanwhile, as a
//! namespace's own quota can be (the README says so).
//!
//! The memory is this process's (a restarted operator takes the first usage it sees), one
//! entry per namespace and key of a Tenant's quota, dropped with the namespace and with the
//! Tenant.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// How long a lower usage must be seen before the split believes it.
pub const USAGE_SETTLE: Duration = Duration::from_secs(2);

/// The highest usage seen of one key of one namespace's quota; since when lower ones have
/// been seen, and the highest of those.
#[derive(Clone, Debug)]
struct Seen {
    high: Quantity,
    units: i128,
    lower_since: Option<Instant>,
    lower_high: Option<(Quantity, i128)>,
}

impl Seen {
    fn new(high: Quantity, units: i128) -> Self {
        Self {
            high,
            units,
            lower_since: None,
            lower_high: None,
        }
    }
}

/// One Tenant's memory: per namespace, per key.
type TenantUsage = HashMap<String, BTreeMap<String, Seen>>;

/// Per Tenant (by uid): what [`UsageMemory::settle`] remembers.
#[derive(Debug, Default)]
pub struct UsageMemory {
    tenants: Mutex<HashMap<String, TenantUsage>>,
}

impl UsageMemory {
    /// Replaces in `used` (per namespace of Tenant `tenant`, its quota's `status.used`; read
    /// in units with `units`) each usage lower than the highest seen with that highest, until
    /// lower ones have been seen for [`USAGE_SETTLE`] (then the highest of those is the highest
    /// seen); returns whether one is still waiting.
    /// Namespaces not in `used` are forgotten.
    ///
    /// # Errors
    /// What `units` returns for a usage it cannot read.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn settle<'a, E>(
        &self,
        tenant: &str,
        used: impl IntoIterator<Item = (&'a String, &'a mut BTreeMap<String, Quantity>)>,
        units: impl Fn(&str, &Quantity) -> Result<i128, E>,
        now: Instant,
    ) -> Result<bool, E> {
        let used: Vec<_> = used.into_iter().collect();
        let mut tenants = self.tenants.lock().expect("usage memory lock");
        let seen = tenants.entry(tenant.to_owned()).or_default();
        seen.retain(|ns, _| used.iter().any(|(n, _)| *n == ns));
        let mut waiting = false;
        for (ns, used) in used {
            let keys = seen.entry(ns.clone()).or_default();
            keys.retain(|k, _| used.contains_key(k));
            for (key, q) in used.iter() {
                let units = units(key, q)?;
                match keys.get_mut(key) {
                    Some(s) if units < s.units => {
                        let since = *s.lower_since.get_or_insert(now);
                        if s.lower_high.as_ref().is_none_or(|(_, u)| units > *u) {
                            s.lower_high = Some((q.clone(), units));
                        }
                        if now.duration_since(since) < USAGE_SETTLE {
                            waiting = true;
                        } else if let Some((high, high_units)) = s.lower_high.take() {
                            // Believed: the highest of the lower usages seen since, not the
                            // last one (itself maybe a dip seen a moment ago), which starts a
                            // wait of its own when it is lower still.
                            *s = Seen::new(high, high_units);
                            if units < high_units {
                                s.lower_since = Some(now);
                                s.lower_high = Some((q.clone(), units));
                                waiting = true;
                            }
                        }
                    }
                    _ => {
                        keys.insert(key.clone(), Seen::new(q.clone(), units));
                    }
                }
            }
            for (key, s) in keys.iter() {
                if s.lower_since.is_some() {
                    used.insert(key.clone(), s.high.clone());
                }
            }
        }
        Ok(waiting)
    }

    /// Forgets Tenant `tenant` (by uid): it is gone.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn forget(&self, tenant: &str) {
        self.tenants
            .lock()
            .expect("usage memory lock")
            .remove(tenant);
    }

    /// How many Tenants it remembers.
    #[cfg(test)]
    fn tenants(&self) -> usize {
        self.tenants.lock().expect("usage memory lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Used = BTreeMap<String, BTreeMap<String, Quantity>>;

    fn observed(pairs: &[(&str, &str)]) -> Used {
        pairs
            .iter()
            .map(|(ns, used)| {
                let used = BTreeMap::from([("pods".to_owned(), Quantity((*used).into()))]);
                ((*ns).to_owned(), used)
            })
            .collect()
    }

    fn used(o: &Used, ns: &str) -> String {
        o[ns]["pods"].0.clone()
    }

    /// [`UsageMemory::settle`] with whole numbers for units.
    fn settle(
        memory: &UsageMemory,
        tenant: &str,
        o: &mut Used,
        now: Instant,
    ) -> Result<bool, String> {
        memory.settle(
            tenant,
            o.iter_mut(),
            |_, q| q.0.parse::<i128>().map_err(|e| e.to_string()),
            now,
        )
    }

    #[test]
    fn a_dip_is_believed_only_once_it_has_held() {
        let memory = UsageMemory::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        assert!(!settle(&memory, "t", &mut o, at(0)).unwrap());
        assert_eq!(used(&o, "a"), "3");

        // The recount dips: the split still sees 3, and waits.
        let mut o = observed(&[("a", "2"), ("b", "2")]);
        assert!(settle(&memory, "t", &mut o, at(100)).unwrap());
        assert_eq!((used(&o, "a"), used(&o, "b")), ("3".into(), "2".into()));

        // The next recount puts it back: nothing waits, and a later dip starts again.
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        assert!(!settle(&memory, "t", &mut o, at(300)).unwrap());
        let mut o = observed(&[("a", "2"), ("b", "2")]);
        assert!(settle(&memory, "t", &mut o, at(1_000)).unwrap());
        assert_eq!(used(&o, "a"), "3");
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(settle(&memory, "t", &mut o, at(2_900)).unwrap());
        assert_eq!(used(&o, "a"), "3");

        // Lower for the whole settle time: the highest of the lower values is believed, not
        // the 1 first seen 100 ms ago (a tenant owner could time a create so that a recount's
        // dip comes then, found by review); the 1 waits its own settle time.
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(settle(&memory, "t", &mut o, at(3_000)).unwrap());
        assert_eq!(used(&o, "a"), "2");
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(settle(&memory, "t", &mut o, at(4_900)).unwrap());
        assert_eq!(used(&o, "a"), "2");
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(!settle(&memory, "t", &mut o, at(5_000)).unwrap());
        assert_eq!(used(&o, "a"), "1");
        // A rise is taken at once.
        let mut o = observed(&[("a", "4"), ("b", "2")]);
        assert!(!settle(&memory, "t", &mut o, at(5_001)).unwrap());
        assert_eq!(used(&o, "a"), "4");
    }

    #[test]
    fn namespaces_and_tenants_that_go_are_forgotten() {
        let memory = UsageMemory::default();
        let now = Instant::now();
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        settle(&memory, "t", &mut o, now).unwrap();
        settle(&memory, "u", &mut observed(&[("c", "1")]), now).unwrap();
        // b leaves the tenant: coming back at a lower usage, it is a new quota.
        settle(&memory, "t", &mut observed(&[("a", "3")]), now).unwrap();
        let mut o = observed(&[("a", "3"), ("b", "0")]);
        assert!(!settle(&memory, "t", &mut o, now).unwrap());
        assert_eq!(used(&o, "b"), "0");
        assert_eq!(memory.tenants(), 2);
        memory.forget("u");
        assert_eq!(memory.tenants(), 1);
    }

    #[test]
    fn a_usage_that_does_not_parse_is_an_error() {
        let memory = UsageMemory::default();
        let mut o = observed(&[("a", "x")]);
        assert!(settle(&memory, "t", &mut o, Instant::now()).is_err());
    }
}
