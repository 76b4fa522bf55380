//! The split of a Tenant's `quota.tenantHard` into its namespaces' quotas so that their sum never exceeds it.
//!
//! Each namespace's ResourceQuota `idem-quota` gets, per key of `tenantHard`, what the
//! namespace uses plus an even share of the headroom (`tenantHard − Σ used`); the API server's
//! own quota admission then enforces each namespace atomically, and the sum over the
//! namespaces stays within the tenant's total. Decisions:
//!
//! - **Usage** is the quota's `status.used`, written by quota admission and the
//!   controller-manager's quota controller, read from the controller's cache (the kind is
//!   declared reading status, so a change of usage reconciles the Tenant and a converged pass
//!   makes no request). A quota without `status.used` for a key counts as using 0. A usage
//!   too large to compute with exactly (an owner's Pod may request `memory: 1e40`) counts as
//!   above any total, never as an error that would stop the Tenant's pass. A usage
//!   lower than the highest seen is believed only once it has held a while
//!   ([`super::quota_usage`]): the quota controller's recount can dip below what admission
//!   charged, and the room a dip frees would let a namespace pass the total.
//! - **Enforcement** is the quota's `status.hard`, not its spec: admission checks against
//!   `status.hard`, which the quota controller copies from the spec some time after the spec
//!   changes (a quota or key it has not copied yet is not enforced at all). So what a
//!   namespace may come to use is bounded by `max(used, status.hard, spec.hard)`, and headroom
//!   moves in two steps: the decreases are applied first (a phase of their own, before any
//!   other child is written; a failed one fails the pass), and an increase of a key is applied
//!   only once the sum of those bounds with the increase is within the total — that is, once
//!   the quota controller has copied the decreases into `status.hard` (its status update
//!   reconciles the Tenant again). Until then the Tenant says `Reconciling`, reason
//!   `QuotaMoving`. A pass reads its own writes (the runtime's cache overlay), so a pass never
//!   works from quotas older than the ones it wrote.
//! - **Churn**: the split is redone only when it must be: a key's current split is kept while
//!   every namespace has a value between its usage and the per-namespace `hard`, the sum is
//!   what a fresh split gives, and every namespace's room (value − used) is at least half the
//!   room a fresh split would give it. Usage changes that leave the rooms large enough write
//!   nothing.
//! - **The current split is the one recorded**, in the Tenant's `status.quotaSplit` (which tenant
//!   owners cannot write), not the quotas' live `spec.hard`: which split a pass keeps
//!   depends on the history of usage, so a split judged from live values would take an
//!   administrator's edit of one quota as a new current split and answer it by moving another
//!   namespace's quota. Judged from the record, the edited quota is put back and no other
//!   moves. Without a record (a Tenant last written by an older operator) the live values
//!   stand for it. A decision the status does not hold yet (a cached Tenant older than the
//!   last status write, a pass that failed after writing its quotas) is this process's
//!   ([`super::quota_record`]).
//! - **Arithmetic** is exact, in whole units of each key (object counts, extended resources,
//!   bytes) or milli-units for CPU keys: the total and per-namespace limits rounded down,
//!   usage and enforced limits rounded up; results are written as canonical quantities. The
//!   headroom's remainder (when it does not divide evenly) goes one unit each, first to the
//!   namespaces whose current limit already leaves them more than the share, then to those
//!   using least (the quotas as even as they can be: usage 1 and 0 of a total of 40 is split
//!   20/20, as it was before the 1 was counted, not 21/19), then in name order.
//! - **Per-namespace `hard`**: where `hard` names a key too, a namespace gets at most that;
//!   headroom a capped namespace cannot take goes to the others.
//! - **Usage above the total** (`tenantHard` lowered below what is used): every namespace is
//!   held at its usage (nothing can grow; what is deleted is not given back until the sum is
//!   under the total again), and the Ready message says so.
//! - **Leaving namespaces** (deleted, or removed from the spec, and still there, their
//!   contents held by finalizers) keep their objects counted until they are gone: the total
//!   is lowered by what each may hold (`max(used, status.hard, spec.hard)`), and when one's
//!   quota is already gone nothing grows, until they are gone.
//! - A quota created for a new namespace is not enforced before the quota controller has
//!   filled its status: the namespace's RoleBindings wait for that ([`super::quota_gate`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use idem_runtime::compare::Quantity as Exact;
use idem_runtime::prelude::*;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::desired::{QUOTA, quota_with};
use super::quota_record::SplitMemory;
use super::quota_usage::UsageMemory;
use crate::resources::Tenant;
use crate::resources::tenant::Quota;

/// How often a Tenant whose quota increases wait is looked at again, besides the quota
/// status change that normally reconciles it.
pub const HELD_POLL: Duration = Duration::from_secs(2);

/// Why a quota cannot be split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// A quantity the split computes with is not one it can hold exactly.
    #[error("{what} of {key}, {value:?}, is not a quantity idem can compute with exactly")]
    Quantity {
        /// Which value (`tenantHard`, `hard`, `status.used`, …).
        what: &'static str,
        /// The resource name.
        key: String,
        /// The value as written.
        value: String,
    },
}

/// What one namespace's quota is now, from its live object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// `spec.hard`; `None` when the quota does not exist.
    pub spec: Option<BTreeMap<String, Quantity>>,
    /// `status.hard`: what quota admission enforces (a key missing is not enforced).
    pub enforced: BTreeMap<String, Quantity>,
    /// `status.used` (a key missing counts as 0).
    pub used: BTreeMap<String, Quantity>,
    /// The namespace's share of each `tenantHard` key as the operator last decided it (the
    /// Tenant's `status.quotaSplit`); `None` when none is recorded (then the live `spec.hard`
    /// stands for it). The split keeps it while it is good enough: a quota edited by anyone
    /// else is put back to it, and no other namespace's quota moves for that edit.
    pub recorded: Option<BTreeMap<String, Quantity>>,
}

