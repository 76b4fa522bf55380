//! CRD generation that reports, instead of panicking, a spec or status type that has no
//! Kubernetes structural schema (e.g. an internally or adjacently tagged enum).
//!
//! kube's `CustomResourceExt::crd()` hoists the properties of every `oneOf`/`anyOf` variant into
//! one object, as structural schemas require (Kubernetes "Specifying a structural schema"), and
//! panics inside kube-core, naming neither field nor type, when two variants define the same
//! property differently. That is what `#[serde(tag = "type")]` (internally tagged) and
//! `#[serde(tag = "t", content = "c")]` (adjacently tagged) enums, and untagged enums whose
//! variants share a property name, generate. [`crd`] finds such a type first and names it.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::resource::IdempotentResource;

/// Errors of [`crd`].
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A field's type is a union whose variants give one property different schemas.
    #[error(
        "{kind}: field `{path}` has type `{type_name}`, whose variants define property `{property}` \
         differently; a Kubernetes structural schema cannot express that (internally or \
         adjacently tagged enums, `#[serde(tag = \"...\")]`, and untagged enums whose variants \
         share a property name do this). Write instead an externally tagged enum (serde's \
         default, e.g. `{{s3: {{bucket: ...}}}}`: one property per variant), or a struct with \
         one `Option<...>` field per variant and a CEL rule \
         (`#[x_kube(validation = ...)]`) that exactly one is set"
    )]
    UnstructuralUnion {
        /// The kind whose CRD was generated.
        kind: String,
        /// The JSON path of the field, e.g. `spec.backup` or `spec.items[]`.
        path: String,
        /// The Rust type name of the union (as schemars names it).
        type_name: String,
        /// The property the variants disagree on, e.g. `type`.
        property: String,
    },
    /// A status field idem and kstatus readers (`kubectl wait`, GitOps health checks) read by
    /// its API name is named otherwise on the wire (a status struct without
    /// `#[serde(rename_all = "camelCase")]`).
    #[error(
        "{kind}: the status field `{found}` must be `{wire}` on the wire, as Kubernetes API \
         conventions and kstatus readers (kubectl wait, GitOps health checks) expect; put \
         `#[serde(rename_all = \"camelCase\")]` on the status struct"
    )]
    StatusFieldName {
        /// The kind whose CRD was generated.
        kind: String,
        /// The property name found, e.g. `observed_generation`.
        found: String,
        /// The name it must have, e.g. `observedGeneration`.
        wire: &'static str,
    },
    /// kube's CRD generation panicked for another reason.
    #[error("{kind}: generating the CRD failed: {message}")]
    Generation {
        /// The kind whose CRD was generated.
        kind: String,
        /// The panic message.
        message: String,
    },
}

/// The CRD of `K`, or an error naming the first field whose type has no structural schema.
///
/// # Errors
/// [`SchemaError::UnstructuralUnion`] for a spec or status field as described in the module
/// docs; [`SchemaError::Generation`] when kube's `crd()` panics for another reason.
pub fn crd<K>() -> Result<CustomResourceDefinition, SchemaError>
where
    K: CustomResourceExt + IdempotentResource,
    K::Spec: JsonSchema,
    K::Status: JsonSchema,
{
    let kind = K::kind(&()).to_string();
    check::<K::Spec>(&kind, "spec")?;
    check::<K::Status>(&kind, "status")?;
    status_names::<K::Status>(&kind)?;
    std::panic::catch_unwind(K::crd).map_err(|panic| SchemaError::Generation {
        kind,
        message: panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into()),
    })
}

/// Checks that the status type `T` names the fields idem writes by their API names.
///
/// # Errors
/// [`SchemaError::StatusFieldName`] for the first one named otherwise.
fn status_names<T: JsonSchema>(kind: &str) -> Result<(), SchemaError> {
    let schema = SchemaSettings::openapi3()
        .into_generator()
        .into_root_schema_for::<T>();
    let value = serde_json::to_value(&schema).unwrap_or_default();
    let Some(props) = value.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (found, wire) in [
        ("observed_generation", "observedGeneration"),
        ("created_children", "createdChildren"),
    ] {
        if props.contains_key(found) && !props.contains_key(wire) {
            return Err(SchemaError::StatusFieldName {
                kind: kind.to_owned(),
                found: found.to_owned(),
                wire,
            });
        }
    }
    Ok(())
}

/// Checks the schema of `T` (found at `root`, e.g. `spec`) for unions with conflicting
/// variant properties.
///
/// # Errors
/// [`SchemaError::UnstructuralUnion`] for the first one found.
pub fn check<T: JsonSchema>(kind: &str, root: &str) -> Result<(), SchemaError> {
    let schema = SchemaSettings::openapi3()
        .into_generator()
        .into_root_schema_for::<T>();
    let value = serde_json::to_value(&schema).unwrap_or_default();
    let mut walker = Walker {
        root: &value,
        kind,
        visiting: BTreeSet::new(),
    };
    walker.walk(&value, root, &T::schema_name())
}

struct Walker<'a> {
    root: &'a Value,
    kind: &'a str,
    visiting: BTreeSet<String>,
}

