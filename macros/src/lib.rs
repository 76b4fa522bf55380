//! `#[derive(IdempotentResource)]`: the derive that turns a kube `CustomResource` spec into an
//! idem tenant resource (desired-state comparison, tenant key, status bookkeeping).
//!
//! Use it through `idem-runtime`, which re-exports it and documents every attribute. The
//! pipeline is parse (`parse.rs`: syntax and darling attributes, every item keeping its span)
//! → validate (`validate.rs`: meaning, all errors collected) → expand (`expand.rs`: the impls,
//! or a stub impl next to the errors so only the real errors are shown).

mod attr;
mod case;
mod expand;
mod parse;
mod validate;

use proc_macro::TokenStream;

/// Implements `idem_runtime::resource::IdempotentResource` for the root of a kube
/// `CustomResource`; documented in `idem_runtime` where it is re-exported.
#[proc_macro_derive(IdempotentResource, attributes(idempotent, kube))]
pub fn derive_idempotent_resource(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