/// The quotas to write, in two steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The namespaces whose quota must shrink (or be created) before anything grows.
    pub shrinking: Vec<String>,
    /// Every namespace's `hard` to write first when some shrink: per key the smaller of the
    /// live spec and the target (the live spec where nothing shrinks).
    pub first: BTreeMap<String, BTreeMap<String, Quantity>>,
    /// The `hard` of every namespace's quota in the pass's contents.
    pub hard: BTreeMap<String, BTreeMap<String, Quantity>>,
    /// Keys whose increases wait until the decreases are enforced.
    pub held: Vec<String>,
    /// Keys whose usage is above the total: `(key, used, total)`.
    pub over: Vec<(String, Quantity, Quantity)>,
    /// Whether a namespace's lower usage is not believed yet ([`super::quota_usage`]): the
    /// split gives away none of the room it would free, and the Tenant looks again soon.
    pub settling: bool,
    /// [`Plan::hard`] with no increase at all: what the contents get when a decrease of
    /// [`Plan::first`] could not be written.
    pub no_increase: BTreeMap<String, BTreeMap<String, Quantity>>,
    /// Per namespace, the share of each `tenantHard` key this plan decided (whether or not its
    /// increases wait): what the Tenant's status records for the next pass
    /// ([`Observed::recorded`]).
    pub decided: BTreeMap<String, BTreeMap<String, Quantity>>,
}

impl Plan {
    /// Words for the Ready message when usage is above the total, `None` otherwise.
    pub fn over_note(&self) -> Option<String> {
        let parts: Vec<String> = self
            .over
            .iter()
            .map(|(k, used, total)| format!("{k} {} > {}", used.0, total.0))
            .collect();
        (!parts.is_empty()).then(|| {
            format!(
                "usage is above quota.tenantHard ({}): each namespace is held at its usage",
                parts.join(", ")
            )
        })
    }

    /// Words for the `QuotaMoving` message, `None` when no increase waits.
    pub fn held_note(&self) -> Option<String> {
        (!self.held.is_empty()).then(|| {
            format!(
                "quota increases of {} wait until the quota controller enforces the decreases",
                self.held.join(", ")
            )
        })
    }
}

/// The scale of a key's arithmetic: milli-units for CPU, whole units for everything else.
fn scale(key: &str) -> i32 {
    if matches!(key, "cpu" | "requests.cpu" | "limits.cpu") {
        -3
    } else {
        0
    }
}

fn units(what: &'static str, key: &str, q: &Quantity, round_up: bool) -> Result<i128, SplitError> {
    Exact::parse(&q.0)
        .and_then(|e| e.units(scale(key), round_up))
        .ok_or_else(|| SplitError::Quantity {
            what,
            key: key.to_owned(),
            value: q.0.clone(),
        })
}

/// What a live value counts as at most, in a key's units: far above any total the Tenant's
/// schema admits (below `1e24`), and small enough that sums over its namespaces cannot
/// overflow.
pub const LIVE_UNITS_CAP: i128 = 10i128.pow(30);

/// A value of a live quota (`status.used`, `status.hard`, `spec.hard`: written by quota
/// admission, the quota controller, or whoever edits the quota, not the Tenant's schema) in
/// the key's units, rounded up; a value too large to compute with exactly, or one that does
/// not parse, counts as [`LIVE_UNITS_CAP`]: above the total, so nothing grows, rather than a
/// stalled Tenant (an owner's Pod requesting `memory: 1e40` stopped every repair).
fn live_units(key: &str, q: &Quantity) -> i128 {
    Exact::parse(&q.0)
        .and_then(|e| e.units(scale(key), true))
        .map_or(LIVE_UNITS_CAP, |u| u.clamp(0, LIVE_UNITS_CAP))
}

/// A `status.used` value in the key's units ([`live_units`]); never an error.
#[allow(clippy::unnecessary_wraps)]
fn usage_units(key: &str, q: &Quantity) -> Result<i128, SplitError> {
    Ok(live_units(key, q))
}

/// Compares two quantities by value (to the nano-unit, the finest a quantity keeps); `None`
/// when either does not parse.
fn compare(a: &Quantity, b: &Quantity) -> Option<Ordering> {
    let nanos = |q: &Quantity| Exact::parse(&q.0)?.units(-9, false);
    Some(nanos(a)?.cmp(&nanos(b)?))
}

/// `units × 10^scale` as the API server writes it (canonical decimal SI: an exponent that is
/// a multiple of 3, `3000` → `3k`, `1500m` stays).
pub fn format(units: i128, scale: i32) -> Quantity {
    if units <= 0 {
        return Quantity("0".into());
    }
    let (mut mantissa, mut exp) = (units, scale);
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exp += 1;
    }
    let exp3 = (exp.div_euclid(3) * 3).clamp(-9, 18);
    for _ in exp3..exp {
        mantissa *= 10;
    }
    let suffix = match exp3 {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        _ => "E",
    };
    Quantity(format!("{mantissa}{suffix}"))
}

