//! Expand: the impls of idem-runtime's traits, or stubs next to the errors.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::DeriveInput;
use syn::spanned::Spanned;

use crate::validate::{Model, Tenant};

/// The whole derive: parse, validate, expand.
pub fn derive(input: &DeriveInput) -> TokenStream {
    let mut errors = darling::Error::accumulator();
    let parsed = crate::parse::parse(input, &mut errors);
    let model = crate::validate::validate(parsed, &mut errors);
    match errors.finish() {
        Ok(()) => expand(&model),
        Err(e) => {
            // A generic spec cannot be named without its parameters: no stub then.
            let stub = if input.generics.params.is_empty() {
                stub(&model)
            } else {
                TokenStream::new()
            };
            let errs = e.write_errors();
            quote! { #errs #stub }
        }
    }
}

/// The four status accessors of `IdempotentResource`, spanned at the `status = "..."` value so
/// a missing or mistyped field is reported there. Patterns, not `status.field`, so a missing
/// field reads "struct has no field named `conditions`".
fn status_fns(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let Some(status) = &m.status else {
        return TokenStream::new();
    };
    let span = status.span();
    let condition =
        quote!(#krate::__private::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition);
    quote_spanned! {span=>
        fn conditions_of(status: &#status) -> &[#condition] {
            let #status { conditions, .. } = status;
            #krate::resource::ConditionsField::get(conditions)
        }
        fn conditions_of_mut(status: &mut #status) -> &mut ::std::vec::Vec<#condition> {
            let #status { conditions, .. } = status;
            #krate::resource::ConditionsField::get_mut(conditions)
        }
        fn observed_generation_of(status: &#status) -> ::core::option::Option<i64> {
            let #status { observed_generation, .. } = status;
            #krate::resource::ObservedGenerationField::get(observed_generation)
        }
        fn set_observed_generation_of(status: &mut #status, generation: i64) {
            let #status { observed_generation, .. } = status;
            #krate::resource::ObservedGenerationField::set(observed_generation, generation)
        }
    }
}

/// The record accessors of `IdempotentResource`: `status.created_children` unless the kind opts
/// out (`prune = owner_references`), spanned at `status = "..."` so a status without the
/// record is reported there, like a missing `conditions`.
fn record_fns(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let Some(status) = &m.status else {
        return TokenStream::new();
    };
    let span = status.span();
    let created = quote!(#krate::apply::CreatedChild);
    if m.record {
        quote_spanned! {span=>
            const PRUNE_BY_RECORD: bool = true;
            fn child_record_of(
                status: &mut #status,
            ) -> ::core::option::Option<&mut ::std::vec::Vec<#created>> {
                let #status { created_children, .. } = status;
                ::core::option::Option::Some(#krate::resource::CreatedChildrenField::get_mut(created_children))
            }
        }
    } else {
        quote_spanned! {span=>
            const PRUNE_BY_RECORD: bool = false;
            fn child_record_of(
                _: &mut #status,
            ) -> ::core::option::Option<&mut ::std::vec::Vec<#created>> {
                ::core::option::Option::None
            }
        }
    }
}

fn expand(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let spec = &m.spec;
    let (Some(root), Some(status)) = (&m.root, &m.status) else {
        return TokenStream::new();
    };
    let idents: Vec<_> = m.fields.iter().map(|f| &f.ident).collect();
    let wires: Vec<_> = m.fields.iter().map(|f| &f.wire).collect();
    // Without `field_manager = "..."`, the deriving crate's package name: a user's resource
    // never applies under idem's own operator's name.
    let fm = match &m.field_manager {
        Some(fm) => quote!(#fm),
        None => quote!(::core::env!("CARGO_PKG_NAME")),
    };
    let label_prefix = &m.label_prefix;
    let conds = &m.conditions;
    let namespaced = m.namespaced;
    let (rule, tenant_body) = match &m.tenant {
        Tenant::Name => (
            quote!(#krate::resource::TenantRule::Name),
            quote!(#krate::resource::__tenant::by_name(self)),
        ),
        Tenant::Namespace => (
            quote!(#krate::resource::TenantRule::Namespace),
            quote!(#krate::resource::__tenant::by_namespace(self)),
        ),
        Tenant::NamespaceLabel(l) => {
            let l = match l {
                Some(l) => quote!(#l),
                // The kind's own tenant label (`<label_prefix>/tenant`), which its children
                // carry too.
                None => {
                    let l = format!("{}/tenant", m.label_prefix);
                    quote!(#l)
                }
            };
            (
                quote!(#krate::resource::TenantRule::NamespaceLabel(#l)),
                quote!(#krate::resource::__tenant::by_namespace_label(self, #l)),
            )
        }
        Tenant::Field(path) => {
            let text = path
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(".");
            let span = path[0].span();
            (
                quote!(#krate::resource::TenantRule::Field(#text)),
                quote_spanned!(span=> #krate::resource::__tenant::by_field(&self.spec.#(#path).*, #text)),
            )
        }
    };
    let status_fns = status_fns(m);
    let record_fns = record_fns(m);
    quote! {
        const _: () = {
            impl #krate::resource::SpecDiff for #spec {
                fn diff(&self, other: &Self) -> ::std::vec::Vec<::std::string::String> {
                    let mut differ = ::std::vec::Vec::new();
                    #(
                        #krate::compare::__field_diff(#wires, &self.#idents, &other.#idents, &mut differ);
                    )*
                    differ
                }
                fn fingerprint(&self) -> #krate::compare::Fingerprint {
                    let mut map = #krate::__private::serde_json::Map::new();
                    #(
                        map.insert(::std::string::String::from(#wires), #krate::compare::__to_value(&self.#idents));
                    )*
                    #krate::compare::fingerprint(&#krate::__private::serde_json::Value::Object(map))
                }
            }

            impl #krate::resource::IdempotentResource for #root {
                type Spec = #spec;
                type Status = #status;
                const FIELD_MANAGER: &'static str = #fm;
                const LABEL_PREFIX: &'static str = #label_prefix;
                const CONDITION_TYPES: &'static [&'static str] = &[#(#conds),*];
                const TENANT_RULE: #krate::resource::TenantRule = #rule;
                const NAMESPACED: bool = #namespaced;
                fn spec(&self) -> &#spec {
                    &self.spec
                }
                fn status(&self) -> ::core::option::Option<&#status> {
                    self.status.as_ref()
                }
                fn status_mut(&mut self) -> &mut ::core::option::Option<#status> {
                    &mut self.status
                }
                #status_fns
                #record_fns
                fn tenant(&self) -> ::core::result::Result<#krate::resource::TenantRef, #krate::resource::TenantError> {
                    #tenant_body
                }
            }

            impl #root {
                /// The field manager of server-side apply and status writes (the same as
                /// `IdempotentResource::FIELD_MANAGER`, reachable without importing the trait).
                pub const FIELD_MANAGER: &'static str = #fm;
            }
        };
    }
}

/// Impls that let the rest of the user's code compile while the real errors are shown; never
/// run, because the crate does not compile.
fn stub(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let spec = &m.spec;
    let unreachable = quote!(::core::unreachable!(
        "#[derive(IdempotentResource)] failed to expand; see the compile errors"
    ));
    let status_ty = m
        .status
        .as_ref()
        .map_or_else(|| quote!(#krate::resource::__NoStatus), |s| quote!(#s));
    // The real accessors when the status type is known (their errors are real errors), else
    // placeholders over the stub status type.
    // The record's accessors are placeholders: a missing record is not reported next to
    // other errors (it may be what the fix of those is about).
    let record_stub = quote! {
        const PRUNE_BY_RECORD: bool = false;
        fn child_record_of(_: &mut #status_ty) -> ::core::option::Option<&mut ::std::vec::Vec<#krate::apply::CreatedChild>> { #unreachable }
    };
    let status_fns = if m.status.is_some() {
        let fns = status_fns(m);
        quote!(#fns #record_stub)
    } else {
        quote! {
            fn conditions_of(_: &#status_ty) -> &[#krate::__private::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] { #unreachable }
            fn conditions_of_mut(_: &mut #status_ty) -> &mut ::std::vec::Vec<#krate::__private::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> { #unreachable }
            #record_stub
            fn observed_generation_of(_: &#status_ty) -> ::core::option::Option<i64> { #unreachable }
            fn set_observed_generation_of(_: &mut #status_ty, _: i64) { #unreachable }
        }
    };
    let root_impl = m.root.as_ref().map(|root| {
        quote! {
            impl #krate::resource::IdempotentResource for #root {
                type Spec = #spec;
                type Status = #status_ty;
                const FIELD_MANAGER: &'static str = "";
                const LABEL_PREFIX: &'static str = "";
                const CONDITION_TYPES: &'static [&'static str] = &[];
                const TENANT_RULE: #krate::resource::TenantRule = #krate::resource::TenantRule::Name;
                const NAMESPACED: bool = false;
                fn spec(&self) -> &#spec { #unreachable }
                fn status(&self) -> ::core::option::Option<&#status_ty> { #unreachable }
                fn status_mut(&mut self) -> &mut ::core::option::Option<#status_ty> { #unreachable }
                fn tenant(&self) -> ::core::result::Result<#krate::resource::TenantRef, #krate::resource::TenantError> { #unreachable }
                #status_fns
            }
        }
    });
    quote! {
        const _: () = {
            impl #krate::resource::SpecDiff for #spec {
                fn diff(&self, _: &Self) -> ::std::vec::Vec<::std::string::String> { #unreachable }
                fn fingerprint(&self) -> #krate::compare::Fingerprint { #unreachable }
            }
            #root_impl
        };
    }
}
