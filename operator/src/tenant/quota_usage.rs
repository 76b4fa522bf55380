//! The usage the quota split believes: a namespace's usage going down only once the lower value has held for a while.
//!
//! Quota admission charges `status.used` before the object it admits is stored, and every
//! change of a quota makes the controller-manager's quota controller recount the namespace
//! from its own object cache. A recount that runs before that cache has seen the newly
//! admitted object writes a usage lower than the truth; the next recount (its own write
//! triggers one) normally puts it back. Room the split gave away on such a dip would let a
//! namespace admit past the tenant's total. So a usage lower than the highest seen is taken
//! only once it has been seen for [`USAGE_SETTLE`]; until then the split works with the
//! highest, and the Tenant looks again after [`super::quota_split::HELD_POLL`]. A higher usage
//! is taken at once (it gives nothing away).
//!
//! The memory is this process's (a restarted operator takes the first usage it sees), one
//! entry per namespace and key of a Tenant's quota, dropped with the namespace and with the
//! Tenant.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quota_split::{Observed, SplitError, usage_units};

/// How long a lower usage must be seen before the split believes it.
pub const USAGE_SETTLE: Duration = Duration::from_secs(2);

/// The highest usage seen of one key of one namespace's quota, and since when a lower one has
/// been seen.
#[derive(Clone, Debug)]
struct Seen {
    high: Quantity,
    units: i128,
    lower_since: Option<Instant>,
}

/// One Tenant's memory: per namespace, per key.
type TenantUsage = HashMap<String, BTreeMap<String, Seen>>;

/// Per Tenant (by uid): what [`UsageMemory::settle`] remembers.
#[derive(Debug, Default)]
pub struct UsageMemory {
    tenants: Mutex<HashMap<String, TenantUsage>>,
}

impl UsageMemory {
    /// Replaces in `observed` (the quotas of Tenant `tenant`'s namespaces) each usage lower
    /// than the highest seen with that highest, until the lower one has been seen for
    /// [`USAGE_SETTLE`]; returns whether one is still waiting. Namespaces not in `observed`
    /// are forgotten.
    ///
    /// # Errors
    /// [`SplitError`] when a usage does not parse exactly.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn settle(
        &self,
        tenant: &str,
        observed: &mut BTreeMap<String, Observed>,
        now: Instant,
    ) -> Result<bool, SplitError> {
        let mut tenants = self.tenants.lock().expect("usage memory lock");
        let seen = tenants.entry(tenant.to_owned()).or_default();
        seen.retain(|ns, _| observed.contains_key(ns));
        let mut waiting = false;
        for (ns, obs) in observed.iter_mut() {
            let keys = seen.entry(ns.clone()).or_default();
            keys.retain(|k, _| obs.used.contains_key(k));
            for (key, q) in &obs.used {
                let units = usage_units(key, q)?;
                match keys.get_mut(key) {
                    Some(s) if units < s.units => {
                        let since = *s.lower_since.get_or_insert(now);
                        if now.duration_since(since) < USAGE_SETTLE {
                            waiting = true;
                        } else {
                            *s = Seen {
                                high: q.clone(),
                                units,
                                lower_since: None,
                            };
                        }
                    }
                    _ => {
                        keys.insert(
                            key.clone(),
                            Seen {
                                high: q.clone(),
                                units,
                                lower_since: None,
                            },
                        );
                    }
                }
            }
            for (key, s) in keys.iter() {
                if s.lower_since.is_some() {
                    obs.used.insert(key.clone(), s.high.clone());
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

    fn observed(pairs: &[(&str, &str)]) -> BTreeMap<String, Observed> {
        pairs
            .iter()
            .map(|(ns, used)| {
                let used = BTreeMap::from([("pods".to_owned(), Quantity((*used).into()))]);
                (
                    (*ns).to_owned(),
                    Observed {
                        spec: Some(BTreeMap::new()),
                        enforced: used.clone(),
                        used,
                    },
                )
            })
            .collect()
    }

    fn used(o: &BTreeMap<String, Observed>, ns: &str) -> String {
        o[ns].used["pods"].0.clone()
    }

    #[test]
    fn a_dip_is_believed_only_once_it_has_held() {
        let memory = UsageMemory::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        assert!(!memory.settle("t", &mut o, at(0)).unwrap());
        assert_eq!(used(&o, "a"), "3");

        // The recount dips: the split still sees 3, and waits.
        let mut o = observed(&[("a", "2"), ("b", "2")]);
        assert!(memory.settle("t", &mut o, at(100)).unwrap());
        assert_eq!((used(&o, "a"), used(&o, "b")), ("3".into(), "2".into()));

        // The next recount puts it back: nothing waits, and a later dip starts again.
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        assert!(!memory.settle("t", &mut o, at(300)).unwrap());
        let mut o = observed(&[("a", "2"), ("b", "2")]);
        assert!(memory.settle("t", &mut o, at(1_000)).unwrap());
        assert_eq!(used(&o, "a"), "3");
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(memory.settle("t", &mut o, at(2_900)).unwrap());
        assert_eq!(used(&o, "a"), "3");

        // Held for the whole settle time (since the first lower value): believed.
        let mut o = observed(&[("a", "1"), ("b", "2")]);
        assert!(!memory.settle("t", &mut o, at(3_000)).unwrap());
        assert_eq!(used(&o, "a"), "1");
        // A rise is taken at once.
        let mut o = observed(&[("a", "4"), ("b", "2")]);
        assert!(!memory.settle("t", &mut o, at(3_001)).unwrap());
        assert_eq!(used(&o, "a"), "4");
    }

    #[test]
    fn namespaces_and_tenants_that_go_are_forgotten() {
        let memory = UsageMemory::default();
        let now = Instant::now();
        let mut o = observed(&[("a", "3"), ("b", "2")]);
        memory.settle("t", &mut o, now).unwrap();
        memory
            .settle("u", &mut observed(&[("c", "1")]), now)
            .unwrap();
        // b leaves the tenant: coming back at a lower usage, it is a new quota.
        memory
            .settle("t", &mut observed(&[("a", "3")]), now)
            .unwrap();
        let mut o = observed(&[("a", "3"), ("b", "0")]);
        assert!(!memory.settle("t", &mut o, now).unwrap());
        assert_eq!(used(&o, "b"), "0");
        assert_eq!(memory.tenants(), 2);
        memory.forget("u");
        assert_eq!(memory.tenants(), 1);
    }

    #[test]
    fn a_usage_that_does_not_parse_is_an_error() {
        let memory = UsageMemory::default();
        let mut o = observed(&[("a", "x")]);
        assert!(memory.settle("t", &mut o, Instant::now()).is_err());
    }
}