/// The targets of one key for namespaces using `used` whose quotas hold `current` (`None`:
/// none yet): at most `cap` each, `Σ ≤ total` unless usage alone is above it (then each is
/// held at its usage; at its current quota when the usage is too large to compute with). Keeps `current` when it is still good enough (see the module docs).
pub fn targets(
    total: i128,
    cap: Option<i128>,
    used: &[i128],
    current: &[Option<i128>],
) -> Vec<i128> {
    let used: Vec<i128> = used.iter().map(|u| (*u).max(0)).collect();
    let limit = |v: i128| cap.map_or(v, |c| v.min(c.max(0)));
    let sum_used: i128 = used.iter().sum();
    if sum_used >= total {
        // Held at its usage; a usage too large to compute with at what its quota holds now
        // (nothing grows either way, and no absurd limit is written).
        return (used.iter().zip(current))
            .map(|(u, c)| match c {
                Some(c) if *u >= LIVE_UNITS_CAP => limit((*c).clamp(0, *u)),
                _ => limit(*u),
            })
            .collect();
    }
    let fresh = fresh_split(total - sum_used, cap, &used, current);
    let kept: Option<Vec<i128>> = current.iter().copied().collect();
    if let Some(kept) = kept
        && kept.len() == used.len()
        && kept.iter().sum::<i128>() == fresh.iter().sum::<i128>()
        && kept
            .iter()
            .zip(&used)
            .zip(&fresh)
            .all(|((c, u), f)| *c >= *u && limit(*c) == *c && 2 * (c - u) >= f - u)
    {
        return kept;
    }
    fresh
}

/// Usage plus an even share of `headroom`, each at most `cap` (what a capped namespace cannot
/// take goes to the others); the remainder one unit each, first to the namespaces whose
/// `current` limit already leaves them more than the share (so using a unit does not move
/// another namespace's, and fewer quotas are rewritten), then to those using least (so the
/// quotas are as even as they can be, and a split made before or after a unit of usage is
/// counted is the same), then in order.
fn fresh_split(
    headroom: i128,
    cap: Option<i128>,
    used: &[i128],
    current: &[Option<i128>],
) -> Vec<i128> {
    let mut target = used.to_vec();
    let mut left = headroom;
    let mut open: Vec<usize> = (0..used.len()).collect();
    while !open.is_empty() {
        let share = left / open.len() as i128;
        let capped: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| cap.is_some_and(|c| c - used[i] <= share))
            .collect();
        if capped.is_empty() {
            let extra = left - share * open.len() as i128;
            let holds = |i: usize| {
                current
                    .get(i)
                    .copied()
                    .flatten()
                    .is_some_and(|c| c - used[i] > share)
            };
            let mut order = open.clone();
            order.sort_by_key(|&i| (!holds(i), used[i], i));
            for (n, &i) in order.iter().enumerate() {
                target[i] = used[i] + share + i128::from((n as i128) < extra);
            }
            break;
        }
        for i in capped {
            let c = cap.unwrap_or(i128::MAX);
            let give = (c - used[i]).max(0);
            target[i] = c.max(0).min(used[i] + give);
            left -= give;
            open.retain(|&j| j != i);
        }
    }
    target
}

/// Per key the smaller of `a` and `b`, a key missing from one being unlimited there.
fn pointwise_min(
    a: &BTreeMap<String, Quantity>,
    b: &BTreeMap<String, Quantity>,
) -> BTreeMap<String, Quantity> {
    let mut out = a.clone();
    for (k, v) in b {
        match out.get(k) {
            Some(old) if compare(old, v) != Some(Ordering::Greater) => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// Whether two `hard` maps hold the same keys with the same values.
fn same(a: &BTreeMap<String, Quantity>, b: &BTreeMap<String, Quantity>) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k)
                .is_some_and(|w| compare(v, w) == Some(Ordering::Equal))
        })
}

