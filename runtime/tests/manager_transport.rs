//! The manager's client against the real API server: requests that end share one HTTP/2
//! connection, where kube's default stack opens an HTTP/1.1 connection for each request in
//! flight; watches keep an HTTP/1.1 connection each, so they never take the shared
//! connection's streams; the configuration's TLS server name is used; requests a server closing
//! the connection gracefully refused are sent again; a server that speaks only HTTP/1.1 (a TLS
//! proxy in front) gets HTTP/1.1; a client certificate from an `exec` plugin is used on the
//! same transport. Connections are counted by a TCP relay in front of the server, as it accepts
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use idem_tests::shared;
use kube::client::Body;
use tokio::net::{TcpListener, TcpStream};

/// Requests sent at once.
const AT_ONCE: usize = 64;

fn get(uri: &str) -> http::Request<Body> {
    http::Request::get(uri).body(Body::empty()).unwrap()
}

/// A TCP relay on `host` to the API server's port, counting the connections it accepts.
async fn relay(host: &str) -> (kube::Config, Arc<AtomicUsize>) {
    relay_on(host, TcpListener::bind((host, 0)).await.unwrap())
}

/// A TCP relay from `listener` (on `host`) to the API server's port, counting the connections
/// it accepts.
fn relay_on(host: &str, listener: TcpListener) -> (kube::Config, Arc<AtomicUsize>) {
    let mut config = shared().config();
    let upstream = config.cluster_url.port_u16().expect("the server's port");
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    config.cluster_url = format!("https://{host}:{port}").parse().unwrap();
    (config, accepted)
}

/// Sends [`AT_ONCE`] lists of one Namespace at once through `client`; the HTTP version of
/// each answer.
async fn lists_at_once(client: &kube::Client) -> Vec<http::Version> {
    let lists = (0..AT_ONCE).map(|_| async {
        let response = client
            .send(get("/api/v1/namespaces?limit=1"))
            .await
            .unwrap();
        assert!(response.status().is_success(), "{:?}", response.status());
        response.version()
    });
    tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(lists))
        .await
        .expect("every list answered within 2 minutes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_at_once_share_one_http2_connection() {
    // kube's default stack, as a reference: a connection per request in flight.
    let (config, accepted) = relay("127.0.0.1").await;
    let versions = lists_at_once(&kube::Client::try_from(config).unwrap()).await;
    assert!(versions.iter().all(|v| *v == http::Version::HTTP_11));
    let kube_opened = accepted.load(Ordering::SeqCst);
    assert!(
        kube_opened >= 8,
        "kube's default client opened {kube_opened} connections for {AT_ONCE} requests at once"
    );

    // A new client's first burst, and a second one: one connection for all.
    let (config, accepted) = relay("127.0.0.1").await;
    let client = idem_runtime::manager::client::build(config).unwrap();
    for _ in 0..2 {
        let versions = lists_at_once(&client).await;
        assert!(
            versions.iter().all(|v| *v == http::Version::HTTP_2),
            "the manager's client speaks HTTP/2: {versions:?}"
        );
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "two bursts of {AT_ONCE} requests: one connection shared and the first request's \
         handshake that asked the server's protocol (kube's stack opened {kube_opened} \
         connections for one burst)"
    );
}

/// A TLS proxy on 127.0.0.1 in front of the API server that speaks HTTP/1.1 alone (it offers
/// only `http/1.1` in the TLS handshake, as a proxy without HTTP/2 does), with the server's
/// certificate, forwarding to the server over TLS with the configuration's client identity;
/// counting the connections it accepts.
async fn http1_proxy() -> (kube::Config, Arc<AtomicUsize>) {
    http1_proxy_on(TcpListener::bind(("127.0.0.1", 0)).await.unwrap())
}

