//! The manager's client against the real API server: requests that end share one HTTP/2
//! connection, where kube's default stack opens an HTTP/1.1 connection for each request in
//! flight; watches keep an HTTP/1.1 connection each, so they never take the shared
//! connection's streams. Connections are counted from this process's own TCP table.

use std::collections::HashSet;
use std::time::Duration;

use http_body_util::BodyExt;
use idem_tests::shared;
use kube::client::Body;

/// Requests sent at once.
const AT_ONCE: usize = 100;

/// This process's established TCP connections to `port` (by local address and port), from
/// `/proc/self/net/tcp` and `tcp6`.
fn connections_to(port: u16) -> HashSet<String> {
    let mut out = HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st …; "01" is ESTABLISHED; ports are hex.
            let remote_port = f
                .get(2)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) && f.get(3) == Some(&"01") {
                out.insert(f[1].to_string());
            }
        }
    }
    out
}

fn get(uri: &str) -> http::Request<Body> {
    http::Request::get(uri).body(Body::empty()).unwrap()
}

/// Sends [`AT_ONCE`] lists of one Namespace at once through `client` and returns the
/// connections to the server this process opened for them (idle ones stay open, pooled) and
/// the HTTP version of the answers.
async fn lists_at_once(client: &kube::Client, port: u16) -> (usize, Vec<http::Version>) {
    let before = connections_to(port);
    let lists = (0..AT_ONCE).map(|_| async {
        let response = client
            .send(get("/api/v1/namespaces?limit=1"))
            .await
            .unwrap();
        assert!(response.status().is_success(), "{:?}", response.status());
        response.version()
    });
    let versions = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(lists))
        .await
        .expect("every list answered within 2 minutes");
    (connections_to(port).difference(&before).count(), versions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_at_once_share_one_http2_connection() {
    let config = shared().config();
    let port = config.cluster_url.port_u16().expect("the server's port");

    // kube's default stack, as a reference: a connection per request in flight.
    let kube_client = kube::Client::try_from(config.clone()).unwrap();
    let (kube_opened, kube_versions) = lists_at_once(&kube_client, port).await;
    assert!(kube_versions.iter().all(|v| *v == http::Version::HTTP_11));
    assert!(
        kube_opened >= 10,
        "kube's default client opened {kube_opened} connections for {AT_ONCE} requests at once"
    );

    let client = idem_runtime::manager::client::build(config).unwrap();
    let (opened, versions) = lists_at_once(&client, port).await;
    assert!(
        versions.iter().all(|v| *v == http::Version::HTTP_2),
        "the manager's client speaks HTTP/2: {versions:?}"
    );
    assert!(
        opened <= 2,
        "{AT_ONCE} requests at once took {opened} connections (kube's stack: {kube_opened})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_keep_a_connection_of_their_own_beside_the_shared_one() {
    let config = shared().config();
    let client = idem_runtime::manager::client::build(config).unwrap();
    let mut watches = Vec::new();
    for _ in 0..4 {
        let watch = client
            .send(get("/api/v1/namespaces?watch=true&timeoutSeconds=60"))
            .await
            .unwrap();
        assert!(watch.status().is_success(), "{:?}", watch.status());
        assert_eq!(
            watch.version(),
            http::Version::HTTP_11,
            "a watch is not a stream of the shared connection"
        );
        watches.push(watch);
    }
    // With the watches open, other requests go on the shared connection.
    let response = client.send(get("/version")).await.unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    assert_eq!(response.version(), http::Version::HTTP_2);
    // The watches deliver: each starts with the existing Namespaces.
    for watch in watches {
        let mut body = watch.into_body();
        let first = tokio::time::timeout(Duration::from_secs(60), body.frame())
            .await
            .expect("a watch event within a minute");
        let frame = first.expect("a chunk").expect("no error");
        let bytes = frame.into_data().expect("data");
        assert!(
            String::from_utf8_lossy(&bytes).contains("\"type\":\"ADDED\""),
            "{bytes:?}"
        );
    }
}
