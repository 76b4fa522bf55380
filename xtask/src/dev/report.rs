//! Whether the applied examples are Ready, and the table of tenants, their namespaces,
//! children and conditions, and TenantApps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context;
use idem_operator::resources::{Tenant, TenantApp};
use idem_runtime::apply::CreatedChild;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::apply::Manifest;

/// The condition types the table shows, in order (kstatus: Ready / Reconciling / Stalled).
const CONDITION_TYPES: [&str; 3] = ["Ready", "Reconciling", "Stalled"];

/// One example object whose readiness `dev` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `Tenant` or `TenantApp`.
    pub kind: String,
    /// The namespace (TenantApps only).
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl Target {
    /// The Tenants and TenantApps among `manifests`.
    pub fn from_manifests(manifests: &[Manifest]) -> Vec<Target> {
        manifests
            .iter()
            .filter(|m| matches!(m.kind(), "Tenant" | "TenantApp"))
            .map(|m| Target {
                kind: m.kind().to_string(),
                namespace: m.object.namespace(),
                name: m.object.name_any(),
            })
            .collect()
    }

    /// `Tenant acme` or `TenantApp initech-apps/web`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// A target's observed state.
#[derive(Debug, Clone)]
pub struct Observed {
    /// What was observed.
    pub target: Target,
    /// Ready=True for the current generation (status.observedGeneration == generation).
    pub ready: bool,
    /// Why not, or the conditions, for messages.
    pub detail: String,
}

/// Reads every target and says whether it is Ready.
///
/// # Errors
/// When the API server cannot be read (a missing object is not an error: it is not Ready).
pub async fn observe(client: &Client, targets: &[Target]) -> anyhow::Result<Vec<Observed>> {
    let mut out = Vec::with_capacity(targets.len());
    for t in targets {
        let state = match t.kind.as_str() {
            "Tenant" => {
                let api: Api<Tenant> = Api::all(client.clone());
                api.get_opt(&t.name).await?.map(|o| {
                    let s = o.status.clone().unwrap_or_default();
                    (o.metadata.generation, s.observed_generation, s.conditions)
                })
            }
            _ => {
                let ns = t.namespace.as_deref().unwrap_or("default");
                let api: Api<TenantApp> = Api::namespaced(client.clone(), ns);
                api.get_opt(&t.name).await?.map(|o| {
                    let s = o.status.clone().unwrap_or_default();
                    (o.metadata.generation, s.observed_generation, s.conditions)
                })
            }
        }
        .with_context(|| format!("{} is missing", t.describe()));
        out.push(match state {
            Err(e) => Observed {
                target: t.clone(),
                ready: false,
                detail: e.to_string(),
            },
            Ok((generation, observed, conditions)) => {
                let ready_true = find(&conditions, "Ready").is_some_and(|c| c.status == "True");
                let current = observed.is_some() && observed == generation;
                let detail = if conditions.is_empty() {
                    "no conditions yet".into()
                } else if !current {
                    format!(
                        "status describes generation {observed:?}, not {generation:?}; {}",
                        describe_conditions(&conditions)
                    )
                } else {
                    describe_conditions(&conditions)
                };
                Observed {
                    target: t.clone(),
                    ready: ready_true && current,
                    detail,
                }
            }
        });
    }
    Ok(out)
}

/// `Ready=False (Reason); Stalled=True (Reason): message`: every condition in
/// [`CONDITION_TYPES`] order, then their distinct messages.
pub fn describe_conditions(conditions: &[Condition]) -> String {
    let present: Vec<&Condition> = CONDITION_TYPES
        .iter()
        .filter_map(|ty| find(conditions, ty))
        .collect();
    let mut out = present
        .iter()
        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
        .collect::<Vec<_>>()
        .join("; ");
    let mut messages: Vec<&str> = Vec::new();
    for c in &present {
        if !c.message.is_empty() && !messages.contains(&c.message.as_str()) {
            messages.push(&c.message);
        }
    }
    if !messages.is_empty() {
        out.push_str(": ");
        out.push_str(&messages.join("; "));
    }
    out
}

fn find<'a>(conditions: &'a [Condition], ty: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == ty)
}

/// `Ready=True(Reconciled)` for one condition type, `-` when absent.
fn cell(conditions: &[Condition], ty: &str) -> String {
    find(conditions, ty).map_or_else(
        || "-".into(),
        |c| format!("{}={}({})", c.type_, c.status, c.reason),
    )
}

