//! The proxy a client's connections go through: which one applies to the API server, and the `CONNECT` tunnel through it.
//!
//! - **Which.** kube's configuration gives the kubeconfig cluster's `proxy-url`, or else
//!   `HTTPS_PROXY` (`https_proxy`) from the environment. A proxy from the environment is then
//!   judged as client-go judges it: not for a server on `localhost` or a loopback address, nor
//!   for one `NO_PROXY` (`no_proxy`) names: `*`, an IP address, a CIDR block, a domain
//!   (`example.com` and its subdomains; `.example.com` and `*.example.com` its subdomains
//!   only), each optionally with `:port`. A `proxy-url` in the kubeconfig always applies
//!   (unless it is the very URL `HTTPS_PROXY` holds: the two cannot be told apart).
//! - **How.** Only `http://` proxies (a URL without a scheme is read as one, as client-go reads
//!   it); each connection is an HTTP `CONNECT` tunnel, with the URL's percent-decoded user and
//!   password as basic `Proxy-Authorization`. Others are refused with [`ProxyError`], which
//!   names the proxy's scheme and host, never its credentials.

use std::net::IpAddr;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt as _};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::rt::TokioIo;
use kube::Config;
use tokio::net::TcpStream;
use tower::{BoxError, Service};

/// Why the client cannot go through the configured proxy.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The proxy is not an `http://` one (its scheme and host; credentials in the URL are not
    /// kept).
    #[error(
        "the proxy {0}://{1} (from the kubeconfig's `proxy-url`, or from `HTTPS_PROXY`) is not \
         an http:// proxy; idem's client tunnels through http:// proxies only: name one, or \
         exclude the API server with `NO_PROXY`"
    )]
    Scheme(String, String),
}

/// The proxy variables of the environment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Environment {
    /// The values of `HTTPS_PROXY` and `https_proxy`, those set.
    https_proxy: Vec<String>,
    /// `NO_PROXY`, else `no_proxy`.
    no_proxy: Option<String>,
}

impl Environment {
    /// This process's.
    pub(crate) fn read() -> Self {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        Self {
            https_proxy: ["HTTPS_PROXY", "https_proxy"]
                .into_iter()
                .filter_map(var)
                .collect(),
            no_proxy: var("NO_PROXY").or_else(|| var("no_proxy")),
        }
    }
}

/// The proxy `config`'s connections go through, if any (the module's rules).
pub(crate) fn through(config: &Config, env: &Environment) -> Option<http::Uri> {
    let proxy = config.proxy_url.as_ref()?;
    let from_environment =
        (env.https_proxy.iter()).any(|v| v.trim().parse::<http::Uri>().is_ok_and(|u| u == *proxy));
    if !from_environment {
        return Some(proxy.clone());
    }
    let server = &config.cluster_url;
    let host = server.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = server
        .port_u16()
        .unwrap_or(if server.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let excluded = (env.no_proxy.as_deref()).is_some_and(|list| no_proxy(list, host, port));
    (!loopback && !excluded).then(|| proxy.clone())
}

/// Whether the `NO_PROXY` list `list` names `host` (a name or an IP address, without brackets)
/// at `port`.
fn no_proxy(list: &str, host: &str, port: u16) -> bool {
    let host = host.to_ascii_lowercase();
    let ip = host.parse::<IpAddr>().ok();
    list.split(',')
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            if let Some((net, bits)) = entry.split_once('/') {
                return match (ip, net.parse::<IpAddr>(), bits.parse::<u32>()) {
                    (Some(ip), Ok(net), Ok(bits)) => in_block(ip, net, bits),
                    _ => false,
                };
            }
            let (name, entry_port) = split_port(&entry);
            if entry_port.is_some_and(|p| p != port) {
                return false;
            }
            if let Ok(entry_ip) = name.parse::<IpAddr>() {
                return ip == Some(entry_ip);
            }
            if ip.is_some() {
                return false;
            }
            let name = name.strip_prefix('*').unwrap_or(name);
            match name.strip_prefix('.') {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => host == name || host.ends_with(&format!(".{name}")),
            }
        })
}

