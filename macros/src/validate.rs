//! Validate: the meaning of the parsed attributes, every problem reported with its span.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, Ident};

use crate::parse::{Field, Input};

/// Default condition types: the kstatus trio.
const KSTATUS: [&str; 3] = ["Ready", "Reconciling", "Stalled"];

/// How the tenant is found.
pub enum Tenant {
    /// `tenant = name`.
    Name,
    /// `tenant = namespace`.
    Namespace,
    /// `tenant = namespace_label("key")`; `None`: the default, `<label_prefix>/tenant`.
    NamespaceLabel(Option<String>),
    /// `tenant = field(a.b)`: the field path.
    Field(Vec<Ident>),
}

/// What expand needs; complete only when validation found no error.
pub struct Model {
    /// Path to idem-runtime.
    pub krate: syn::Path,
    /// The spec struct.
    pub spec: Ident,
    /// The root struct kube generates.
    pub root: Option<Ident>,
    /// The status type.
    pub status: Option<syn::Path>,
    /// `#[kube(namespaced)]`.
    pub namespaced: bool,
    /// The field manager; `None`: the deriving crate's package name (`CARGO_PKG_NAME`).
    pub field_manager: Option<String>,
    /// The label prefix (`label_prefix = "..."`, else the `#[kube(group = ...)]` group).
    pub label_prefix: String,
    /// Declared condition types.
    pub conditions: Vec<String>,
    /// Tenant rule.
    pub tenant: Tenant,
    /// Whether the prune goes by the status' record of created children
    /// (`status.created_children`, the default) rather than by ownerReferences
    /// (`prune = owner_references`).
    pub record: bool,
    /// The fields compared (skip removed).
    pub fields: Vec<Field>,
}

fn err(msg: impl std::fmt::Display, span: Span) -> darling::Error {
    darling::Error::custom(msg).with_span(&span)
}

/// Why `s` is not a DNS subdomain (RFC 1123: lowercase alphanumerics, `-` and `.`, at most 253
/// characters, each dot-separated label 1-63 characters starting and ending alphanumeric).
fn not_dns_subdomain(s: &str) -> Option<&'static str> {
    if s.is_empty() || s.len() > 253 {
        return Some("is 1-253 characters");
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Some("has only lowercase letters, digits, `-` and `.`");
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    for label in s.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Some("has dot-separated parts of 1-63 characters");
        }
        if !label.starts_with(alnum) || !label.ends_with(alnum) {
            return Some("has parts that start and end with a letter or digit");
        }
    }
    None
}

/// Condition types declared as identifiers follow the API conventions: CamelCase.
fn check_condition(c: &crate::attr::ConditionName) -> Option<String> {
    if c.ident {
        let first_upper = c.name.starts_with(|ch: char| ch.is_ascii_uppercase());
        if !first_upper || c.name.contains('_') {
            return Some(format!(
                "condition type `{}` is not CamelCase; Kubernetes API conventions name condition types like `Ready` or `QuotaApplied`",
                c.name
            ));
        }
        return None;
    }
    let (prefix, name) = match c.name.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, c.name.as_str()),
    };
    let alnum = |ch: char| ch.is_ascii_alphanumeric();
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|ch| alnum(ch) || matches!(ch, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                    && l.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                    && l.chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
            })
    });
    (!(name_ok && prefix_ok)).then(|| {
        format!(
            "\"{}\" is not a valid condition type: expected an optional DNS subdomain prefix and `/`, then 1-63 characters of [A-Za-z0-9_.-] starting and ending with a letter or digit",
            c.name
        )
    })
}