impl Walker<'_> {
    fn definition(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        self.root.pointer(pointer)
    }

    fn walk(&mut self, node: &Value, path: &str, type_name: &str) -> Result<(), SchemaError> {
        let Some(obj) = node.as_object() else {
            return Ok(());
        };
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            let name = reference
                .rsplit('/')
                .next()
                .unwrap_or(reference)
                .to_string();
            if self.visiting.insert(reference.to_string()) {
                if let Some(def) = self.definition(reference) {
                    self.walk(&def.clone(), path, &name)?;
                }
                self.visiting.remove(reference);
            }
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(variants) = obj.get(key).and_then(Value::as_array) {
                self.check_union(variants, path, type_name)?;
            }
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            for sub in obj.get(key).and_then(Value::as_array).into_iter().flatten() {
                self.walk(sub, path, type_name)?;
            }
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                self.walk(sub, &format!("{path}.{name}"), type_name)?;
            }
        }
        if let Some(items) = obj.get("items") {
            self.walk(items, &format!("{path}[]"), type_name)?;
        }
        if let Some(extra) = obj.get("additionalProperties") {
            self.walk(extra, &format!("{path}.*"), type_name)?;
        }
        Ok(())
    }

    /// A union whose variants (after following references) define one property with
    /// different schemas.
    fn check_union(
        &self,
        variants: &[Value],
        path: &str,
        type_name: &str,
    ) -> Result<(), SchemaError> {
        let mut seen: Vec<(&str, &Value)> = Vec::new();
        for variant in variants {
            let variant = match variant.get("$ref").and_then(Value::as_str) {
                Some(r) => self.definition(r).unwrap_or(variant),
                None => variant,
            };
            for (name, schema) in variant
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                match seen.iter().find(|(n, _)| *n == name.as_str()) {
                    Some((_, other)) if *other != schema => {
                        return Err(SchemaError::UnstructuralUnion {
                            kind: self.kind.to_string(),
                            path: path.to_string(),
                            type_name: type_name.to_string(),
                            property: name.clone(),
                        });
                    }
                    Some(_) => {}
                    None => seen.push((name.as_str(), schema)),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kube::CustomResource;
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    struct St {
        observed_generation: Option<i64>,
        conditions: Vec<Condition>,
    }

    /// A status struct without `rename_all`: `observed_generation` on the wire.
    #[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
    struct SnakeSt {
        observed_generation: Option<i64>,
        conditions: Vec<Condition>,
    }

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "type")]
    enum Backup {
        S3 { bucket: String },
        Gcs { bucket: String, project: String },
    }

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind", content = "spec")]
    enum Source {
        Git(String),
        Oci { image: String },
    }

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "camelCase")]
    enum External {
        S3 { bucket: String },
        Gcs { bucket: String, project: String },
    }

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(
        group = "t.example",
        version = "v1",
        kind = "Internal",
        namespaced,
        status = "St"
    )]
    #[idempotent(crate = "crate", prune = owner_references)]
    struct InternalSpec {
        name: String,
        backup: Option<Backup>,
    }

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(
        group = "t.example",
        version = "v1",
        kind = "Adjacent",
        namespaced,
        status = "St"
    )]
    #[idempotent(crate = "crate", prune = owner_references)]
    struct AdjacentSpec {
        sources: Vec<Source>,
    }

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(
        group = "t.example",
        version = "v1",
        kind = "Fine",
        namespaced,
        status = "St"
    )]
    #[idempotent(crate = "crate", prune = owner_references)]
    struct FineSpec {
        backup: External,
    }

    #[test]
    fn an_internally_tagged_enum_is_named_with_its_field_and_a_fix() {
        // kube's own crd() panics here, naming neither the field nor the type.
        assert!(std::panic::catch_unwind(Internal::crd).is_err());
        let err = crd::<Internal>().unwrap_err();
        let SchemaError::UnstructuralUnion {
            path,
            type_name,
            property,
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(
            (path.as_str(), type_name.as_str(), property.as_str()),
            ("spec.backup", "Backup", "type")
        );
        let text = err.to_string();
        assert!(
            text.starts_with("Internal: field `spec.backup` has type `Backup`"),
            "{text}"
        );
        assert!(text.contains("externally tagged enum"), "{text}");
    }

    #[test]
    fn an_adjacently_tagged_enum_in_a_list_is_named() {
        let err = crd::<Adjacent>().unwrap_err().to_string();
        assert!(err.contains("`spec.sources[]` has type `Source`"), "{err}");
    }

    #[derive(
        CustomResource,
        idem_macros::IdempotentResource,
        Clone,
        Debug,
        Serialize,
        Deserialize,
        JsonSchema,
    )]
    #[kube(
        group = "t.example",
        version = "v1",
        kind = "Snake",
        namespaced,
        status = "SnakeSt"
    )]
    #[idempotent(crate = "crate", prune = owner_references)]
    struct SnakeSpec {
        size: u32,
    }

    #[test]
    fn a_status_field_not_named_as_the_api_names_it_is_an_error_with_the_fix() {
        let err = crd::<Snake>().unwrap_err().to_string();
        assert!(
            err.contains("`observed_generation` must be `observedGeneration`")
                && err.contains(r#"#[serde(rename_all = "camelCase")]"#),
            "{err}"
        );
    }

    #[test]
    fn an_externally_tagged_enum_gives_a_crd() {
        let crd = crd::<Fine>().unwrap();
        assert_eq!(crd.spec.names.kind, "Fine");
    }
}