/// An entry's host and port: `host:port`, `[v6]:port`, or a name or address alone.
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (entry, None),
        };
    }
    match entry.split_once(':') {
        Some((name, port)) if !port.contains(':') => (name, port.parse().ok()),
        _ => (entry, None),
    }
}

/// Whether `ip` is in the block `net/bits` (of the same family).
fn in_block(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The TCP connections under TLS: straight to the server, or a `CONNECT` tunnel through an
/// HTTP proxy.
#[derive(Clone)]
pub(crate) enum Tcp {
    Direct(HttpConnector),
    Tunnel(Box<Tunnel<HttpConnector>>),
}

impl Tcp {
    /// Direct without `proxy`; through it when it is an `http://` one (or has no scheme).
    ///
    /// # Errors
    /// [`ProxyError::Scheme`] for another scheme.
    pub(crate) fn new(proxy: Option<&http::Uri>) -> Result<Self, ProxyError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let Some(proxy) = proxy else {
            return Ok(Self::Direct(http));
        };
        let proxy = match proxy.scheme_str() {
            Some("http") => proxy.clone(),
            None if proxy.authority().is_some() => {
                let authority = proxy.authority().map(|a| a.as_str()).unwrap_or_default();
                format!("http://{authority}")
                    .parse()
                    .map_err(|_| ProxyError::Scheme(String::new(), host(proxy)))?
            }
            scheme => {
                return Err(ProxyError::Scheme(
                    scheme.unwrap_or_default().to_owned(),
                    host(proxy),
                ));
            }
        };
        let tunnel = Tunnel::new(proxy.clone(), http);
        Ok(Self::Tunnel(Box::new(match basic_auth(&proxy) {
            Some(auth) => tunnel.with_auth(auth),
            None => tunnel,
        })))
    }
}

/// A proxy URL's host, for messages.
fn host(proxy: &http::Uri) -> String {
    proxy.host().unwrap_or_default().to_owned()
}

/// The `Proxy-Authorization` of a proxy URL's `user:password` (percent-decoded: a password
/// holding `@` or `:` is written encoded in the URL).
fn basic_auth(proxy: &http::Uri) -> Option<http::HeaderValue> {
    use base64::Engine as _;
    let authority = proxy.authority()?.as_str();
    let (userinfo, _) = authority.rsplit_once('@')?;
    let decoded = percent_encoding::percent_decode_str(userinfo).collect::<Vec<u8>>();
    let value = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(decoded)
    );
    let mut value = http::HeaderValue::from_str(&value).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// `uri` with its scheme's port when it names none (the tunnel would ask for 443 whatever the
/// scheme).
fn with_port(uri: http::Uri) -> http::Uri {
    if uri.port().is_some() {
        return uri;
    }
    let port = if uri.scheme_str() == Some("http") {
        80
    } else {
        443
    };
    let mut parts = uri.clone().into_parts();
    let authority =
        (parts.authority.as_ref()).and_then(|a| format!("{}:{port}", a.host()).parse().ok());
    match authority {
        Some(authority) => {
            parts.authority = Some(authority);
            http::Uri::from_parts(parts).unwrap_or(uri)
        }
        None => uri,
    }
}

