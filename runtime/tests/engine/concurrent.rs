//! Independent children are applied at the same time: a reconcile's cluster-scoped children
//! (Namespaces) first, all of them at once, then the namespaced children that live in them, at
//! most eight at once. Observed from the client's side of the wire on the real control plane.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use idem_runtime::apply::{Applier, ChildOutcome, DesiredChildren, Labels, Owner};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::client::Body;

use crate::common::{METRICS_LOCK, client};

/// One request seen by [`Tracking`]: its method and path, and whether this is its start or
/// its answer.
#[derive(Clone, Debug)]
struct Seen {
    start: bool,
    method: String,
    path: String,
}

/// A client service that records every request's start and answer, in order.
#[derive(Clone)]
struct Tracking {
    client: Client,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl tower::Service<http::Request<Body>> for Tracking {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let (client, seen) = (self.client.clone(), Arc::clone(&self.seen));
        Box::pin(async move {
            let (method, path) = (
                request.method().to_string(),
                request.uri().path().to_owned(),
            );
            let note = |start| {
                seen.lock().unwrap().push(Seen {
                    start,
                    method: method.clone(),
                    path: path.clone(),
                })
            };
            note(true);
            let response = client.send(request).await;
            note(false);
            response.map_err(|e| Box::new(e) as tower::BoxError)
        })
    }
}

/// The most requests matching `of` in flight at once.
fn peak(seen: &[Seen], of: impl Fn(&Seen) -> bool) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for s in seen.iter().filter(|s| of(s)) {
        if s.start {
            now += 1;
            most = most.max(now);
        } else {
            now -= 1;
        }
    }
    most
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..ObjectMeta::default()
    }
}

#[tokio::test]
async fn namespaces_first_then_what_lives_in_them_each_wave_at_once_at_most_eight() {
    let plain = client();
    let _guard = METRICS_LOCK.read().await;
    let name = idem_tests::unique_name("concurrent");
    let owner_obj = Api::<ClusterRole>::all(plain.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: meta(&name, None),
                ..ClusterRole::default()
            },
        )
        .await
        .expect("create the owner");
    let owner = Owner::labelled(
        &owner_obj,
        "idem-concurrent",
        None,
        Labels::with_prefix("concurrent.idem.dev"),
    )
    .expect("owner");

    let namespaces = [format!("{name}-a"), format!("{name}-b")];
    let mut desired = DesiredChildren::new();
    for ns in &namespaces {
        desired
            .add(&Namespace {
                metadata: meta(ns, None),
                ..Namespace::default()
            })
            .expect("namespace");
    }
    for ns in &namespaces {
        for i in 0..6 {
            desired
                .add(&ConfigMap {
                    metadata: meta(&format!("c{i}"), Some(ns)),
                    data: Some([("i".to_owned(), i.to_string())].into()),
                    ..ConfigMap::default()
                })
                .expect("configmap");
        }
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let tracked = Client::new(
        Tracking {
            client: plain.clone(),
            seen: Arc::clone(&seen),
        },
        plain.default_namespace().to_owned(),
    );
    let report = Applier::new(tracked)
        .reconcile(&owner, &desired)
        .await
        .expect("reconcile");
    assert_eq!(report.children.len(), 14, "{report:?}");
    assert!(
        report
            .children
            .iter()
            .all(|(_, o)| *o == ChildOutcome::Created),
        "{report:?}"
    );
    // The report lists the children in the desired order, whatever order they finished in.
    let order: Vec<String> = report.children.iter().map(|(k, _)| k.to_string()).collect();
    let wanted: Vec<String> = desired
        .children()
        .iter()
        .map(|c| c.key().to_string())
        .collect();
    assert_eq!(
        order
            .iter()
            .map(|k| k.rsplit('/').next())
            .collect::<Vec<_>>(),
        wanted
            .iter()
            .map(|k| k.rsplit('/').next())
            .collect::<Vec<_>>()
    );

    let seen = seen.lock().unwrap().clone();
    // Reads and writes of one Namespace, not the prune's list of them (which comes last).
    let is_ns = |s: &Seen| {
        s.path.starts_with("/api/v1/namespaces")
            && !s.path.contains("/configmaps")
            && !(s.method == "GET" && s.path == "/api/v1/namespaces")
    };
    let is_cm = |s: &Seen| s.path.contains("/configmaps");
    // Every request for a ConfigMap starts after the last answer about a Namespace.
    let last_ns_answer = seen
        .iter()
        .rposition(|s| !s.start && is_ns(s))
        .expect("namespaces were written");
    let first_cm = seen
        .iter()
        .position(is_cm)
        .expect("configmaps were written");
    assert!(
        first_cm > last_ns_answer,
        "a ConfigMap request started before its Namespace was made: {seen:#?}"
    );
    // Within each wave, children are applied at the same time; at most eight at once.
    let ns_peak = peak(&seen, is_ns);
    let cm_peak = peak(&seen, is_cm);
    assert_eq!(ns_peak, 2, "both Namespaces at once: {seen:#?}");
    assert!(
        (2..=8).contains(&cm_peak),
        "the 12 ConfigMaps at once, at most 8 in flight; saw {cm_peak}: {seen:#?}"
    );
    // The namespaces and their owner stay: the namespace controller would empty them after
    // this test let go of METRICS_LOCK, inside another test's count of writes.
}
