//! The operator's client does not repeat a create that met 504 Gateway Timeout (it may have
//! been carried out; the reconcile reads and decides again), while reads are still retried.
//! Against a stand-in HTTP server that answers every request with 504: the real API server
//! cannot be made to time out on demand.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves 504 to everything; records each request's method.
async fn gateway_timeouts() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                loop {
                    let Ok(n) = stream.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    if let Some(method) = head.split_whitespace().next()
                        && head.contains("HTTP/1.1")
                    {
                        log.lock().unwrap().push(method.to_string());
                    }
                    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Timeout: request did not complete within the allotted timeout","reason":"Timeout","code":504}"#;
                    let reply = format!(
                        "HTTP/1.1 504 Gateway Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn a_create_that_times_out_is_sent_once_but_a_read_is_retried() {
    let (url, seen) = gateway_timeouts().await;
    let config = kube::Config::new(url.parse().unwrap());
    let client = idem_runtime::manager::client::build(config).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
    let err = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect_err("504");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 504),
        "{err:?}"
    );
    assert_eq!(*seen.lock().unwrap(), ["POST"], "the create is sent once");

    // A read is idempotent: kube's retry repeats it (cut short here, it backs off for long).
    let _ = tokio::time::timeout(Duration::from_secs(2), cms.get("x")).await;
    let gets = seen.lock().unwrap().iter().filter(|m| *m == "GET").count();
    assert!(gets >= 2, "a GET is retried on 504; saw {gets}");
}