impl Service<http::Uri> for Tcp {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Self::Direct(c) => c.poll_ready(cx).map_err(Into::into),
            Self::Tunnel(c) => c.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        match self {
            Self::Direct(c) => c.call(uri).map(|r| r.map_err(Into::into)).boxed(),
            Self::Tunnel(c) => c
                .call(with_port(uri))
                .map(|r| r.map_err(Into::into))
                .boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(server: &str, proxy: &str) -> Config {
        let mut config = Config::new(server.parse().unwrap());
        config.proxy_url = Some(proxy.parse().unwrap());
        config
    }

    fn env(https_proxy: &str, no_proxy: Option<&str>) -> Environment {
        Environment {
            https_proxy: vec![https_proxy.into()],
            no_proxy: no_proxy.map(Into::into),
        }
    }

    #[test]
    fn a_proxy_from_the_environment_skips_loopback_servers_and_what_no_proxy_names() {
        let proxy = "http://proxy.corp:3128";
        let through = |server: &str, no_proxy: Option<&str>| {
            through(&config(server, proxy), &env(proxy, no_proxy)).is_some()
        };
        assert!(through("https://10.1.2.3:6443", None));
        assert!(!through("https://127.0.0.1:6443", None));
        assert!(!through("https://[::1]:6443", None));
        assert!(!through("https://localhost:6443", None));
        let list = Some(
            " example.com, .svc.local,*.corp.net ,10.0.0.0/8,192.168.1.7, fd00::/8, api.other:6443,",
        );
        assert!(!through("https://example.com", list));
        assert!(!through("https://k8s.example.com:6443", list));
        assert!(through("https://notexample.com", list));
        assert!(!through("https://a.svc.local", list));
        assert!(
            through("https://svc.local", list),
            ".svc.local names subdomains only"
        );
        assert!(!through("https://x.corp.net", list));
        assert!(!through("https://10.200.0.1:6443", list));
        assert!(through("https://11.0.0.1:6443", list));
        assert!(!through("https://192.168.1.7:6443", list));
        assert!(!through("https://[fd00::1]:6443", list));
        assert!(!through("https://api.other:6443", list));
        assert!(through("https://api.other:443", list), "another port");
        assert!(!through("https://anything", Some("*")));
        assert!(through("https://API.EXAMPLE.ORG", Some("example.com")));
        assert!(!through("https://API.EXAMPLE.COM", Some("Example.Com")));
    }

    #[test]
    fn a_kubeconfigs_own_proxy_always_applies() {
        let config = config("https://127.0.0.1:6443", "http://proxy.corp:3128");
        let env = env("http://other:3128", Some("*"));
        assert!(through(&config, &env).is_some());
        assert!(through(&config, &Environment::default()).is_some());
    }

    #[test]
    fn only_an_http_proxy_is_taken_and_its_credentials_stay_out_of_the_message() {
        assert!(
            Tcp::new(Some(
                &"http://user:secret@proxy.example:3128".parse().unwrap()
            ))
            .is_ok()
        );
        assert!(Tcp::new(Some(&"proxy.example:3128".parse().unwrap())).is_ok());
        for proxy in [
            "socks5://user:secret@proxy.example:1080",
            "https://user:secret@proxy.example:3128",
        ] {
            let Err(e) = Tcp::new(Some(&proxy.parse().unwrap())) else {
                panic!("{proxy} is refused");
            };
            let message = e.to_string();
            assert!(message.contains("://proxy.example"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn a_proxy_urls_user_and_password_are_decoded_into_basic_auth() {
        let uri = "http://us%65r:p%40ss%3Aword@proxy:3128".parse().unwrap();
        let auth = basic_auth(&uri).unwrap();
        // base64 of `user:p@ss:word`.
        assert_eq!(auth.to_str().unwrap(), "Basic dXNlcjpwQHNzOndvcmQ=");
        assert!(auth.is_sensitive());
        assert!(basic_auth(&"http://proxy:3128".parse().unwrap()).is_none());
    }

    #[test]
    fn a_tunnels_target_gets_its_schemes_port() {
        let port = |u: &str| with_port(u.parse().unwrap()).port_u16();
        assert_eq!(port("http://10.0.0.1/"), Some(80));
        assert_eq!(port("https://api.example/"), Some(443));
        assert_eq!(port("https://api.example:6443/"), Some(6443));
        assert_eq!(
            with_port("https://[::1]/".parse().unwrap())
                .authority()
                .unwrap()
                .as_str(),
            "[::1]:443"
        );
    }
}