/// Splits `quota.tenantHard` over `namespaces` (the tenant's usable namespaces, sorted), from
/// their quotas as `observed` (a namespace missing there has no quota yet).
///
/// # Errors
/// [`SplitError`] when a quantity does not parse exactly.
pub fn plan(
    quota: &Quota,
    namespaces: &[String],
    observed: &BTreeMap<String, Observed>,
) -> Result<Plan, SplitError> {
    let none = Observed::default();
    let obs = |ns: &String| observed.get(ns).unwrap_or(&none);
    let mut finals: BTreeMap<String, BTreeMap<String, Quantity>> = namespaces
        .iter()
        .map(|ns| (ns.clone(), quota.hard.clone()))
        .collect();
    let mut plan = Plan::default();
    // Per tenant key: (total, used, enforced) in units, for the gate below.
    let mut keys = Vec::new();
    for (key, total_q) in &quota.tenant_hard {
        let total = units("quota.tenantHard", key, total_q, false)?;
        let cap = match quota.hard.get(key) {
            Some(q) => Some(units("quota.hard", key, q, false)?),
            None => None,
        };
        let mut used = Vec::new();
        let mut current = Vec::new();
        let mut enforced = Vec::new();
        for ns in namespaces {
            let o = obs(ns);
            used.push(o.used.get(key).map_or(0, |q| live_units(key, q)));
            // What the split keeps if it is still good enough: the share recorded, not the
            // live quota, which an administrator may have edited.
            let kept_from = o.recorded.as_ref().or(o.spec.as_ref());
            current.push(
                kept_from
                    .and_then(|s| s.get(key))
                    .map(|q| live_units(key, q)),
            );
            enforced.push(o.enforced.get(key).map(|q| live_units(key, q)));
        }
        let sum_used: i128 = used.iter().sum();
        if sum_used > total {
            plan.over.push((
                key.clone(),
                format(sum_used, scale(key)),
                format(total, scale(key)),
            ));
        }
        for (ns, t) in namespaces.iter().zip(targets(total, cap, &used, &current)) {
            let t = format(t, scale(key));
            if let Some(hard) = finals.get_mut(ns) {
                hard.insert(key.clone(), t.clone());
            }
            plan.decided
                .entry(ns.clone())
                .or_default()
                .insert(key.clone(), t);
        }
        keys.push((key.clone(), total, used, enforced));
    }
    // Step one: what shrinks (or is created) before anything grows.
    let mut firsts = BTreeMap::new();
    for ns in namespaces {
        let fin = &finals[ns];
        let first = match &obs(ns).spec {
            Some(spec) => pointwise_min(spec, fin),
            None => fin.clone(),
        };
        if obs(ns).spec.as_ref().is_none_or(|spec| !same(spec, &first)) {
            plan.shrinking.push(ns.clone());
        }
        firsts.insert(ns.clone(), first);
    }
    // Step two: a key's increases only when what every namespace could then use fits.
    for (key, total, used, enforced) in keys {
        let value = |m: &BTreeMap<String, BTreeMap<String, Quantity>>, ns: &String| {
            m[ns]
                .get(&key)
                .map(|q| units("spec.hard", &key, q, true))
                .transpose()
        };
        let mut grows = false;
        let mut fits_now = true;
        let mut bound_after: i128 = 0;
        let mut known = true;
        for (i, ns) in namespaces.iter().enumerate() {
            let (fin, first) = (value(&finals, ns)?, value(&firsts, ns)?);
            let (Some(fin), Some(first)) = (fin, first) else {
                continue;
            };
            grows |= fin > first;
            let Some(enf) = enforced[i] else {
                known = false;
                continue;
            };
            let after = used[i].max(enf).max(fin);
            let before = used[i].max(enf).max(first);
            bound_after += after;
            fits_now &= after <= before;
        }
        if grows && !(known && (bound_after <= total || fits_now)) {
            plan.held.push(key.clone());
            for ns in namespaces {
                if let Some(v) = firsts[ns].get(&key) {
                    finals.get_mut(ns).map(|h| h.insert(key.clone(), v.clone()));
                }
            }
        }
    }
    plan.no_increase = finals.clone();
    for (ns, first) in &firsts {
        if let Some(hard) = plan.no_increase.get_mut(ns) {
            for key in quota.tenant_hard.keys() {
                if let Some(v) = first.get(key) {
                    hard.insert(key.clone(), v.clone());
                }
            }
        }
    }
    plan.hard = finals;
    plan.first = firsts;
    Ok(plan)
}

/// `quota` with each key of `tenantHard` lowered by what the namespaces leaving the tenant
/// (being deleted and still there, as `observed`) may still hold: their objects count until
/// they are gone, so their room goes to the others only then. Each holds the most of its
/// quota's `status.used`, `status.hard` and `spec.hard`. `None` when one of them has no quota
/// any more (deleted with its namespace's contents): what it holds is unknown, and nothing
/// may grow.
///
/// # Errors
/// [`SplitError`] when a quantity does not parse exactly.
pub fn without_leaving(
    quota: &Quota,
    leaving: &[String],
    observed: &BTreeMap<String, Observed>,
) -> Result<Option<Quota>, SplitError> {
    let mut lowered = quota.clone();
    for (key, total) in &mut lowered.tenant_hard {
        let mut reserved = 0;
        for ns in leaving {
            let Some(o) = observed.get(ns) else {
                return Ok(None);
            };
            let spec = o.spec.as_ref().and_then(|s| s.get(key));
            let mut most = 0;
            for q in [o.used.get(key), o.enforced.get(key), spec]
                .into_iter()
                .flatten()
            {
                most = most.max(live_units(key, q));
            }
            reserved += most;
        }
        let left = units("quota.tenantHard", key, total, false)? - reserved;
        *total = format(left, scale(key));
    }
    Ok(Some(lowered))
}

/// The quotas of `namespaces` as they are live, from the controller's cache (no request on a
/// converged pass; a GET each when the pass has no cache of them).
///
/// # Errors
/// As [`Pass::children`].
pub(super) async fn observe(
    tenant: &Tenant,
    pass: &Pass<Tenant>,
    namespaces: &[String],
) -> Result<BTreeMap<String, Observed>, ReconcileError> {
    let mut probe = DesiredChildren::new();
    let mut report = ApplyReport::default();
    for ns in namespaces {
        if let Some(q) = quota_with(tenant, Some(ns), None) {
            probe.add(&q)?;
            report.children.push((
                ObjectKey::namespaced("ResourceQuota", ns, QUOTA),
                ChildOutcome::Unchanged,
            ));
        }
    }
    let live = pass.children(&probe, &report).await?;
    let mut observed = BTreeMap::new();
    for ns in namespaces {
        if let Some(q) = live.get_in::<ResourceQuota>(Some(ns), QUOTA)? {
            let status = q.status.unwrap_or_default();
            observed.insert(
                ns.clone(),
                Observed {
                    spec: Some(q.spec.and_then(|s| s.hard).unwrap_or_default()),
                    enforced: status.hard.unwrap_or_default(),
                    used: status.used.unwrap_or_default(),
                    recorded: None,
                },
            );
        }
    }
    Ok(observed)
}

