//! Which API verb a request is, named as the API server's `apiserver_request_total` names it.

use http::{HeaderMap, Method, Uri};

/// The verb of one API request, as the API server's request counters
/// (`apiserver_request_total{verb=…}`) label it, so the layer's counts and the server's can be
/// compared directly.
///
/// The rule is the API server's own request-info parsing (k8s.io/apiserver `RequestInfoFactory`):
/// a `GET` of a named object is `GET`, of a collection `LIST`, with `watch=true|1` `WATCH`; a
/// `DELETE` of a collection is `DELETECOLLECTION`; a `PATCH` with content type
/// `application/apply-patch+yaml` is server-side apply, `APPLY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// `GET` of one named object (or of a non-resource path such as `/version`).
    Get,
    /// `GET` of a collection.
    List,
    /// `GET` of a collection or object with `watch=true`.
    Watch,
    /// `POST`: create.
    Create,
    /// `PUT`: replace (update).
    Update,
    /// `PATCH` other than server-side apply (merge, strategic merge, JSON patch).
    Patch,
    /// `PATCH` with `application/apply-patch+yaml`: server-side apply.
    Apply,
    /// `DELETE` of one named object.
    Delete,
    /// `DELETE` of a collection.
    DeleteCollection,
    /// Any other method (`HEAD`, `OPTIONS`, …).
    Other,
}

impl Verb {
    /// Every verb, in a fixed order.
    pub const ALL: [Verb; 10] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Apply,
        Verb::Delete,
        Verb::DeleteCollection,
        Verb::Other,
    ];

    /// The `verb` label `apiserver_request_total` gives such a request (`GET`, `LIST`, `WATCH`,
    /// `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`, `DELETECOLLECTION`; `OTHER` for the rest).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch => "PATCH",
            Verb::Apply => "APPLY",
            Verb::Delete => "DELETE",
            Verb::DeleteCollection => "DELETECOLLECTION",
            Verb::Other => "OTHER",
        }
    }

    /// Whether the verb changes state (the verbs of [`crate::metrics::WRITE_VERBS`]).
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Verb::Create
                | Verb::Update
                | Verb::Patch
                | Verb::Apply
                | Verb::Delete
                | Verb::DeleteCollection
        )
    }

    /// The verb of a request with this method, URI and headers.
    pub fn of(method: &Method, uri: &Uri, headers: &HeaderMap) -> Verb {
        let named = names_an_object(uri.path());
        let watch = uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
            || uri.path().contains("/watch/");
        match *method {
            Method::GET if watch => Verb::Watch,
            Method::GET if named == Some(false) => Verb::List,
            Method::GET => Verb::Get,
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => {
                let apply = headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/apply-patch"));
                if apply { Verb::Apply } else { Verb::Patch }
            }
            Method::DELETE if named == Some(false) => Verb::DeleteCollection,
            Method::DELETE => Verb::Delete,
            _ => Verb::Other,
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// For an API resource path (`/api/v1/…`, `/apis/<group>/<version>/…`): whether it names one
/// object (`Some(true)`) or a collection (`Some(false)`); `None` for other paths.
fn names_an_object(path: &str) -> Option<bool> {
    let mut parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let prefix = match parts.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return None,
    };
    if parts.len() <= prefix {
        return None; // discovery
    }
    parts.drain(..prefix);
    if parts.first() == Some(&"watch") {
        parts.remove(0); // the deprecated /watch/ prefix
    }
    // `namespaces/<ns>/<resource>…` is namespaced, except the namespace's own subresources.
    if parts.first() == Some(&"namespaces")
        && parts.len() > 2
        && !matches!(parts[2], "status" | "finalize")
    {
        parts.drain(..2);
    }
    Some(parts.len() >= 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(method: Method, uri: &str) -> Verb {
        Verb::of(&method, &uri.parse().unwrap(), &HeaderMap::new())
    }

    #[test]
    fn requests_get_the_api_servers_verbs() {
        let cases = [
            (Method::GET, "/api/v1/namespaces/a/configmaps/x", Verb::Get),
            (Method::GET, "/api/v1/namespaces/a/configmaps", Verb::List),
            (Method::GET, "/api/v1/configmaps?limit=500", Verb::List),
            (
                Method::GET,
                "/api/v1/namespaces/a/configmaps?watch=true&resourceVersion=1",
                Verb::Watch,
            ),
            (Method::GET, "/api/v1/watch/namespaces/a/pods", Verb::Watch),
            (Method::GET, "/api/v1/namespaces", Verb::List),
            (Method::GET, "/api/v1/namespaces/a", Verb::Get),
            (Method::PUT, "/api/v1/namespaces/a/finalize", Verb::Update),
            (Method::GET, "/api/v1/namespaces/a/status", Verb::Get),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/a/deployments/d/status",
                Verb::Get,
            ),
            (Method::GET, "/apis/idem.dev/v1alpha1/tenants", Verb::List),
            (Method::GET, "/apis/idem.dev/v1alpha1/tenants/t", Verb::Get),
            (Method::GET, "/version", Verb::Get),
            (Method::GET, "/apis", Verb::Get),
            (
                Method::POST,
                "/api/v1/namespaces/a/configmaps",
                Verb::Create,
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/configmaps/x",
                Verb::Update,
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/configmaps/x",
                Verb::Patch,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/configmaps/x",
                Verb::Delete,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/configmaps",
                Verb::DeleteCollection,
            ),
            (
                Method::HEAD,
                "/api/v1/namespaces/a/configmaps/x",
                Verb::Other,
            ),
        ];
        for (method, uri, want) in cases {
            assert_eq!(verb(method.clone(), uri), want, "{method} {uri}");
        }
    }

    #[test]
    fn a_patch_with_the_apply_content_type_is_apply() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/apply-patch+yaml".parse().unwrap(),
        );
        let uri = "/api/v1/namespaces/a/configmaps/x?fieldManager=m"
            .parse()
            .unwrap();
        assert_eq!(Verb::of(&Method::PATCH, &uri, &headers), Verb::Apply);
        assert!(Verb::Apply.is_write() && !Verb::Watch.is_write());
        let labels: Vec<&str> = Verb::ALL.iter().map(|v| v.as_str()).collect();
        for write in crate::metrics::WRITE_VERBS {
            assert!(labels.contains(&write), "{write}");
        }
    }
}
