//! The split a Tenant's quota last got: its status record, or this process's later decision while that record has not caught up.
//!
//! A pass keeps the split recorded in `status.quotaSplit` while it is good enough
//! ([`super::quota_split`]), but the status a pass reads can be older than the last decision:
//! the Tenant read from the cache before the last status write reached it, or a pass that
//! failed after writing its quotas and so wrote no status. Judged from such a record, a split
//! no longer good enough is made anew, and every quota moves for nothing. So this process
//! remembers each decision with the record it was made from: while the status still holds
//! that record (or already the decision), the decision is the current split; once the status
//! holds something else (another replica's decision after a handover, an administrator's edit),
//! the status is. A restarted process starts from the status.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Per namespace, per `tenantHard` key: a Tenant's split.
pub type Split = BTreeMap<String, BTreeMap<String, Quantity>>;

/// A decision and the record it was made from.
#[derive(Debug)]
struct Decision {
    from: Split,
    decided: Split,
}

/// Per Tenant (by uid), the last decision of this process.
#[derive(Debug, Default)]
pub struct SplitMemory {
    tenants: Mutex<HashMap<String, Decision>>,
}

impl SplitMemory {
    /// The current split of Tenant `tenant` whose status records `recorded`.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn current(&self, tenant: &str, recorded: &Split) -> Split {
        let tenants = self.tenants.lock().expect("split memory lock");
        match tenants.get(tenant) {
            Some(d) if d.from == *recorded || d.decided == *recorded => d.decided.clone(),
            _ => recorded.clone(),
        }
    }

    /// Remembers that a pass of Tenant `tenant`, whose status recorded `from`, decided
    /// `decided`.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn decided(&self, tenant: &str, from: Split, decided: Split) {
        let mut tenants = self.tenants.lock().expect("split memory lock");
        if from == decided {
            // The status holds it already: nothing to remember.
            tenants.remove(tenant);
        } else {
            tenants.insert(tenant.to_owned(), Decision { from, decided });
        }
    }

    /// Forgets Tenant `tenant` (by uid): it is gone.
    ///
    /// # Panics
    /// If another thread panicked while holding the memory's lock.
    pub fn forget(&self, tenant: &str) {
        self.tenants
            .lock()
            .expect("split memory lock")
            .remove(tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(a: &str, b: &str) -> Split {
        [("a", a), ("b", b)]
            .into_iter()
            .map(|(ns, v)| {
                let share = BTreeMap::from([("pods".to_owned(), Quantity(v.into()))]);
                (ns.to_owned(), share)
            })
            .collect()
    }

    #[test]
    fn a_decision_stands_until_the_status_holds_something_else() {
        let memory = SplitMemory::default();
        let old = split("20", "20");
        assert_eq!(
            memory.current("t", &old),
            old,
            "nothing decided: the status"
        );
        memory.decided("t", old.clone(), split("27", "13"));
        // A pass that reads the old status (a cached Tenant, a failed pass): the decision.
        assert_eq!(memory.current("t", &old), split("27", "13"));
        // The status caught up.
        assert_eq!(memory.current("t", &split("27", "13")), split("27", "13"));
        // Another replica decided after a handover, or an administrator wrote the status.
        assert_eq!(memory.current("t", &split("26", "14")), split("26", "14"));
        // Other Tenants are not affected, and a forgotten Tenant goes by its status.
        assert_eq!(memory.current("u", &old), old);
        memory.forget("t");
        assert_eq!(memory.current("t", &old), old);
    }

    #[test]
    fn a_decision_the_status_holds_is_not_kept() {
        let memory = SplitMemory::default();
        memory.decided("t", split("27", "13"), split("27", "13"));
        assert!(memory.tenants.lock().unwrap().is_empty());
    }
}
