//! Our create's ownership record (operation `Update`, as every `POST` records) seen as, and
//! moved to, our `Apply` entry.
//!
//! A create is one `POST`; the `Update` entry it records is moved to an `Apply` entry lazily,
//! only when an apply is needed: until then [`as_applied`] lets the convergence check judge
//! the child as if it had been moved.
//!
//! Server defaults: the `Update` entry of a `POST` also owns every field the API server
//! defaulted or allocated on create (a Deployment's `progressDeadlineSeconds`,
//! `revisionHistoryLimit`, `strategy`, a container's `terminationMessagePath`, a Service's
//! `clusterIP`). This does not make the convergence check say "converged" wrongly:
//! [`as_applied`] keeps of that entry only what an apply of the desired body records (the
//! oracle test compares it with the server's dry-run apply), so defaults are never judged.
//! It does not make us fight another writer over them: an `Update` (`kubectl edit`, a
//! controller's write) takes them over without a conflict, and our applies never send them.
//! What it does: until the desired body first changes, another manager's server-side apply of
//! such a field without `force` meets a conflict naming our manager (server-side apply: conflicts are
//! reported against every owner, `Update` entries included), although we never desired the
//! field. Once the desired body changes, [`fold_patch`] moves the whole entry into our `Apply`
//! entry and the apply that follows drops every field it does not send from our ownership;
//! the object loses those values only where no other manager owns them, and the server defaults
//! (or, for a Service's allocated IPs and ports, keeps) them again. Narrowing the `Update`
//! entry right after the create would end the false claim at once, for a second write per
//! create; we keep creates at one write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Map, Value, json};

use super::Labels;
use crate::compare::{Drift, DriftKind, check, check_entries};

/// `entries` with `manager`'s main-resource `Update` entry folded into its `Apply` entry: the
/// `Update` entry becomes the `Apply` entry when there is none, otherwise its field set is
/// united with the `Apply` entry's and it is dropped. With `desired` (the body that was
/// created), a moved entry keeps only what an apply of that body would have recorded; without
/// it, everything the `Update` recorded (so an apply can remove all of it).
pub(crate) fn fold_update_into_apply(
    entries: &[ManagedFieldsEntry],
    manager: &str,
    desired: Option<&Value>,
) -> Vec<ManagedFieldsEntry> {
    let is = |e: &ManagedFieldsEntry, op: &str| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    };
    let updates: Vec<&ManagedFieldsEntry> = entries.iter().filter(|e| is(e, "Update")).collect();
    let mut out: Vec<ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| !is(e, "Update"))
        .cloned()
        .collect();
    for update in updates {
        match out.iter_mut().find(|e| is(e, "Apply")) {
            Some(apply) => {
                let mut fields = apply.fields_v1.take().map_or(Value::Null, |f| f.0);
                if let Some(more) = &update.fields_v1 {
                    crate::compare::unite_fields(&mut fields, &more.0);
                }
                apply.fields_v1 = Some(FieldsV1(fields));
                apply.time = None;
            }
            None => {
                let mut moved = update.clone();
                moved.operation = Some("Apply".to_owned());
                moved.time = None;
                // An Update entry also records server defaults and every map it touched; keep
                // what an apply of the desired body would have recorded (checked against the
                // API server by the oracle test).
                if let (Some(FieldsV1(f)), Some(desired)) = (&mut moved.fields_v1, desired) {
                    *f = crate::compare::restrict_to_desired(desired, f, None);
                }
                out.push(moved);
            }
        }
    }
    out
}

/// `manager`'s main-resource entries of `entries` with operation `op`.
fn entries_of<'a>(
    entries: &'a [ManagedFieldsEntry],
    manager: &'a str,
    op: &'a str,
) -> impl Iterator<Item = &'a ManagedFieldsEntry> {
    entries.iter().filter(move |e| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or("").is_empty()
    })
}

/// Whether `manager`'s `Update` entry is the record of a create of `desired`: it owns the
/// fingerprint annotation ([`Labels::fingerprint`]), whose value is `desired`'s (the
/// fingerprint covers the whole stamped body).
fn create_record_of(
    labels: Labels,
    live: &Value,
    entries: &[ManagedFieldsEntry],
    manager: &str,
    desired: &Value,
) -> bool {
    let print = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(labels.fingerprint()))
            .cloned()
    };
    entries_of(entries, manager, "Update").any(|e| owns_print(labels, e))
        && print(live).is_some()
        && print(live) == print(desired)
}