fn parse_tenant(
    expr: &Expr,
    fields: Option<&[Field]>,
    errors: &mut darling::error::Accumulator,
) -> Option<Tenant> {
    let bad = || {
        err(
            "expected `tenant = name`, `tenant = namespace`, `tenant = namespace_label(\"label-key\")` or `tenant = field(path.to.field)`",
            expr.span(),
        )
    };
    match expr {
        Expr::Path(p) if p.path.is_ident("name") => Some(Tenant::Name),
        Expr::Path(p) if p.path.is_ident("namespace") => Some(Tenant::Namespace),
        Expr::Call(call) => {
            let Expr::Path(func) = &*call.func else {
                errors.push(bad());
                return None;
            };
            if func.path.is_ident("namespace_label") {
                let arg = match call.args.iter().collect::<Vec<_>>().as_slice() {
                    [
                        Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(s),
                            ..
                        }),
                    ] => s.clone(),
                    _ => {
                        errors.push(err("`namespace_label` takes one string: the label key, e.g. namespace_label(\"tenancy.idem.dev/tenant\")", call.span()));
                        return None;
                    }
                };
                let key = arg.value();
                let (prefix, name) = key
                    .split_once('/')
                    .map_or((None, key.as_str()), |(p, n)| (Some(p), n));
                let ok = !name.is_empty()
                    && name.len() <= 63
                    && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && name.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    && prefix.is_none_or(|p| {
                        !p.is_empty()
                            && p.len() <= 253
                            && p.chars().all(|c| {
                                c.is_ascii_lowercase()
                                    || c.is_ascii_digit()
                                    || matches!(c, '-' | '.')
                            })
                    });
                if !ok {
                    errors.push(err(format!("\"{key}\" is not a valid label key (optional DNS prefix and `/`, then 1-63 characters of [A-Za-z0-9_.-])"), arg.span()));
                    return None;
                }
                Some(Tenant::NamespaceLabel(Some(key)))
            } else if func.path.is_ident("field") {
                let path = match call.args.iter().collect::<Vec<_>>().as_slice() {
                    [arg] => field_path(arg),
                    _ => None,
                };
                let Some(path) = path else {
                    errors.push(err("`field` takes one field path of the spec, e.g. field(owner) or field(owner.team)", call.span()));
                    return None;
                };
                if let Some(fields) = fields
                    && !fields.iter().any(|f| f.ident == path[0])
                {
                    let given = path[0].to_string();
                    let plain = |n: &str| n.replace('_', "").to_lowercase();
                    let hint = match fields
                        .iter()
                        .find(|f| plain(&f.ident.to_string()) == plain(&given))
                    {
                        // `slackChannel` for `slack_channel`: the JSON name, not the Rust one.
                        Some(f) => format!("; name the Rust field: field({})", f.ident),
                        None => format!(
                            "; its fields: {}",
                            fields
                                .iter()
                                .map(|f| f.ident.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    };
                    errors.push(err(
                        format!("the spec has no field `{given}` to take the tenant from{hint}"),
                        path[0].span(),
                    ));
                    return None;
                }
                Some(Tenant::Field(path))
            } else {
                errors.push(bad());
                None
            }
        }
        _ => {
            errors.push(bad());
            None
        }
    }
}

/// `a` or `a.b.c` as identifiers.
fn field_path(expr: &Expr) -> Option<Vec<Ident>> {
    match expr {
        Expr::Path(p) => p.path.get_ident().map(|i| vec![i.clone()]),
        Expr::Field(f) => {
            let mut base = field_path(&f.base)?;
            match &f.member {
                syn::Member::Named(i) => base.push(i.clone()),
                syn::Member::Unnamed(_) => return None,
            }
            Some(base)
        }
        _ => None,
    }
}

