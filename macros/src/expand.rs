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
            let stub = stub(&model);
            let errs = e.write_errors();
            quote! { #errs #stub }
        }
    }
}

fn status_impl(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let Some(status) = &m.status else {
        return TokenStream::new();
    };
    // Spanned at the `status = "..."` value, so a missing or mistyped field is reported there.
    let span = status.span();
    quote_spanned! {span=>
        impl #krate::resource::ObjectStatus for #status {
            // Patterns, not `self.field`: a missing field then reads "struct has no field
            // named `conditions`" instead of being confused with the trait's methods.
            fn conditions(&self) -> &[#krate::__private::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
                let Self { conditions, .. } = self;
                #krate::resource::ConditionsField::get(conditions)
            }
            fn conditions_mut(&mut self) -> &mut ::std::vec::Vec<#krate::__private::k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
                let Self { conditions, .. } = self;
                #krate::resource::ConditionsField::get_mut(conditions)
            }
            fn observed_generation(&self) -> ::core::option::Option<i64> {
                let Self { observed_generation, .. } = self;
                #krate::resource::ObservedGenerationField::get(observed_generation)
            }
            fn set_observed_generation(&mut self, generation: i64) {
                let Self { observed_generation, .. } = self;
                #krate::resource::ObservedGenerationField::set(observed_generation, generation)
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
    let fm = &m.field_manager;
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
        Tenant::NamespaceLabel(l) => (
            quote!(#krate::resource::TenantRule::NamespaceLabel(#l)),
            quote!(#krate::resource::__tenant::by_namespace_label(self, #l)),
        ),
        Tenant::Field(path) => {
            let text = path.iter().map(ToString::to_string).collect::<Vec<_>>().join(".");
            let span = path[0].span();
            (
                quote!(#krate::resource::TenantRule::Field(#text)),
                quote_spanned!(span=> #krate::resource::__tenant::by_field(&self.spec.#(#path).*, #text)),
            )
        }
    };
    let status_impl = status_impl(m);
    quote! {
        const _: () = {
            impl #krate::resource::SpecDiff for #spec {
                fn diff(&self, other: &Self) -> ::std::vec::Vec<&'static str> {
                    let mut differ = ::std::vec::Vec::new();
                    #(
                        if !#krate::compare::__field_eq(&self.#idents, &other.#idents) {
                            differ.push(#wires);
                        }
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

            #status_impl

            impl #krate::resource::IdempotentResource for #root {
                type Spec = #spec;
                type Status = #status;
                const FIELD_MANAGER: &'static str = #fm;
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
                fn tenant(&self) -> ::core::result::Result<#krate::resource::TenantRef, #krate::resource::TenantError> {
                    #tenant_body
                }
            }
        };
    }
}

/// Impls that let the rest of the user's code compile while the real errors are shown; never
/// run, because the crate does not compile.
fn stub(m: &Model) -> TokenStream {
    let krate = &m.krate;
    let spec = &m.spec;
    let unreachable = quote!(::core::unreachable!("#[derive(IdempotentResource)] failed to expand; see the compile errors"));
    let status_ty = m
        .status
        .as_ref()
        .map_or_else(|| quote!(#krate::resource::__NoStatus), |s| quote!(#s));
    let root_impl = m.root.as_ref().map(|root| {
        quote! {
            impl #krate::resource::IdempotentResource for #root {
                type Spec = #spec;
                type Status = #status_ty;
                const FIELD_MANAGER: &'static str = "";
                const CONDITION_TYPES: &'static [&'static str] = &[];
                const TENANT_RULE: #krate::resource::TenantRule = #krate::resource::TenantRule::Name;
                const NAMESPACED: bool = false;
                fn spec(&self) -> &#spec { #unreachable }
                fn status(&self) -> ::core::option::Option<&#status_ty> { #unreachable }
                fn status_mut(&mut self) -> &mut ::core::option::Option<#status_ty> { #unreachable }
                fn tenant(&self) -> ::core::result::Result<#krate::resource::TenantRef, #krate::resource::TenantError> { #unreachable }
            }
        }
    });
    let status_impl = status_impl(m);
    quote! {
        const _: () = {
            impl #krate::resource::SpecDiff for #spec {
                fn diff(&self, _: &Self) -> ::std::vec::Vec<&'static str> { #unreachable }
                fn fingerprint(&self) -> #krate::compare::Fingerprint { #unreachable }
            }
            #status_impl
            #root_impl
        };
    }
}