/// The children an owner recorded (`status.createdChildren`: what it created and prunes),
/// counted per kind: `LimitRange:2,Namespace:2`; `-` for none.
fn children_cell(recorded: &[CreatedChild]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in recorded {
        *counts.entry(c.kind.as_str()).or_default() += 1;
    }
    if counts.is_empty() {
        return "-".into();
    }
    counts
        .iter()
        .map(|(kind, n)| format!("{kind}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The table of every Tenant and TenantApp in the cluster.
///
/// # Errors
/// When the API server cannot be read.
pub async fn table(client: &Client) -> anyhow::Result<String> {
    let tenants = Api::<Tenant>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Tenants")?;
    let mut rows = vec![
        [
            "TENANT",
            "NAMESPACES",
            "CHILDREN",
            "READY",
            "RECONCILING",
            "STALLED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for t in &tenants.items {
        let s = t.status.clone().unwrap_or_default();
        let namespaces = if s.namespaces.is_empty() {
            "-".into()
        } else {
            s.namespaces.join(",")
        };
        let mut row = vec![t.name_any(), namespaces, children_cell(&s.created_children)];
        row.extend(CONDITION_TYPES.iter().map(|ty| cell(&s.conditions, ty)));
        rows.push(row);
    }
    let mut out = render(&rows);
    let apps = Api::<TenantApp>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing TenantApps")?;
    if !apps.items.is_empty() {
        let mut rows = vec![
            [
                "TENANTAPP",
                "NAMESPACE",
                "AVAILABLE",
                "CHILDREN",
                "READY",
                "RECONCILING",
                "STALLED",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for a in &apps.items {
            let s = a.status.clone().unwrap_or_default();
            let mut row = vec![
                a.name_any(),
                a.namespace().unwrap_or_default(),
                match a.spec.replicas {
                    Some(desired) => format!("{}/{desired}", s.available_replicas),
                    // Left to an autoscaler: only the available count is the app's to show.
                    None => format!("{}/-", s.available_replicas),
                },
                children_cell(&s.created_children),
            ];
            row.extend(CONDITION_TYPES.iter().map(|ty| cell(&s.conditions, ty)));
            rows.push(row);
        }
        out.push('\n');
        out.push_str(&render(&rows));
    }
    Ok(out)
}

/// Left-aligned columns separated by two spaces.
fn render(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            let _ = write!(line, "{c:<w$}  ", w = widths[i]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(ty: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: ty.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Default::default(),
            ),
            observed_generation: None,
        }
    }

    #[test]
    fn conditions_are_described_in_kstatus_order() {
        let c = [
            cond("Stalled", "True", "NamespaceConflict", "b-c is not ours"),
            cond(
                "Reconciling",
                "False",
                "NamespaceConflict",
                "b-c is not ours",
            ),
            cond("Ready", "False", "Stalled", ""),
        ];
        assert_eq!(
            describe_conditions(&c),
            "Ready=False (Stalled); Reconciling=False (NamespaceConflict); \
             Stalled=True (NamespaceConflict): b-c is not ours"
        );
        assert_eq!(cell(&c, "Ready"), "Ready=False(Stalled)");
        assert_eq!(cell(&c[..1], "Reconciling"), "-");
    }

    #[test]
    fn children_cells_count_per_kind() {
        let child = |kind: &str, name: &str| CreatedChild {
            kind: kind.into(),
            namespace: None,
            name: name.into(),
            uid: format!("u-{name}"),
        };
        let recorded = [
            child("Namespace", "a"),
            child("LimitRange", "l1"),
            child("Namespace", "b"),
            child("TenantPolicy", "p"),
            child("LimitRange", "l2"),
        ];
        assert_eq!(
            children_cell(&recorded),
            "LimitRange:2,Namespace:2,TenantPolicy:1"
        );
        assert_eq!(children_cell(&[]), "-");
    }

    #[test]
    fn render_aligns_columns() {
        let rows = vec![
            vec!["A".to_string(), "BB".into(), "C".into()],
            vec!["long".to_string(), "x".into(), "y".into()],
        ];
        assert_eq!(render(&rows), "A     BB  C\nlong  x   y\n");
    }

    #[test]
    fn targets_are_the_tenants_and_apps() {
        let root = crate::generated::repo_root();
        let m = super::super::apply::read_dir(&root.join("examples")).unwrap();
        let t = Target::from_manifests(&m);
        assert!(t.iter().any(|t| t.describe() == "Tenant acme"));
        assert!(
            t.iter()
                .any(|t| t.describe() == "TenantApp initech-apps/web")
        );
    }
}
