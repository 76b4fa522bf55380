//! Reading the API server's own request counters (`apiserver_request_total` in `/metrics`), so
//! tests count writes as the server saw them rather than by their own bookkeeping; and a
//! manager's own `/metrics` ([`scrape`]).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The body of `GET /metrics` on `addr` (a manager's metrics address), once it answers 200.
pub async fn scrape(addr: SocketAddr) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The verbs that change state, as `apiserver_request_total` labels them (`APPLY` is
/// server-side apply, a PATCH with `application/apply-patch+yaml`).
pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Total `apiserver_request_total` for one verb on one resource (plural, e.g. `configmaps`)
/// of one API group (`""` for the core group), over every subresource, scope and code.
pub fn requests(metrics_text: &str, verb: &str, group: &str, resource: &str) -> u64 {
    samples(metrics_text, "apiserver_request_total")
        .filter(|s| {
            s.label("verb") == Some(verb)
                && s.label("group") == Some(group)
                && s.label("resource") == Some(resource)
        })
        .map(|s| s.value as u64)
        .sum()
}

/// Total write requests (every verb in [`WRITE_VERBS`]) on one resource of one group.
pub fn writes(metrics_text: &str, group: &str, resource: &str) -> u64 {
    WRITE_VERBS
        .iter()
        .map(|verb| requests(metrics_text, verb, group, resource))
        .sum()
}

/// Watches the API server holds open now on one resource (plural) of one group (`""` for the
/// core group), whoever opened them: `apiserver_longrunning_requests` with verb `WATCH`.
pub fn open_watches(metrics_text: &str, group: &str, resource: &str) -> u64 {
    samples(metrics_text, "apiserver_longrunning_requests")
        .filter(|s| {
            s.label("verb") == Some("WATCH")
                && s.label("group") == Some(group)
                && s.label("resource") == Some(resource)
        })
        .map(|s| s.value as u64)
        .sum()
}

/// Every `apiserver_request_total` sample's verb, group, resource and subresource with its
/// value (summed over the other labels: code, scope, version, …), for callers that slice the
/// counts their own way.
pub fn all_requests(metrics_text: &str) -> Vec<RequestCount> {
    let mut out: Vec<RequestCount> = Vec::new();
    for s in samples(metrics_text, "apiserver_request_total") {
        let get = |k| s.label(k).unwrap_or_default().to_owned();
        let (verb, group, resource, subresource) = (
            get("verb"),
            get("group"),
            get("resource"),
            get("subresource"),
        );
        match out.iter_mut().find(|c| {
            c.verb == verb
                && c.group == group
                && c.resource == resource
                && c.subresource == subresource
        }) {
            Some(c) => c.count += s.value as u64,
            None => out.push(RequestCount {
                verb,
                group,
                resource,
                subresource,
                count: s.value as u64,
            }),
        }
    }
    out
}

/// Requests of one verb on one resource (and subresource), as [`all_requests`] returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestCount {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`, …
    pub verb: String,
    /// API group, `""` for the core group.
    pub group: String,
    /// Plural resource name, e.g. `namespaces`.
    pub resource: String,
    /// Subresource, e.g. `status`; `""` for the object itself.
    pub subresource: String,
    /// How many requests.
    pub count: u64,
}

/// One sample line of the Prometheus text format: `name{k="v",...} value`.
#[derive(Debug)]
struct Sample<'a> {
    labels: Vec<(&'a str, &'a str)>,
    value: f64,
}

impl Sample<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Sample<'a>> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => {
                let end = r.rfind('}')?;
                (&r[..end], r[end + 1..].trim())
            }
            None if rest.starts_with(' ') => ("", rest.trim()),
            None => return None,
        };
        let value = value.split_whitespace().next()?.parse().ok()?;
        Some(Sample {
            labels: parse_labels(labels),
            value,
        })
    })
}

/// Splits `a="x",b="y"`; label values in these metrics never contain `"` or `,` escapes.
fn parse_labels(s: &str) -> Vec<(&str, &str)> {
    s.split("\",")
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="APPLY",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="GET",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="status",verb="PUT",version="v1"} 5
apiserver_request_total_other{group="",resource="configmaps",verb="POST"} 99
"#;

    #[test]
    fn counts_by_verb_group_and_resource() {
        assert_eq!(requests(TEXT, "POST", "", "configmaps"), 3);
        assert_eq!(requests(TEXT, "GET", "", "configmaps"), 40);
        assert_eq!(requests(TEXT, "PUT", "apps", "deployments"), 5);
        assert_eq!(requests(TEXT, "PUT", "", "deployments"), 0);
    }

    #[test]
    fn all_requests_keep_subresources_apart() {
        let all = all_requests(TEXT);
        let find = |verb: &str, resource: &str, sub: &str| {
            all.iter()
                .find(|c| c.verb == verb && c.resource == resource && c.subresource == sub)
                .map(|c| c.count)
        };
        assert_eq!(find("POST", "configmaps", ""), Some(3));
        assert_eq!(find("PUT", "deployments", "status"), Some(5));
        assert_eq!(find("PUT", "deployments", ""), None);
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn writes_sum_every_write_verb_and_skip_reads() {
        assert_eq!(writes(TEXT, "", "configmaps"), 5);
        assert_eq!(writes(TEXT, "apps", "deployments"), 5);
    }

    #[test]
    fn open_watches_count_the_open_watches_of_one_resource() {
        let text = r#"apiserver_longrunning_requests{component="apiserver",group="",resource="namespaces",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_longrunning_requests{component="apiserver",group="",resource="namespaces",scope="cluster",subresource="",verb="LIST",version="v1"} 7
apiserver_longrunning_requests{component="apiserver",group="",resource="configmaps",scope="cluster",subresource="",verb="WATCH",version="v1"} 5
apiserver_longrunning_requests{component="apiserver",group="",resource="namespaces",scope="resource",subresource="",verb="WATCH",version="v1"} 1
"#;
        assert_eq!(open_watches(text, "", "namespaces"), 4);
        assert_eq!(open_watches(text, "", "configmaps"), 5);
        assert_eq!(open_watches(text, "apps", "deployments"), 0);
    }
}
