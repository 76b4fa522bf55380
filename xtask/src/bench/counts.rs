//! A controller's requests by verb, as the API server counted them (`apiserver_request_total`
//! deltas between two scrapes of `/metrics`).
//!
//! The metric has no user label, so the controller's requests are told apart by resource: the
//! BaseTenants and the four child kinds, minus the requests only others make there — the
//! bench's own object writes to `basetenants` (creates and spec changes, never the `status`
//! subresource) and the controller-manager's `resourcequotas/status` updates. The bench's
//! own watch of BaseTenants runs across every measurement, so it is not in a delta.

use std::collections::BTreeMap;

use idem_tests::metrics::{RequestCount, all_requests};

/// The verbs shown, in this order (others are summed under `other`).
pub const VERBS: [&str; 8] = [
    "GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "APPLY", "DELETE",
];
const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Requests by verb, and by verb and resource (`GET namespaces`, `PUT basetenants/status`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts(pub BTreeMap<String, u64>, pub BTreeMap<String, u64>);

impl Counts {
    /// Requests of `verb`.
    pub fn get(&self, verb: &str) -> u64 {
        self.0.get(verb).copied().unwrap_or(0)
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Write requests.
    pub fn writes(&self) -> u64 {
        WRITE_VERBS.iter().map(|v| self.get(v)).sum()
    }

    /// `GET namespaces 3, LIST rolebindings 4, …` (with a count only).
    pub fn detail(&self) -> String {
        let parts: Vec<String> = self.1.iter().map(|(k, n)| format!("{k} {n}")).collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// `GET 3, LIST 4, …` (verbs with a count only).
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Whether a request counts as the controller's.
fn is_controllers(c: &RequestCount) -> bool {
    let ours = matches!(
        (c.group.as_str(), c.resource.as_str()),
        ("", "namespaces" | "resourcequotas" | "limitranges")
            | ("rbac.authorization.k8s.io", "rolebindings")
            | ("bench.idem.dev", "basetenants")
    );
    let bench_write = c.resource == "basetenants"
        && c.subresource.is_empty()
        && WRITE_VERBS.contains(&c.verb.as_str());
    let kcm_quota_status = c.resource == "resourcequotas" && c.subresource == "status";
    ours && !bench_write && !kcm_quota_status
}

/// The controller's requests by verb between two `/metrics` texts.
pub fn delta(before: &str, after: &str) -> Counts {
    let sum = |text: &str, detail: bool| {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for c in all_requests(text).iter().filter(|c| is_controllers(c)) {
            let key = match (detail, c.subresource.is_empty()) {
                (false, _) => c.verb.clone(),
                (true, true) => format!("{} {}", c.verb, c.resource),
                (true, false) => format!("{} {}/{}", c.verb, c.resource, c.subresource),
            };
            *m.entry(key).or_default() += c.count;
        }
        m
    };
    let diff = |detail: bool| {
        let (b, a) = (sum(before, detail), sum(after, detail));
        a.into_iter()
            .map(|(k, n)| {
                let d = n.saturating_sub(b.get(&k).copied().unwrap_or(0));
                (k, d)
            })
            .filter(|(_, d)| *d > 0)
            .collect()
    };
    Counts(diff(false), diff(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(verb: &str, group: &str, resource: &str, sub: &str, n: u64) -> String {
        format!(
            "apiserver_request_total{{code=\"200\",group=\"{group}\",resource=\"{resource}\",subresource=\"{sub}\",verb=\"{verb}\"}} {n}\n"
        )
    }

    #[test]
    fn counts_the_controllers_kinds_without_the_bench_and_the_quota_controller() {
        let before = line("POST", "", "namespaces", "", 1);
        let after = [
            line("POST", "", "namespaces", "", 4),
            line("PUT", "", "resourcequotas", "status", 9),
            line("POST", "bench.idem.dev", "basetenants", "", 5),
            line("PUT", "bench.idem.dev", "basetenants", "status", 2),
            line("LIST", "bench.idem.dev", "basetenants", "", 1),
            line("GET", "", "configmaps", "", 7),
        ]
        .concat();
        let d = delta(&before, &after);
        assert_eq!(d.get("POST"), 3);
        assert_eq!(d.get("PUT"), 2);
        assert_eq!(d.get("LIST"), 1);
        assert_eq!((d.writes(), d.total()), (5, 6));
        assert_eq!(d.1.get("PUT basetenants/status"), Some(&2));
        assert_eq!(d.1.get("POST namespaces"), Some(&3));
    }
}
