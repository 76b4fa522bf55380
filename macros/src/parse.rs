//! Parse: from the derive input to [`Input`], keeping spans; errors go to the accumulator.

use darling::ast::NestedMeta;
use darling::{FromField, FromMeta};
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr};

use crate::attr::{ContainerOpts, FieldOpts, KubeOpts};

/// A named field of the spec.
pub struct Field {
    /// The Rust name.
    pub ident: Ident,
    /// The name on the wire (serde `rename` / `rename_all` applied).
    pub wire: String,
    /// `#[idempotent(skip)]`.
    pub skip: bool,
}

/// The parsed derive input.
pub struct Input<'a> {
    /// The spec struct's name.
    pub ident: &'a Ident,
    /// The named fields; `None` when the input is not a struct with named fields (already an
    /// error).
    pub fields: Option<Vec<Field>>,
    /// `#[idempotent(...)]`, all occurrences merged.
    pub opts: ContainerOpts,
    /// The span of each `#[idempotent(...)]` key that was given, for errors about it.
    pub key_spans: Vec<(String, Span)>,
    /// `#[kube(...)]` and the span of its first occurrence; `None` when absent.
    pub kube: Option<(KubeOpts, Span)>,
}

fn nested_of(
    attrs: &[Attribute],
    name: &str,
    errors: &mut darling::error::Accumulator,
) -> Option<(Vec<NestedMeta>, Span)> {
    let mut all = Vec::new();
    let mut first = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident(name)) {
        first.get_or_insert(attr.path().span());
        match &attr.meta {
            syn::Meta::List(list) => {
                if let Some(items) = errors.handle(
                    NestedMeta::parse_meta_list(list.tokens.clone()).map_err(darling::Error::from),
                ) {
                    all.extend(items);
                }
            }
            other => errors.push(
                darling::Error::custom(format!("expected `#[{name}(...)]`")).with_span(other),
            ),
        }
    }
    first.map(|span| (all, span))
}

/// Keys of the container attribute.
const KEYS: &[&str] = &[
    "tenant",
    "field_manager",
    "label_prefix",
    "conditions",
    "prune",
    "crate",
    "skip",
];

/// Reports unknown (with a "did you mean") and repeated keys and drops them, so that darling
/// parses the rest and validation still runs: every error is reported in one go.
fn known_items(
    items: Vec<NestedMeta>,
    key_spans: &mut Vec<(String, Span)>,
    errors: &mut darling::error::Accumulator,
) -> Vec<NestedMeta> {
    let mut kept = Vec::new();
    for item in items {
        let NestedMeta::Meta(meta) = &item else {
            kept.push(item);
            continue;
        };
        let path = meta.path();
        let name = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote::quote!(#path).to_string().replace(' ', ""));
        if !KEYS.contains(&name.as_str()) {
            errors.push(darling::Error::unknown_field_with_alts(&name, KEYS).with_span(path));
        } else if key_spans.iter().any(|(k, _)| *k == name) {
            errors.push(darling::Error::duplicate_field(&name).with_span(path));
        } else {
            key_spans.push((name, path.span()));
            kept.push(item);
        }
    }
    kept
}

/// serde's container `rename_all`, when given as `rename_all = "..."`.
fn serde_rename_all(attrs: &[Attribute]) -> Option<String> {
    serde_value(attrs, "rename_all")
}

/// The string value of `key = "..."` in `#[serde(...)]`, ignoring everything else (serde
/// reports its own errors).
fn serde_value(attrs: &[Attribute], key: &str) -> Option<String> {
    let mut found = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|m| {
            if m.path.is_ident(key) && m.input.peek(syn::Token![=]) {
                let lit: LitStr = m.value()?.parse()?;
                found = Some(lit.value());
            } else if m.input.peek(syn::Token![=]) {
                let _: syn::Expr = m.value()?.parse()?;
            } else if m.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in m.input);
                let _: proc_macro2::TokenStream = content.parse()?;
            }
            Ok(())
        });
    }
    found
}

/// Parses the input; never fails, every problem is pushed to `errors`.
pub fn parse<'a>(input: &'a DeriveInput, errors: &mut darling::error::Accumulator) -> Input<'a> {
    let mut key_spans = Vec::new();
    let opts = nested_of(&input.attrs, "idempotent", errors)
        .and_then(|(items, _)| {
            let known = known_items(items, &mut key_spans, errors);
            errors.handle(ContainerOpts::from_list(&known))
        })
        .unwrap_or_default();
    let kube = nested_of(&input.attrs, "kube", errors).and_then(|(items, span)| {
        errors
            .handle(KubeOpts::from_list(&items))
            .map(|k| (k, span))
    });
    if !input.generics.params.is_empty() {
        errors.push(
            darling::Error::custom(
                "IdempotentResource does not support generic specs: a CustomResource kind has one concrete spec",
            )
            .with_span(&input.generics),
        );
    }
    let rename_all = serde_rename_all(&input.attrs);
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(named) => Some(
                named
                    .named
                    .iter()
                    .filter_map(|f| {
                        let opts = errors.handle(FieldOpts::from_field(f))?;
                        let ident = opts.ident?;
                        let _ = &opts.ty;
                        let rust = ident.to_string();
                        let rust = rust.strip_prefix("r#").unwrap_or(&rust).to_owned();
                        let wire = serde_value(&f.attrs, "rename")
                            .or_else(|| {
                                rename_all
                                    .as_deref()
                                    .and_then(|r| crate::case::rename(r, &rust))
                            })
                            .unwrap_or(rust);
                        Some(Field {
                            ident,
                            wire,
                            skip: opts.skip.is_present(),
                        })
                    })
                    .collect(),
            ),
            Fields::Unnamed(_) => {
                errors.push(
                    darling::Error::custom(
                        "IdempotentResource needs a struct with named fields (a CustomResource spec); tuple structs are not supported",
                    )
                    .with_span(&input.ident),
                );
                None
            }
            Fields::Unit => {
                errors.push(
                    darling::Error::custom(
                        "IdempotentResource needs a struct with named fields (a CustomResource spec); unit structs have no spec to compare",
                    )
                    .with_span(&input.ident),
                );
                None
            }
        },
        Data::Enum(e) => {
            errors.push(
                darling::Error::custom(
                    "IdempotentResource derives on the spec struct of a CustomResource; enums are not supported",
                )
                .with_span(&e.enum_token),
            );
            None
        }
        Data::Union(u) => {
            errors.push(
                darling::Error::custom(
                    "IdempotentResource derives on the spec struct of a CustomResource; unions are not supported",
                )
                .with_span(&u.union_token),
            );
            None
        }
    };
    Input {
        ident: &input.ident,
        fields,
        opts,
        key_spans,
        kube,
    }
}