/// [`http1_proxy`] on `listener`.
fn http1_proxy_on(listener: TcpListener) -> (kube::Config, Arc<AtomicUsize>) {
    use kube::client::ConfigExt as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let cp = shared();
    let mut config = cp.config();
    let upstream = config.cluster_url.port_u16().expect("the server's port");
    let pki = cp.run_dir().join("pki");
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki.join("apiserver.crt"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_file(pki.join("apiserver.key")).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let mut client = config.rustls_client_config().unwrap();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (acceptor, connector) = (acceptor.clone(), connector.clone());
            tokio::spawn(async move {
                let Ok(mut inbound) = acceptor.accept(inbound).await else {
                    return;
                };
                let Ok(tcp) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    return;
                };
                let name = ServerName::try_from("localhost").unwrap();
                if let Ok(mut outbound) = connector.connect(name, tcp).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    (config, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_speaks_only_http1_gets_http1() {
    let (config, accepted) = http1_proxy().await;
    let client = idem_runtime::manager::client::build(config).unwrap();
    let versions = lists_at_once(&client).await;
    assert!(
        versions.iter().all(|v| *v == http::Version::HTTP_11),
        "{versions:?}"
    );
    // Kept open by the pool, reused by the next burst: at most one per request in flight, and
    // the handshake that asked the server's protocol.
    let opened = accepted.load(Ordering::SeqCst);
    assert!((2..=AT_ONCE + 1).contains(&opened), "{opened} connections");
    lists_at_once(&client).await;
    let watch = client
        .send(get("/api/v1/namespaces?watch=true&timeoutSeconds=60"))
        .await
        .unwrap();
    assert!(watch.status().is_success(), "{:?}", watch.status());
    assert_eq!(watch.version(), http::Version::HTTP_11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_is_asked_again_after_a_handshake_failed() {
    // Nothing listens on the port at first: the requests waiting for the first handshake fail
    // with it; once the server is there, the next request asks again and gets through.
    let port = TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = shared().config();
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    let client = idem_runtime::manager::client::build(config).unwrap();
    let failed = futures::future::join_all((0..8).map(|_| client.send(get("/version")))).await;
    assert!(failed.iter().all(Result::is_err), "nothing listens yet");

    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let (_, accepted) = relay_on("127.0.0.1", listener);
    let response = client.send(get("/version")).await.unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the handshake, the shared connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_is_asked_again_when_a_connection_cannot_be_made_with_it() {
    // The server answers HTTP/2 through a relay whose connections the test can end...
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = shared().config().cluster_url.port_u16().unwrap();
    let open = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks = Arc::clone(&open);
    let relay = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let task = tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
            tasks.lock().unwrap().push(task);
        }
    });
    let mut config = shared().config();
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    let client = idem_runtime::manager::client::build(config).unwrap();
    let response = client.send(get("/version")).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);

    // ... then a proxy that speaks only HTTP/1.1 takes its place at the same address.
    relay.abort();
    let _ = relay.await;
    for task in open.lock().unwrap().drain(..) {
        task.abort();
    }
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let (_, accepted) = http1_proxy_on(listener);
    let mut answers = Vec::new();
    for _ in 0..4 {
        let answer = client.send(get("/version")).await;
        let done = answer
            .as_ref()
            .is_ok_and(|r| r.version() == http::Version::HTTP_11);
        answers.push(answer.map(|r| r.version()).map_err(|e| e.to_string()));
        if done {
            break;
        }
    }
    // The request on the shared connection fails to connect (the proxy refuses HTTP/2); the
    // next one asks again and gets HTTP/1.1. Before that, one request may still go to the
    // relay's connection the client has not yet seen closed (a loaded machine): it fails to
    // send, and is not a connect failure.
    let connect = answers
        .iter()
        .position(|a| a.as_ref().is_err_and(|e| e.contains("(Connect)")));
    let next = connect.and_then(|i| answers.get(i + 1));
    assert!(
        connect.is_some_and(|i| i <= 1)
            && next.is_some_and(|a| a.as_ref().is_ok_and(|v| *v == http::Version::HTTP_11)),
        "{answers:?} ({} connections to the proxy)",
        accepted.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_keep_a_connection_of_their_own_beside_the_shared_one() {
    let (config, accepted) = relay("127.0.0.1").await;
    let client = idem_runtime::manager::client::build(config).unwrap();
    let mut watches = Vec::new();
    for uri in [
        "/api/v1/namespaces?watch=true&timeoutSeconds=60",
        "/api/v1/namespaces?watch=1&timeoutSeconds=60",
        "/api/v1/namespaces?watch&timeoutSeconds=60",
        "/api/v1/watch/namespaces?timeoutSeconds=60",
    ] {
        let watch = client.send(get(uri)).await.unwrap();
        assert!(watch.status().is_success(), "{uri}: {:?}", watch.status());
        assert_eq!(
            watch.version(),
            http::Version::HTTP_11,
            "{uri}: a watch is not a stream of the shared connection"
        );
        watches.push(watch);
    }
    // With the watches open, other requests go on the shared connection.
    let response = client.send(get("/version")).await.unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        4 + 1 + 1,
        "a connection per watch, one shared, one handshake that asked the server's protocol"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_tls_server_name_is_checked_not_the_address() {
    // The server's certificate names localhost and 127.0.0.1, not 127.0.0.2.
    let (mut config, _) = relay("127.0.0.2").await;
    let client = idem_runtime::manager::client::build(config.clone()).unwrap();
    let refused = client.send(get("/version")).await;
    assert!(
        refused.is_err(),
        "a certificate that does not name 127.0.0.2 is refused"
    );

    config.tls_server_name = Some("localhost".into());
    let client = idem_runtime::manager::client::build(config).unwrap();
    let response = client.send(get("/version")).await.unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    assert_eq!(response.version(), http::Version::HTTP_2);
}

/// A second API server on the control plane's etcd, closing each HTTP/2 connection gracefully
/// (`GOAWAY`) after 2 % of its requests, as HA servers behind a load balancer are set up to: the
/// streams it had not started are refused, and the client sends them again. kube's stack, as a
/// reference, never meets this (HTTP/1.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_by_a_graceful_goaway_are_sent_again() {
    let cp = shared();
    let pid = cp
        .pids()
        .iter()
        .find(|(n, _)| n == "kube-apiserver")
        .expect("an API server")
        .1;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let mut args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let program = args.next().expect("the API server's path");
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut args: Vec<String> = args
        .map(|a| {
            if a.starts_with("--secure-port=") {
                format!("--secure-port={port}")
            } else {
                a
            }
        })
        .collect();
    args.push("--goaway-chance=0.02".into());
    let log = std::fs::File::create(cp.run_dir().join("goaway-apiserver.log")).unwrap();
    // Killed with this test (and by the kernel with the test binary).
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Server(
        idem_tests::process::dying_with_parent(std::path::Path::new(&program), "KILL")
            .args(&args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut config = cp.config();
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    let client = idem_runtime::manager::client::build(config).unwrap();
    idem_tests::eventually("the second API server ready", || async {
        match client.send(get("/readyz")).await {
            Ok(r) if r.status().is_success() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let mut failed = Vec::new();
    for _ in 0..20 {
        let all = (0..AT_ONCE).map(|_| client.send(get("/api/v1/namespaces/default")));
        for result in futures::future::join_all(all).await {
            match result {
                Ok(r) if r.status().is_success() => {}
                other => failed.push(format!("{other:?}")),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        20 * AT_ONCE,
        failed.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_plugins_client_certificate_is_used_on_the_shared_connection() {
    let (mut config, accepted) = relay("127.0.0.1").await;
    config.auth_info.client_certificate_data = None;
    config.auth_info.client_key_data = None;

    // Without an identity the server refuses the request: the one below is the plugin's.
    let anonymous = idem_runtime::manager::client::build(config.clone()).unwrap();
    let refused = anonymous
        .send(get("/api/v1/namespaces?limit=1"))
        .await
        .unwrap();
    assert!(
        matches!(refused.status().as_u16(), 401 | 403),
        "no identity: {:?}",
        refused.status()
    );

    // The plugin (`cat` of an ExecCredential, each run noted in `runs`) gives the admin's
    // certificate and key.
    let pki = shared().run_dir().join("pki");
    let credential = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "clientCertificateData": std::fs::read_to_string(pki.join("admin.crt")).unwrap(),
            "clientKeyData": std::fs::read_to_string(pki.join("admin.key")).unwrap(),
        },
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("credential.json");
    let runs = dir.path().join("runs");
    std::fs::write(&path, credential.to_string()).unwrap();
    config.auth_info.exec = Some(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "sh",
            "args": ["-c", format!("echo run >> '{}'; cat '{}'", runs.display(), path.display())],
            "interactiveMode": "Never",
        }))
        .unwrap(),
    );
    let before = accepted.load(Ordering::SeqCst);
    let client = idem_runtime::manager::client::build(config).unwrap();
    let versions = lists_at_once(&client).await;
    assert!(
        versions.iter().all(|v| *v == http::Version::HTTP_2),
        "with an exec plugin the client speaks HTTP/2 too: {versions:?}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst) - before,
        2,
        "{AT_ONCE} requests at once: the handshake that asked the protocol, and one shared \
         connection"
    );
    let runs = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert_eq!(
        runs, 2,
        "the plugin runs once for the TLS configuration the connectors share and once for \
         kube's authentication layer"
    );
}

/// An HTTP proxy on 127.0.0.1 that tunnels each `CONNECT host:port` to that address; per
/// tunnel, its target and its `Proxy-Authorization` (empty when there is none).
async fn connect_proxy() -> (u16, Arc<std::sync::Mutex<Vec<(String, String)>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let tunnels = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&tunnels);
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0; 1];
                    if inbound.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8(head).unwrap();
                let mut lines = head.lines();
                let request = lines.next().unwrap_or_default();
                let Some(target) = request
                    .strip_prefix("CONNECT ")
                    .and_then(|r| r.split(' ').next())
                else {
                    return;
                };
                let auth = lines
                    .filter_map(|l| l.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("proxy-authorization"))
                    .map(|(_, value)| value.trim().to_owned())
                    .unwrap_or_default();
                seen.lock().unwrap().push((target.to_owned(), auth));
                let Ok(mut outbound) = TcpStream::connect(target).await else {
                    return;
                };
                if inbound
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (port, tunnels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_proxy_tunnels_every_connection_with_the_urls_credentials() {
    let (port, tunnels) = connect_proxy().await;
    let mut config = shared().config();
    let server = config.cluster_url.authority().unwrap().to_string();
    // The password `p@ss`, percent-encoded in the URL as it must be.
    config.proxy_url = Some(
        format!("http://idem:p%40ss@127.0.0.1:{port}")
            .parse()
            .unwrap(),
    );
    let client = idem_runtime::manager::client::build(config).unwrap();
    let versions = lists_at_once(&client).await;
    assert!(
        versions.iter().all(|v| *v == http::Version::HTTP_2),
        "through the proxy the client speaks HTTP/2 with the server: {versions:?}"
    );
    let tunnels = tunnels.lock().unwrap().clone();
    // base64 of `idem:p@ss`.
    let expected = (server, "Basic aWRlbTpwQHNz".to_owned());
    assert_eq!(
        tunnels,
        [expected.clone(), expected],
        "{AT_ONCE} requests at once: two tunnels to the server (the handshake that asked the \
         protocol, and the shared connection), each with the URL's credentials"
    );
}