/// Validates the parsed input; problems go to `errors`, and the model holds what could be
/// understood (expand writes a stub when `errors` is not empty).
pub fn validate(input: Input<'_>, errors: &mut darling::error::Accumulator) -> Model {
    let Input {
        ident,
        fields,
        opts,
        key_spans,
        kube,
    } = input;
    let key_span = |k: &str| {
        key_spans
            .iter()
            .find(|(n, _)| n == k)
            .map_or_else(Span::call_site, |(_, s)| *s)
    };
    let (namespaced, root, status) = match &kube {
        None => {
            errors.push(err(
                "IdempotentResource reads kube's #[kube(...)] attribute: add #[derive(CustomResource)] and #[kube(group = \"...\", version = \"...\", kind = \"...\", status = \"...\")]",
                ident.span(),
            ));
            (false, None, None)
        }
        Some((k, span)) => {
            let root = k.root.as_ref().or(k.kind.as_ref()).and_then(|r| {
                syn::parse_str::<Ident>(r).ok().map(|mut i| {
                    i.set_span(r.span());
                    i
                })
            });
            if k.status.is_none() {
                errors.push(err(
                    "IdempotentResource keeps status conditions and observedGeneration: add `status = \"<Kind>Status\"` to #[kube(...)]",
                    *span,
                ));
            }
            (k.namespaced, root, k.status.clone())
        }
    };
    if opts.skip.is_present() {
        errors.push(err(
            "`skip` applies to a field: put #[idempotent(skip)] on the field to leave out of the desired-state comparison",
            opts.skip.span(),
        ));
    }
    let field_manager = match &opts.field_manager {
        Some(fm) => {
            let v = fm.as_str();
            // Also the value of the `app.kubernetes.io/managed-by` label on every child and of
            // the child watches' label selector: a label value, not just a fieldManager.
            let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
            let label_value = !v.is_empty()
                && v.len() <= 63
                && alnum(v.chars().next())
                && alnum(v.chars().last())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !label_value {
                errors.push(err(
                    "field_manager must be a label value (1-63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit): it is also the app.kubernetes.io/managed-by label of every child and the child watches' selector",
                    fm.span(),
                ));
            }
            Some(v.to_owned())
        }
        None => None,
    };
    let group = kube.as_ref().and_then(|(k, _)| k.group.as_ref());
    let label_prefix = match (&opts.label_prefix, group) {
        (Some(p), _) => {
            if let Some(why) = not_dns_subdomain(p.as_str()) {
                errors.push(err(
                    format!("label_prefix must be a DNS subdomain (a label key prefix such as \"teams.example.com\"): one that {why}"),
                    p.span(),
                ));
            }
            p.as_str().to_owned()
        }
        (None, Some(g)) => {
            if let Some(why) = not_dns_subdomain(g.as_str()) {
                errors.push(err(
                    format!("the labels idem stamps on children live under the CRD group by default, and this group is not a DNS subdomain (one that {why}): fix the group or set #[idempotent(label_prefix = \"...\")]"),
                    g.span(),
                ));
            }
            g.as_str().to_owned()
        }
        (None, None) => String::new(),
    };
    let conditions = match &opts.conditions {
        Some(list) => {
            if list.0.is_empty() {
                errors.push(err("conditions(...) lists no condition; leave it out to use Ready, Reconciling, Stalled", key_span("conditions")));
            }
            let mut seen: Vec<&crate::attr::ConditionName> = Vec::new();
            for c in &list.0 {
                if let Some(msg) = check_condition(c) {
                    errors.push(err(msg, c.span));
                }
                if seen.iter().any(|s| s.name == c.name) {
                    errors.push(err(
                        format!("condition `{}` is listed twice", c.name),
                        c.span,
                    ));
                } else {
                    seen.push(c);
                }
            }
            list.0.iter().map(|c| c.name.clone()).collect()
        }
        None => KSTATUS.iter().map(|s| (*s).to_owned()).collect(),
    };
    let tenant = match opts.tenant.as_ref().map(|u| &u.0) {
        Some(expr) => {
            let t = parse_tenant(expr, fields.as_deref(), errors);
            if kube.is_some() {
                match (&t, namespaced) {
                    (Some(Tenant::Name), true) => errors.push(err(
                        "`tenant = name` is for cluster-scoped roots like Tenant; this resource is #[kube(namespaced)]: use namespace_label(\"...\"), namespace or field(...)",
                        expr.span(),
                    )),
                    (Some(Tenant::Namespace | Tenant::NamespaceLabel(_)), false) => errors.push(err(
                        "this resource is cluster-scoped (no `namespaced` in #[kube(...)]), so it has no namespace to take the tenant from: use `tenant = name` or field(...)",
                        expr.span(),
                    )),
                    _ => {}
                }
            }
            t.unwrap_or(Tenant::Name)
        }
        None if namespaced => Tenant::NamespaceLabel(None),
        None => Tenant::Name,
    };
    let record = match opts.prune.as_ref().map(|u| &u.0) {
        None => true,
        Some(syn::Expr::Path(p)) if p.path.is_ident("owner_references") => false,
        Some(syn::Expr::Path(p)) if p.path.is_ident("record") => true,
        Some(other) => {
            errors.push(err(
                "`prune` takes `record` (the default: the status field `created_children: Vec<CreatedChild>` records the uids of the children created, and only those are pruned) or `owner_references` (no record: the prune trusts the controller ownerReference, which anyone who may create the child kind where the children live can forge)",
                other.span(),
            ));
            true
        }
    };
    let krate = opts
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::idem_runtime));
    let _ = krate.to_token_stream();
    Model {
        krate,
        spec: ident.clone(),
        root,
        status,
        namespaced,
        field_manager,
        label_prefix,
        conditions,
        tenant,
        record,
        fields: fields
            .unwrap_or_default()
            .into_iter()
            .filter(|f| !f.skip)
            .collect(),
    }
}