/// Splits the tenant's `quota.tenantHard` over `namespaces` and writes the decreases (and the
/// quotas of new namespaces) now, before anything else of the pass; returns the plan, whose
/// [`Plan::hard`] the contents apply. `None` when the tenant has no `tenantHard`.
///
/// The first apply desires the quota of every namespace (those that do not shrink as they
/// are): an apply prunes the undesired children of the kinds it holds, and, as the contents'
/// apply does, it releases rather than prunes what is in `released`.
///
/// # Errors
/// A terminal [`ReconcileError`] (reason `QuotaInvalid`) when a quantity cannot be computed
/// with; otherwise as [`Pass::apply`] — a decrease that fails fails the pass, so no increase
/// is written.
///
/// # Cancel safety
/// As [`Pass::apply`]: a later pass reads what was written and goes on.
pub async fn settle(
    tenant: &Tenant,
    pass: &mut Pass<Tenant>,
    namespaces: &[String],
    leaving: &[String],
    released: &[String],
    usage: &UsageMemory,
    splits: &SplitMemory,
) -> Result<Option<Plan>, ReconcileError> {
    let tenant_hard = tenant
        .spec
        .quota
        .as_ref()
        .filter(|q| !q.tenant_hard.is_empty());
    let Some(quota) = tenant_hard else {
        splits.forget(tenant.metadata.uid.as_deref().unwrap_or_default());
        return Ok(None);
    };
    let invalid = |e: SplitError| ReconcileError::terminal("QuotaInvalid", e.to_string());
    let mut observed = observe(tenant, pass, namespaces).await?;
    let uid = tenant.metadata.uid.clone().unwrap_or_default();
    let status_record = (tenant.status.as_ref())
        .map(|s| s.quota_split.clone())
        .unwrap_or_default();
    let recorded = splits.current(&uid, &status_record);
    for ns in namespaces {
        if let Some(share) = recorded.get(ns) {
            // A quota deleted (by an administrator) is made again with its recorded share.
            observed.entry(ns.clone()).or_default().recorded = Some(share.clone());
        }
    }
    let used = observed.iter_mut().map(|(ns, o)| (ns, &mut o.used));
    let settling = usage
        .settle(&uid, used, usage_units, Instant::now())
        .map_err(invalid)?;
    let held_back = if leaving.is_empty() {
        Some(quota.clone())
    } else {
        let gone = observe(tenant, pass, leaving).await?;
        without_leaving(quota, leaving, &gone).map_err(invalid)?
    };
    let mut plan =
        plan(held_back.as_ref().unwrap_or(quota), namespaces, &observed).map_err(invalid)?;
    if held_back.is_none() {
        // A leaving namespace's holdings are unknown: what the others have stays theirs,
        // nothing more (its deletion reconciles the Tenant again).
        plan.hard = plan.no_increase.clone();
    }
    plan.settling = settling;
    splits.decided(&uid, status_record, plan.decided.clone());
    if !plan.shrinking.is_empty() {
        let mut first = DesiredChildren::new();
        first.prune_kind::<ResourceQuota>();
        for ns in released {
            first.release_in(ns);
        }
        for (ns, hard) in &plan.first {
            if let Some(q) = quota_with(tenant, Some(ns), Some(hard)) {
                first.add(&q)?;
            }
        }
        let report = pass.apply_part(&first).await?;
        let all_written = report.children.iter().all(|(_, o)| {
            matches!(
                o,
                ChildOutcome::Unchanged | ChildOutcome::Created | ChildOutcome::Applied
            )
        });
        if !all_written {
            // A quota that is not ours or is being deleted did not shrink: nothing grows.
            plan.hard = plan.no_increase.clone();
        }
    }
    Ok(Some(plan))
}

