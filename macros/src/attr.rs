//! The attribute grammar: darling types for `#[idempotent(...)]` and kube's `#[kube(...)]`.

use darling::ast::NestedMeta;
use darling::util::{Flag, SpannedValue};
use darling::{FromField, FromMeta};
use proc_macro2::Span;
use syn::spanned::Spanned;

/// `#[idempotent(...)]` on the spec struct.
#[derive(Debug, Default, FromMeta)]
pub struct ContainerOpts {
    /// `tenant = name | namespace | namespace_label("key") | field(path)`.
    pub tenant: Option<Unquoted>,
    /// `field_manager = "idem-operator"`.
    pub field_manager: Option<SpannedValue<String>>,
    /// `label_prefix = "teams.example.com"`: the prefix of the labels and the annotation idem
    /// stamps on children (default: the `#[kube(group = ...)]` group).
    pub label_prefix: Option<SpannedValue<String>>,
    /// `conditions(Ready, Reconciling, Stalled, "example.com/Custom")`.
    pub conditions: Option<SpannedValue<Conditions>>,
    /// `prune = owner_references`: no record of created children in the status.
    pub prune: Option<Unquoted>,
    /// `crate = "::idem_runtime"`: where the runtime is, for re-exports.
    #[darling(rename = "crate")]
    pub krate: Option<syn::Path>,
    /// `skip` belongs on fields; accepted here only to say so clearly.
    pub skip: Flag,
}

/// A `key = form` value written as an expression. darling would also read `key = "form"` (a
/// string holding the expression); refused, so each form has one spelling.
#[derive(Debug)]
pub struct Unquoted(pub syn::Expr);

impl FromMeta for Unquoted {
    fn from_meta(item: &syn::Meta) -> darling::Result<Self> {
        let key = item
            .path()
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let forms = match key.as_str() {
            "tenant" => {
                "`tenant = name`, `tenant = namespace`, `tenant = namespace_label(\"key\")` or `tenant = field(path)`"
            }
            "prune" => "`prune = record` or `prune = owner_references`",
            _ => "`key = form`",
        };
        let syn::Meta::NameValue(nv) = item else {
            return Err(darling::Error::custom(format!(
                "`{key}` takes a form after `=`: write {forms}"
            ))
            .with_span(item));
        };
        // A `macro_rules!` substitution wraps the expression in an invisible group.
        let mut value = &nv.value;
        while let syn::Expr::Group(group) = value {
            value = &group.expr;
        }
        match value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => {
                let value = s.value();
                Err(darling::Error::custom(format!(
                    "write `{key} = {value}` without quotes: `{key}` takes a form, not a string"
                ))
                .with_span(s))
            }
            value => Ok(Self(value.clone())),
        }
    }
}

/// `#[idempotent(...)]` on a field.
#[derive(Debug, FromField)]
#[darling(attributes(idempotent))]
pub struct FieldOpts {
    /// The field's name (`None` in tuple structs).
    pub ident: Option<syn::Ident>,
    /// The field's type.
    pub ty: syn::Type,
    /// `#[idempotent(skip)]`: leave this field out of comparison and fingerprint.
    pub skip: Flag,
}

/// One entry of `conditions(...)`, with its span.
#[derive(Debug, Clone)]
pub struct ConditionName {
    /// The condition type.
    pub name: String,
    /// Where it was written.
    pub span: Span,
    /// Whether written as an identifier (then CamelCase is required) or a string.
    pub ident: bool,
}

/// The list in `conditions(...)`.
#[derive(Debug, Default)]
pub struct Conditions(pub Vec<ConditionName>);

impl FromMeta for Conditions {
    fn from_list(items: &[NestedMeta]) -> darling::Result<Self> {
        let mut errors = darling::Error::accumulator();
        let mut out = Vec::new();
        for item in items {
            match item {
                NestedMeta::Meta(syn::Meta::Path(p)) if p.get_ident().is_some() => {
                    let ident = p.get_ident().expect("checked");
                    out.push(ConditionName {
                        name: ident.to_string(),
                        span: ident.span(),
                        ident: true,
                    });
                }
                NestedMeta::Lit(syn::Lit::Str(s)) => out.push(ConditionName {
                    name: s.value(),
                    span: s.span(),
                    ident: false,
                }),
                other => errors.push(
                    darling::Error::custom(
                        "expected a condition type: an identifier like `Ready` or a string like \"example.com/Ready\"",
                    )
                    .with_span(&other.span()),
                ),
            }
        }
        errors.finish_with(Conditions(out))
    }
}

/// The parts of kube's `#[kube(...)]` idem reads; every other key is kube's business.
#[derive(Debug, FromMeta)]
#[darling(allow_unknown_fields)]
pub struct KubeOpts {
    /// `group = "tenancy.idem.dev"`.
    pub group: Option<SpannedValue<String>>,
    /// `kind = "TenantApp"`.
    pub kind: Option<SpannedValue<String>>,
    /// `root = "TenantAppCrd"`: the generated struct's name when it differs from the kind.
    pub root: Option<SpannedValue<String>>,
    /// `namespaced`.
    #[darling(default)]
    pub namespaced: bool,
    /// `status = "TenantAppStatus"`.
    pub status: Option<syn::Path>,
}