/// Whether `e` owns the fingerprint annotation ([`Labels::fingerprint`]).
fn owns_print(labels: Labels, e: &ManagedFieldsEntry) -> bool {
    e.fields_v1
        .as_ref()
        .and_then(|f| f.0.pointer("/f:metadata/f:annotations"))
        .and_then(|a| a.get(format!("f:{}", labels.fingerprint())))
        .is_some()
}

fn managed_fields(live: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    // Read in place: no copy of the whole `managedFields` list first.
    serde::Deserialize::deserialize(live.pointer("/metadata/managedFields")?).ok()
}

/// `live` without `metadata.managedFields`, copied member by member (the list is replaced
/// anyway, and is often the larger part of a small object).
fn without_managed_fields(live: &Value) -> Option<Value> {
    let mut out = Map::new();
    for (k, v) in live.as_object()? {
        let v = match (k.as_str(), v) {
            ("metadata", Value::Object(meta)) => Value::Object(
                meta.iter()
                    .filter(|(mk, _)| mk.as_str() != "managedFields")
                    .map(|(mk, mv)| (mk.clone(), mv.clone()))
                    .collect(),
            ),
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Some(Value::Object(out))
}

/// `live`'s `managedFields` with `manager`'s `Apply` entry and without its `Update` entries,
/// when it has both: where [`as_applied`] judges such a child never applied (the `Apply` entry holds another
/// field set), this view tells which of the fields another manager took (reported as their
/// drift, however often someone writes under our name).
fn apply_entry_alone(live: &Value, manager: &str) -> Option<Vec<Value>> {
    let entries = managed_fields(live)?;
    entries_of(&entries, manager, "Update").next()?;
    entries_of(&entries, manager, "Apply").next()?;
    entries
        .iter()
        .filter(|e| {
            e.manager.as_deref() != Some(manager)
                || e.operation.as_deref() != Some("Update")
                || !e.subresource.as_deref().unwrap_or("").is_empty()
        })
        .map(|e| serde_json::to_value(e).ok())
        .collect()
}

/// What the convergence check finds between the desired `body` and `live` for `manager`
/// (stamping the owner kind's `labels`), judged as [`as_applied`] says. Judged never applied
/// beside an `Update` entry under our name (which anyone allowed to write the child can make),
/// it is the fields another manager took from our `Apply` entry, when there are any: still
/// theirs to report.
pub(crate) fn drift_of(live: &Value, labels: Labels, manager: &str, body: &Value) -> Vec<Drift> {
    let drift = judged(live, labels, manager, body);
    if !drift.iter().any(|d| d.kind == DriftKind::NeverApplied) {
        return drift;
    }
    let Some(alone) = apply_entry_alone(live, manager) else {
        return drift;
    };
    let taken: Vec<Drift> = check_entries(body, live, &alone, manager)
        .into_iter()
        .filter(|d| matches!(&d.kind, DriftKind::NotOwned { managers } if !managers.is_empty()))
        .collect();
    if taken.is_empty() { drift } else { taken }
}

/// What the convergence check finds between the desired `body` and `live` for `manager`,
/// judged as [`as_applied`] says (with the entries it would put, not a copy of `live`).
pub(crate) fn judged(live: &Value, labels: Labels, manager: &str, body: &Value) -> Vec<Drift> {
    match applied_entries(live, labels, manager, body) {
        Some(entries) => check_entries(body, live, &entries, manager),
        None => check(body, live, manager),
    }
}

/// `live` as the convergence check (`compare::check`) judges it for `manager`
/// (stamping the owner kind's `labels`), when we have an `Update` entry (the record of our `POST` create, or of someone's write under our
/// name); `None` when the child is to be judged as it is.
///
/// - Created from `desired` and not applied to since: with that `Update` entry replaced by
///   the `Apply` entry an apply of `desired` records — what the server would hold had the
///   create been an apply (the oracle test checks this against the API server's dry-run
///   apply).
/// - Applied to since, and our `Apply` entry holds exactly what an apply of `desired` records
///   (our own apply, which leaves the create's record beside it): as it is.
/// - Applied to since with another field set (someone applied a part under our name, or the
///   desired body changed): with neither entry, i.e. never applied — one apply of ours (after
///   folding the `Update` entry in) records the whole body again.
///
/// Anyone else's change of a field since moves it out of our `Update` entry (or removes it
/// from every entry) exactly as it would have from an `Apply` entry, so drift is still seen.
pub fn as_applied(live: &Value, labels: Labels, manager: &str, desired: &Value) -> Option<Value> {
    let entries = applied_entries(live, labels, manager, desired)?;
    let mut out = without_managed_fields(live)?;
    out["metadata"]["managedFields"] = Value::Array(entries);
    Some(out)
}

/// The `managedFields` [`as_applied`] puts in `live`; `None` when it is judged as it is.
fn applied_entries(
    live: &Value,
    labels: Labels,
    manager: &str,
    desired: &Value,
) -> Option<Vec<Value>> {
    applied_from(live, &managed_fields(live)?, labels, manager, desired)
}

/// [`applied_entries`] of `live` whose `managedFields` are `entries`.
fn applied_from(
    live: &Value,
    entries: &[ManagedFieldsEntry],
    labels: Labels,
    manager: &str,
    desired: &Value,
) -> Option<Vec<Value>> {
    let record: Vec<&ManagedFieldsEntry> = entries_of(entries, manager, "Update").collect();
    if record.is_empty() {
        return None;
    }
    let (all, recorded) = recorded_by_apply(entries, desired, live);
    let ours: Vec<ManagedFieldsEntry> = match entries_of(entries, manager, "Apply").next() {
        None if create_record_of(labels, live, entries, manager, desired) => {
            // Of what the apply records, what our create's record still holds: a field another
            // manager took since is not ours, as it would not be in an Apply entry.
            let mine = fields_of(&record);
            if written_beyond(live, &mine, &recorded, desired) {
                // Judged never applied: the fold and the apply remove what was written.
                Vec::new()
            } else {
                let mut moved = record[0].clone();
                moved.operation = Some("Apply".to_owned());
                moved.time = None;
                moved.fields_v1 = Some(FieldsV1(Value::Object(members_in_both(
                    recorded.as_object()?,
                    mine.as_object()?,
                    all.as_object()?,
                ))));
                vec![moved]
            }
        }
        None => return None,
        Some(apply) if apply.fields_v1.as_ref().map(|f| &f.0) == Some(&recorded) => return None,
        Some(_) => Vec::new(),
    };
    let others = entries.iter().filter(|e| {
        e.manager.as_deref() != Some(manager) || !e.subresource.as_deref().unwrap_or("").is_empty()
    });
    others
        .chain(ours.iter())
        .map(|e| serde_json::to_value(e).ok())
        .collect()
}

/// The union of the field sets of every main-resource entry of `entries`, and of it what an
/// apply of `desired` records (list items are keyed by the field sets on record).
fn recorded_by_apply(
    entries: &[ManagedFieldsEntry],
    desired: &Value,
    live: &Value,
) -> (Value, Value) {
    let main: Vec<&ManagedFieldsEntry> = entries
        .iter()
        .filter(|e| e.subresource.as_deref().unwrap_or("").is_empty())
        .collect();
    let all = fields_of(&main);
    let recorded = crate::compare::restrict_to_desired(desired, &all, Some(live));
    (all, recorded)
}

/// The union of the field sets of `entries`.
fn fields_of(entries: &[&ManagedFieldsEntry]) -> Value {
    let mut all = Value::Null;
    for e in entries {
        if let Some(f) = &e.fields_v1 {
            crate::compare::unite_fields(&mut all, &f.0);
        }
    }
    all
}

/// Whether our create's record (its field set `mine`) owns more than
/// [`FOREIGN_BYTES_MAX`](crate::cache::FOREIGN_BYTES_MAX) bytes of `live` beyond what an apply
/// of the desired body records (`recorded`). Beyond it, a create's record holds only the
/// server's defaults, a few hundred bytes; more was written under our field manager's name
/// since (an `Update` with our name merges into the create's entry). Judged as applied, such a
/// child would keep it: the check never reads it, no apply removes it, and the caches, which
/// count that entry as ours, would keep all of it. Judged never applied, it is folded into our
/// `Apply` entry and the apply that follows removes it, as from an `Apply` entry of ours.
fn written_beyond(live: &Value, mine: &Value, recorded: &Value, desired: &Value) -> bool {
    let max = crate::cache::FOREIGN_BYTES_MAX;
    crate::cache::bytes_beyond(live, mine, recorded, desired, max) > max
}

/// The `fieldsV1` set of the members of `recorded` that are also members of `mine`, or that no
/// entry records at all (`all`): a zero value or empty map of the desired body that the live
/// object holds, which a create does not record and an apply does (see
/// [`crate::compare::restrict_to_desired`]). A node is a member when it is `{}` or has the `.`
/// marker; a node with children only is a path to members.
fn members_in_both(
    recorded: &Map<String, Value>,
    mine: &Map<String, Value>,
    all: &Map<String, Value>,
) -> Map<String, Value> {
    let member = |m: &Map<String, Value>| m.is_empty() || m.contains_key(".");
    let mut out = Map::new();
    for (k, rv) in recorded {
        let Some(rv) = rv.as_object().filter(|_| k != ".") else {
            continue;
        };
        let Some(av) = all.get(k).and_then(Value::as_object) else {
            out.insert(k.clone(), Value::Object(rv.clone()));
            continue;
        };
        let Some(mv) = mine.get(k).and_then(Value::as_object) else {
            continue;
        };
        let mut node = members_in_both(rv, mv, av);
        let both = member(rv) && member(mv);
        if both && !node.is_empty() {
            node.insert(".".into(), json!({}));
        }
        if both || !node.is_empty() {
            out.insert(k.clone(), Value::Object(node));
        }
    }
    out
}

/// The merge patch that folds `manager`'s `Update` entry of `live` into its `Apply` entry
/// (everything the `Update` recorded: the fields of an older desired body must be ours for
/// the apply to remove them; server defaults among them are defaulted again by the API
/// server), guarded by `live`'s `resourceVersion`. `None` when there is nothing to fold, and
/// when the `Update` entry is the record of a create of `desired` itself holding no more than
/// the server's defaults beyond it: the apply records the whole body in our `Apply` entry, and
/// the create's record beside it removes nothing until the desired body changes (then this
/// folds it).
pub(crate) fn fold_patch(
    live: &Value,
    labels: Labels,
    manager: &str,
    desired: &Value,
) -> Option<Value> {
    let entries = managed_fields(live)?;
    let record: Vec<&ManagedFieldsEntry> = entries_of(&entries, manager, "Update").collect();
    if record.is_empty() {
        return None;
    }
    // Beyond the desired body, a record holding more than the server's defaults is folded: the
    // apply that follows removes what was written under our name (see `written_beyond`).
    if create_record_of(labels, live, &entries, manager, desired)
        && !written_beyond(
            live,
            &fields_of(&record),
            &recorded_by_apply(&entries, desired, live).1,
            desired,
        )
    {
        return None;
    }
    let moved = fold_update_into_apply(&entries, manager, None);
    Some(json!({"metadata": {
        "managedFields": moved,
        "resourceVersion": live.pointer("/metadata/resourceVersion"),
    }}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::FINGERPRINT_ANNOTATION;

    fn entry(manager: &str, op: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn update_entry_is_moved_or_united_into_apply() {
        let create = [
            entry("idem", "Update", json!({"f:data": {"f:a": {}}})),
            entry("rival", "Update", json!({"f:data": {"f:r": {}}})),
        ];
        let desired = json!({"data": {"a": "x"}});
        let moved = fold_update_into_apply(&create, "idem", Some(&desired));
        assert_eq!(moved.len(), 2);
        assert_eq!(moved[0], create[1]);
        assert_eq!(moved[1].operation.as_deref(), Some("Apply"));
        assert_eq!(moved[1].fields_v1, create[0].fields_v1);

        let replaced = [
            entry(
                "idem",
                "Apply",
                json!({"f:spec": {"f:selector": {}, "f:ports": {"k:{\"port\":80}": {".": {}}}}}),
            ),
            entry(
                "idem",
                "Update",
                json!({"f:spec": {"f:ports": {"k:{\"port\":80}": {"f:name": {}}}}}),
            ),
        ];
        let united = fold_update_into_apply(&replaced, "idem", Some(&desired));
        assert_eq!(united.len(), 1);
        assert_eq!(united[0].operation.as_deref(), Some("Apply"));
        assert_eq!(
            united[0].fields_v1,
            Some(FieldsV1(json!({"f:spec": {
                "f:selector": {},
                "f:ports": {"k:{\"port\":80}": {".": {}, "f:name": {}}},
            }})))
        );
    }

    /// A ConfigMap as a `POST` of `{"data": {"a": "x"}}` with fingerprint `p1` leaves it.
    fn created() -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "c", "resourceVersion": "5",
                "annotations": {FINGERPRINT_ANNOTATION: "p1"},
                "managedFields": [entry("idem", "Update", json!({
                    "f:data": {".": {}, "f:a": {}},
                    "f:metadata": {"f:annotations": {".": {}, format!("f:{FINGERPRINT_ANNOTATION}"): {}}}
                }))]
            },
            "data": {"a": "x"}
        })
    }

    fn desired(print: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "annotations": {FINGERPRINT_ANNOTATION: print}},
               "data": data})
    }

    #[test]
    fn a_create_is_judged_as_applied_only_while_its_body_is_desired() {
        let live = created();
        let same = desired("p1", json!({"a": "x"}));
        let judged = as_applied(&live, Labels::operator(), "idem", &same)
            .expect("created from the desired body");
        let entries = judged["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["operation"], "Apply");
        // What an apply records: no `.` markers of the maps the create touched.
        assert_eq!(
            entries[0]["fieldsV1"],
            json!({"f:data": {"f:a": {}},
                   "f:metadata": {"f:annotations": {format!("f:{FINGERPRINT_ANNOTATION}"): {}}}})
        );
        assert!(crate::compare::check(&same, &judged, "idem").is_empty());

        // Another desired body (another fingerprint): judged as it is, never applied.
        assert!(as_applied(&live, Labels::operator(), "idem", &desired("p2", json!({}))).is_none());
        // The fingerprint written by someone else (their entry owns it): as it is.
        let mut forged = live.clone();
        forged["metadata"]["managedFields"] = json!([
            entry("idem", "Update", json!({"f:data": {"f:a": {}}})),
            entry(
                "mallory",
                "Update",
                json!({"f:metadata": {"f:annotations": {
                format!("f:{FINGERPRINT_ANNOTATION}"): {}}}})
            ),
        ]);
        assert!(as_applied(&forged, Labels::operator(), "idem", &same).is_none());
        // Someone applied a part under our name since: judged never applied.
        let mut applied = live.clone();
        applied["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::to_value(entry("idem", "Apply", json!({"f:data": {}}))).unwrap());
        let split = as_applied(&applied, Labels::operator(), "idem", &same).expect("split record");
        assert_eq!(split["metadata"]["managedFields"], json!([]));
        assert!(!crate::compare::check(&same, &split, "idem").is_empty());
        // Our own apply since (the whole body): judged as it is.
        let whole = &judged["metadata"]["managedFields"][0]["fieldsV1"];
        applied["metadata"]["managedFields"][1]["fieldsV1"] = whole.clone();
        assert!(as_applied(&applied, Labels::operator(), "idem", &same).is_none());
        // Folded and applied: the Apply entry alone is the record.
        let mut folded = live.clone();
        folded["metadata"]["managedFields"] = json!([entry("idem", "Apply", json!({}))]);
        assert!(as_applied(&folded, Labels::operator(), "idem", &same).is_none());
    }

    #[test]
    fn a_create_record_written_into_under_our_name_is_judged_never_applied_and_folded() {
        // A merge patch with our field manager's name merged `pad` into the create's entry.
        let padded = |n: usize| {
            let mut live = created();
            live["data"]["pad"] = json!("p".repeat(n));
            live["metadata"]["managedFields"][0]["fieldsV1"]["f:data"]["f:pad"] = json!({});
            live
        };
        let same = desired("p1", json!({"a": "x"}));
        // Small, as the server's defaults are: still the create's record, nothing to fold.
        let small = padded(100);
        let judged = as_applied(&small, Labels::operator(), "idem", &same).unwrap();
        assert!(crate::compare::check(&same, &judged, "idem").is_empty());
        assert!(fold_patch(&small, Labels::operator(), "idem", &same).is_none());
        // More than defaults ever are: never applied, and the fold moves the pad into our Apply
        // entry (the apply that follows removes it).
        let large = padded(crate::cache::FOREIGN_BYTES_MAX + 1);
        let judged = as_applied(&large, Labels::operator(), "idem", &same).unwrap();
        assert_eq!(judged["metadata"]["managedFields"], json!([]));
        let drift = crate::compare::check(&same, &judged, "idem");
        assert!(
            drift.iter().all(|d| d.kind == DriftKind::NeverApplied),
            "{drift:?}"
        );
        assert!(!drift.is_empty());
        let patch = fold_patch(&large, Labels::operator(), "idem", &same).expect("folded");
        let moved = &patch["metadata"]["managedFields"][0];
        assert_eq!(moved["operation"], "Apply");
        assert_eq!(moved["fieldsV1"]["f:data"]["f:pad"], json!({}));
    }

    #[test]
    fn an_entry_rewritten_to_claim_a_map_whole_is_judged_never_applied() {
        let same = desired("p1", json!({"a": "x"}));
        let claimed = |pad: usize, op: &str| {
            let mut live = created();
            live["data"]["pad"] = json!("p".repeat(pad));
            let entry = &mut live["metadata"]["managedFields"][0];
            entry["fieldsV1"]["f:data"] = json!({});
            entry["operation"] = json!(op);
            live
        };
        let never = |live: &Value| {
            judged(live, Labels::operator(), "idem", &same)
                .iter()
                .any(|d| d.kind == DriftKind::NeverApplied)
        };
        let large = crate::cache::FOREIGN_BYTES_MAX + 1;
        // The create's record claims `data` whole: folded, as above.
        assert!(never(&claimed(large, "Update")));
        assert!(fold_patch(&claimed(large, "Update"), Labels::operator(), "idem", &same).is_some());
        assert!(!never(&claimed(100, "Update")));
        // Our Apply entry claims it whole: not a reason to apply (an atomic value, or an empty
        // map desired, is recorded so by the apply itself, and server defaults inside one can
        // make it longer than desired for good); the caches count what it holds instead.
        assert!(!never(&claimed(large, "Apply")));
        assert!(!never(&claimed(100, "Apply")));
        // An empty map desired is recorded whole by the apply itself: applying again would
        // change nothing, so what others wrote there is never a reason to (the caches count
        // it instead).
        let empty = desired("p1", json!({}));
        let mut live = claimed(large, "Apply");
        live["data"].as_object_mut().unwrap().remove("a");
        let drift = judged(&live, Labels::operator(), "idem", &empty);
        assert!(
            drift.iter().all(|d| d.kind != DriftKind::NeverApplied),
            "{drift:?}"
        );
    }

    #[test]
    fn a_fold_for_a_changed_body_keeps_every_field_the_create_set() {
        let live = created();
        // Desired now lacks `a`: the moved entry must own it for the apply to remove it.
        let patch = fold_patch(
            &live,
            Labels::operator(),
            "idem",
            &desired("p2", json!({"b": "y"})),
        )
        .unwrap();
        let moved = &patch["metadata"]["managedFields"][0];
        assert_eq!(moved["operation"], "Apply");
        assert_eq!(moved["fieldsV1"]["f:data"], json!({".": {}, "f:a": {}}));
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        // The same body: nothing to fold, the apply records it whole.
        assert!(
            fold_patch(
                &live,
                Labels::operator(),
                "idem",
                &desired("p1", json!({"a": "x"}))
            )
            .is_none()
        );
    }
}

#[cfg(test)]
mod shared_map_tests {
    use super::*;
    use crate::labels::FINGERPRINT_ANNOTATION;

    /// Our create's only `data` key removed by a JSON patch after another manager added one:
    /// the server leaves our `Update` entry with `f:data: {}` (the map itself, no keys).
    fn with_entries(ours: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "c", "resourceVersion": "5",
                "annotations": {FINGERPRINT_ANNOTATION: "p1"},
                "managedFields": ours
            },
            "data": {"extra": "eA=="}
        })
    }

    fn desired() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "annotations": {FINGERPRINT_ANNOTATION: "p1"}},
               "data": {"accessKey": "AKIA"}})
    }

    /// The drift names the removed key, and nothing else.
    fn assert_named(live: &Value) {
        let drift = drift_of(live, Labels::operator(), "idem", &desired());
        let paths: Vec<&str> = drift.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, [".data.accessKey"], "{drift:?}");
    }

    fn print_owned() -> Value {
        json!({"f:annotations": {".": {}, format!("f:{FINGERPRINT_ANNOTATION}"): {}}})
    }

    #[test]
    fn the_only_key_of_a_shared_map_removed_after_a_create_is_named() {
        let live = with_entries(json!([
            {"manager": "idem", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {}, "f:metadata": print_owned()}},
            {"manager": "kubectl-patch", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {"f:extra": {}}}},
        ]));
        assert_named(&live);
    }

    #[test]
    fn the_only_key_of_a_shared_map_removed_after_an_apply_is_named() {
        // Our apply since restored it beside the create's record (`f:data: {}`).
        let live = with_entries(json!([
            {"manager": "idem", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{FINGERPRINT_ANNOTATION}"): {}}}}},
            {"manager": "idem", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {}, "f:metadata": print_owned()}},
            {"manager": "kubectl-patch", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:data": {"f:extra": {}}}},
        ]));
        assert_named(&live);
    }
}