/// The readiness of a tenant whose quota is split: `Reconciling` (reason `QuotaMoving`) while
/// increases wait, the Ready message extended when usage is above the total; any other
/// readiness as it is.
pub fn readiness(plan: &Plan, readiness: Readiness) -> Readiness {
    match readiness {
        Readiness::Ready { reason, message } => {
            if let Some(note) = plan.held_note() {
                Readiness::Reconciling {
                    reason: "QuotaMoving".into(),
                    message: note,
                }
            } else if let Some(note) = plan.over_note() {
                Readiness::Ready {
                    reason,
                    message: format!("{message}; {note}"),
                }
            } else {
                Readiness::Ready { reason, message }
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs.iter().map(|(k, v)| ((*k).into(), q(v))).collect()
    }

    /// A small deterministic generator (xorshift), for random inputs without a dependency.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    #[test]
    fn canonical_formats() {
        for (units, scale, want) in [
            (0, 0, "0"),
            (6, 0, "6"),
            (1500, 0, "1500"),
            (3000, 0, "3k"),
            (1500, -3, "1500m"),
            (2000, -3, "2"),
            (2_500_000, -3, "2500"),
            (8_589_934_592, 0, "8589934592"),
            (5_000_000_000_000_000_000_000, 0, "5000E"),
        ] {
            assert_eq!(format(units, scale).0, want, "{units}e{scale}");
        }
    }

    #[test]
    fn headroom_is_shared_evenly_on_top_of_usage() {
        assert_eq!(targets(6, None, &[0, 0, 0], &[None, None, None]), [2, 2, 2]);
        // The remainder to the one using least: the quotas as even as they can be.
        assert_eq!(targets(6, None, &[2, 0, 0], &[None, None, None]), [3, 2, 1]);
        assert_eq!(targets(40, None, &[1, 0], &[None, None]), [20, 20]);
        assert_eq!(targets(40, None, &[1, 0], &[Some(20), None]), [20, 20]);
        // Remainder in order.
        assert_eq!(targets(7, None, &[0, 0, 0], &[None, None, None]), [3, 2, 2]);
        // Capped namespaces leave their share to the others.
        assert_eq!(
            targets(10, Some(2), &[0, 0, 0], &[None, None, None]),
            [2, 2, 2]
        );
        assert_eq!(
            targets(10, Some(3), &[3, 0, 0], &[None, None, None]),
            [3, 3, 3]
        );
        assert_eq!(
            targets(10, Some(6), &[0, 0, 0], &[None, None, None]),
            [4, 3, 3]
        );
        // Above the total: held at usage.
        assert_eq!(
            targets(6, None, &[4, 3, 0], &[Some(4), Some(2), Some(0)]),
            [4, 3, 0]
        );
    }

    /// Found by review: the headroom's remainder went to the first namespaces by name even
    /// when they were the ones using, so one namespace using its only unit took another's
    /// reserved unit (`[1, 1, 0]` becomes `[2, 0, 0]`: b's quota shrinks
    /// to 0 though nothing changed in b). Four GPUs over eight namespaces: `a` using one takes
    /// `d`'s, and `e`..`h` never get any room while three GPUs are free.
    #[test]
    fn a_namespace_using_its_share_does_not_take_anothers_reserved_unit() {
        assert_eq!(
            targets(2, None, &[1, 0, 0], &[Some(1), Some(1), Some(0)]),
            [1, 1, 0]
        );
        let current = [1, 1, 1, 1, 0, 0, 0, 0].map(Some);
        assert_eq!(
            targets(4, None, &[1, 0, 0, 0, 0, 0, 0, 0], &current),
            [1, 1, 1, 1, 0, 0, 0, 0]
        );
    }

    #[test]
    fn a_split_with_enough_room_everywhere_is_kept() {
        let current = [Some(2), Some(2), Some(2)];
        assert_eq!(targets(6, None, &[1, 0, 0], &current), [2, 2, 2]);
        // No room left in the first while others have some: redone, the remainder staying
        // with a namespace that holds it (one quota shrinks, not two).
        assert_eq!(targets(6, None, &[2, 0, 0], &current), [3, 2, 1]);
        // A sum other than the total: redone.
        assert_eq!(targets(9, None, &[0, 0, 0], &current), [3, 3, 3]);
    }

    #[test]
    fn random_splits_never_exceed_the_total_nor_the_cap() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let n = 1 + rng.below(6) as usize;
            let total = rng.below(40) as i128;
            let cap = (rng.below(3) == 0).then(|| rng.below(20) as i128);
            let used: Vec<i128> = (0..n).map(|_| rng.below(12) as i128).collect();
            let current: Vec<Option<i128>> = (0..n)
                .map(|_| (rng.below(4) != 0).then(|| rng.below(15) as i128))
                .collect();
            let t = targets(total, cap, &used, &current);
            let sum: i128 = t.iter().sum();
            let sum_used: i128 = used.iter().sum();
            if sum_used <= total {
                assert!(sum <= total, "{total} {cap:?} {used:?} {current:?} → {t:?}");
                for (ti, ui) in t.iter().zip(&used) {
                    assert!(
                        ti >= ui || cap.is_some_and(|c| *ti == c),
                        "below usage: {used:?} → {t:?}"
                    );
                }
            } else {
                assert!(sum <= sum_used, "{used:?} → {t:?}");
            }
            if let Some(c) = cap {
                assert!(t.iter().all(|ti| *ti <= c), "{cap:?} → {t:?}");
            }
        }
    }

    #[test]
    fn random_plans_shrink_first_and_grow_only_within_the_total() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let quota = quota(&[("pods", "8")], &[]);
        let total = 8;
        let v = |m: &BTreeMap<String, Quantity>| {
            m.get("pods").map(|q| units("x", "pods", q, true).unwrap())
        };
        for _ in 0..5_000 {
            let n = 1 + rng.below(4) as usize;
            let ns: Vec<String> = (0..n).map(|i| format!("t-{i}")).collect();
            let mut obs = BTreeMap::new();
            for name in &ns {
                if rng.below(6) == 0 {
                    continue; // no quota yet
                }
                let spec = rng.below(9).to_string();
                let enforced = (rng.below(5) != 0).then(|| rng.below(9).to_string());
                let used = rng.below(6).to_string();
                obs.insert(name.clone(), observed(&spec, enforced.as_deref(), &used));
            }
            let plan = plan(&quota, &ns, &obs).unwrap();
            let mut after = 0;
            let mut before = 0;
            let mut known = true;
            let mut grows = false;
            for name in &ns {
                let o = obs.get(name).cloned().unwrap_or_default();
                let (first, hard) = (v(&plan.first[name]).unwrap(), v(&plan.hard[name]).unwrap());
                // Step one never raises a live limit.
                if let Some(spec) = o.spec.as_ref().and_then(v) {
                    assert!(first <= spec, "{obs:?} → {plan:?}");
                }
                assert!(hard >= first, "{obs:?} → {plan:?}");
                grows |= hard > first;
                let used = v(&o.used).unwrap_or(0);
                match v(&o.enforced) {
                    Some(e) => {
                        after += used.max(e).max(hard);
                        before += used.max(e).max(first);
                    }
                    None => known = false,
                }
            }
            // Step two grows only what every namespace could then use within the total (or
            // raises no namespace's bound), and nothing while a limit is not enforced.
            if grows {
                assert!(
                    known && (after <= total || after <= before),
                    "{obs:?} → {plan:?}"
                );
            }
        }
    }

    fn quota(tenant: &[(&str, &str)], hard: &[(&str, &str)]) -> Quota {
        Quota {
            hard: map(hard),
            tenant_hard: map(tenant),
        }
    }

    fn observed(spec: &str, enforced: Option<&str>, used: &str) -> Observed {
        Observed {
            spec: Some(map(&[("pods", spec)])),
            enforced: enforced.map(|e| map(&[("pods", e)])).unwrap_or_default(),
            used: map(&[("pods", used)]),
            recorded: None,
        }
    }

    fn pods(m: &BTreeMap<String, Quantity>) -> &str {
        &m["pods"].0
    }

    #[test]
    fn a_leaving_namespace_keeps_what_it_holds_until_it_is_gone() {
        let quota = quota(&[("pods", "9")], &[]);
        let staying: Vec<String> = vec!["t-a".into(), "t-b".into()];
        let leaving: Vec<String> = vec!["t-c".into()];
        let obs: BTreeMap<String, Observed> = [
            ("t-a".to_string(), observed("3", Some("3"), "1")),
            ("t-b".to_string(), observed("3", Some("3"), "1")),
        ]
        .into_iter()
        .collect();
        // c holds its 3 (its quota's spec and status), however little it uses now.
        let c = [("t-c".to_string(), observed("3", Some("3"), "2"))].into();
        let lowered = without_leaving(&quota, &leaving, &c).unwrap().unwrap();
        assert_eq!(pods(&lowered.tenant_hard), "6");
        let plan = plan(&lowered, &staying, &obs).unwrap();
        assert_eq!(plan.hard.values().map(pods).collect::<Vec<_>>(), ["3", "3"]);
        // Usage above what it was given counts too.
        let c = [("t-c".to_string(), observed("3", Some("3"), "5"))].into();
        let lowered = without_leaving(&quota, &leaving, &c).unwrap().unwrap();
        assert_eq!(pods(&lowered.tenant_hard), "4");
        // Its quota gone, what it holds is unknown: no lowered total, nothing grows.
        assert_eq!(
            without_leaving(&quota, &leaving, &BTreeMap::new()).unwrap(),
            None
        );
        // Nothing leaving, nothing lowered.
        let same = without_leaving(&quota, &[], &BTreeMap::new()).unwrap();
        assert_eq!(same, Some(quota));
    }

    #[test]
    fn a_live_value_too_large_to_compute_with_holds_everything_instead_of_failing() {
        assert_eq!(live_units("requests.memory", &q("10e39")), LIVE_UNITS_CAP);
        assert_eq!(live_units("pods", &q("not a quantity")), LIVE_UNITS_CAP);
        assert_eq!(live_units("cpu", &q("1500m")), 1500);
        // An owner's Pod requesting 1e40 of a key: usage above the total, every namespace
        // held at its usage, no error (it stalled the Tenant and stopped every repair).
        let quota = quota(&[("pods", "6")], &[]);
        let ns: Vec<String> = vec!["t-a".into(), "t-b".into()];
        let obs: BTreeMap<String, Observed> = [
            ("t-a".into(), observed("3", Some("3"), "1e40")),
            ("t-b".into(), observed("3", Some("9e99"), "1")),
        ]
        .into();
        let plan = plan(&quota, &ns, &obs).expect("no error from live values");
        assert_eq!(plan.over.len(), 1, "{plan:?}");
        let hard: Vec<&str> = plan.hard.values().map(pods).collect();
        assert_eq!(hard, ["3", "1"], "nothing grows: b held at its usage");
    }

    /// Found by the kit's tamper check in CI: 40 configmaps over dev and prod, split 20/20
    /// while neither used any; then dev's `kube-root-ca.crt` was counted, not yet prod's (a
    /// split kept, rooms large enough). An administrator set dev's quota to 21: judged from
    /// the live quotas, the split was no longer kept, and the fresh split of 39 free over usage
    /// 1/0 gave dev 21 and prod 19. The edit stayed and prod, untouched, lost one. (The
    /// remainder now goes to the namespace using least, so usage 1/0 splits 20/20 anyway;
    /// usage 2/0 shows what only the record mends.)
    #[test]
    fn an_edited_quota_is_put_back_to_the_recorded_split_and_no_other_moves() {
        let quota = quota(&[("pods", "40")], &[]);
        let ns: Vec<String> = vec!["t-dev".into(), "t-prod".into()];
        let mut obs: BTreeMap<String, Observed> = [
            ("t-dev".into(), observed("21", Some("21"), "2")),
            ("t-prod".into(), observed("20", Some("20"), "0")),
        ]
        .into();
        let from_live = plan(&quota, &ns, &obs).unwrap();
        let hard: Vec<&str> = from_live.hard.values().map(pods).collect();
        assert_eq!(hard, ["21", "19"], "the defect, without a record");

        for o in obs.values_mut() {
            o.recorded = Some(map(&[("pods", "20")]));
        }
        let plan = plan(&quota, &ns, &obs).unwrap();
        let hard: Vec<&str> = plan.hard.values().map(pods).collect();
        assert_eq!(hard, ["20", "20"], "{plan:?}");
        assert_eq!(
            plan.shrinking,
            ["t-dev"],
            "only the edited quota is written"
        );
        assert!(plan.held.is_empty(), "{plan:?}");
        assert_eq!(plan.decided, plan.hard, "the record stays");

        // A quota deleted is made again with its share; the other keeps its own.
        obs.insert(
            "t-dev".into(),
            Observed {
                recorded: Some(map(&[("pods", "20")])),
                ..Observed::default()
            },
        );
        let plan = super::plan(&quota, &ns, &obs).unwrap();
        let hard: Vec<&str> = plan.hard.values().map(pods).collect();
        assert_eq!(hard, ["20", "20"], "{plan:?}");
        assert_eq!(plan.shrinking, ["t-dev"], "created, nothing else written");

        // A record that is no longer good enough (prod now uses 19 of its 20) is split anew.
        obs.insert("t-dev".into(), observed("20", Some("20"), "1"));
        obs.insert("t-prod".into(), observed("20", Some("20"), "19"));
        for o in obs.values_mut() {
            o.recorded = Some(map(&[("pods", "20")]));
        }
        let plan = super::plan(&quota, &ns, &obs).unwrap();
        assert_eq!(plan.decided["t-dev"]["pods"].0, "11", "{plan:?}");
        assert_eq!(plan.decided["t-prod"]["pods"].0, "29", "{plan:?}");
    }

    #[test]
    fn decreases_come_first_and_increases_wait_until_enforced() {
        let quota = quota(&[("pods", "6")], &[]);
        let ns: Vec<String> = vec!["t-a".into(), "t-b".into(), "t-c".into()];
        // `a` filled its 2; b and c have room: a grows by the even share, the remainder stays
        // with b (which holds it), c shrinks.
        let mut obs: BTreeMap<String, Observed> = [
            ("t-a".into(), observed("2", Some("2"), "2")),
            ("t-b".into(), observed("2", Some("2"), "0")),
            ("t-c".into(), observed("2", Some("2"), "0")),
        ]
        .into();
        let plan = plan(&quota, &ns, &obs).unwrap();
        assert_eq!(plan.shrinking, ["t-c"]);
        let first: Vec<&str> = plan.first.values().map(pods).collect();
        assert_eq!(first, ["2", "2", "1"]);
        // The decrease is not enforced yet: a keeps 2 for now.
        assert_eq!(plan.held, ["pods"]);
        let hard: Vec<&str> = plan.hard.values().map(pods).collect();
        assert_eq!(hard, ["2", "2", "1"]);
        // Applied, but status.hard still says 2: still held, nothing more to shrink.
        obs.insert("t-c".into(), observed("1", Some("2"), "0"));
        let plan2 = super::plan(&quota, &ns, &obs).unwrap();
        assert!(plan2.shrinking.is_empty(), "{plan2:?}");
        assert_eq!(plan2.held, ["pods"]);
        // Enforced: a grows to 3, Σ = 6.
        obs.insert("t-c".into(), observed("1", Some("1"), "0"));
        let plan3 = super::plan(&quota, &ns, &obs).unwrap();
        assert!(
            plan3.shrinking.is_empty() && plan3.held.is_empty(),
            "{plan3:?}"
        );
        let hard: Vec<&str> = plan3.hard.values().map(pods).collect();
        assert_eq!(hard, ["3", "2", "1"]);
    }

    #[test]
    fn usage_admitted_past_a_stale_read_holds_the_increase() {
        // b shrank to 1 but had admitted 2 pods meanwhile: a may not grow to 4 (2 + 2 + 4 > 6
        // counting c's 0).
        let quota = quota(&[("pods", "6")], &[]);
        let ns: Vec<String> = vec!["t-a".into(), "t-b".into(), "t-c".into()];
        let obs: BTreeMap<String, Observed> = [
            ("t-a".into(), observed("2", Some("2"), "2")),
            ("t-b".into(), observed("1", Some("1"), "2")),
            ("t-c".into(), observed("1", Some("1"), "0")),
        ]
        .into();
        let plan = plan(&quota, &ns, &obs).unwrap();
        let bound: i128 = plan
            .hard
            .iter()
            .map(|(n, h)| {
                let o = &obs[n];
                let v =
                    |m: &BTreeMap<String, Quantity>| units("x", "pods", &m["pods"], true).unwrap();
                v(h).max(v(&o.used)).max(v(&o.enforced))
            })
            .sum();
        assert!(bound <= 6, "{plan:?}");
    }

    #[test]
    fn new_quotas_are_created_first_and_keys_of_hard_are_kept() {
        let quota = quota(
            &[("pods", "6"), ("cpu", "3")],
            &[("pods", "3"), ("memory", "1Gi")],
        );
        let ns: Vec<String> = vec!["t-a".into(), "t-b".into()];
        let plan = plan(&quota, &ns, &BTreeMap::new()).unwrap();
        assert_eq!(plan.shrinking.len(), 2);
        assert!(plan.held.is_empty(), "nothing grows: {plan:?}");
        let a = &plan.hard["t-a"];
        assert_eq!(a["pods"].0, "3");
        assert_eq!(a["cpu"].0, "1500m");
        assert_eq!(a["memory"].0, "1Gi");
    }

    #[test]
    fn usage_above_the_total_freezes_and_says_so() {
        let quota = quota(&[("pods", "4")], &[]);
        let ns: Vec<String> = vec!["t-a".into(), "t-b".into()];
        let obs: BTreeMap<String, Observed> = [
            ("t-a".into(), observed("3", Some("3"), "3")),
            ("t-b".into(), observed("3", Some("3"), "2")),
        ]
        .into();
        let plan = plan(&quota, &ns, &obs).unwrap();
        let hard: Vec<&str> = plan.hard.values().map(pods).collect();
        assert_eq!(hard, ["3", "2"]);
        assert!(plan.over_note().unwrap().contains("pods 5 > 4"), "{plan:?}");
    }
}
