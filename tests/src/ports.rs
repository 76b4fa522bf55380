//! Choosing loopback ports for the control plane's components (and for servers tests start)
//! so that they are not lost to other processes' outgoing connections.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::error::{Error, Result};

/// How many times [`crate::ControlPlane::start_with`] starts the components again, on fresh ports,
/// when one of them lost its port to another process between choosing and binding it.
pub(crate) const PORT_ATTEMPTS: u32 = 3;

/// A free TCP port on 127.0.0.1, chosen at random *below* the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default) and checked by binding
/// it. Ports from the ephemeral range (what binding port 0 returns) are also handed out to
/// every outgoing connection of the machine, so one chosen that way can be taken before the
/// component binds it; below the range only another explicit `bind` can take it, and a start
/// that still loses that race is retried a few times.
pub fn free_port(taken: &[u16]) -> Result<u16> {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low > 11_000 {
        for _ in 0..200 {
            let port = rand::random_range(10_000..ephemeral_low);
            if !taken.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Error::io("finding a free port"))?;
    Ok(l.local_addr()
        .map_err(Error::io("finding a free port"))?
        .port())
}

/// A loopback address whose port is free (see [`free_port`]), for a server a test starts
/// (e.g. an operator's `--metrics-addr`).
///
/// # Panics
/// When no loopback port can be bound at all.
pub fn free_addr() -> SocketAddr {
    let port = free_port(&[]).expect("binding a free loopback port");
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Whether a start failed because a component could not bind its port.
pub(crate) fn lost_a_port(err: &Error) -> bool {
    matches!(err, Error::NotReady { tail, .. } if tail.contains("address already in use"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn ports_are_chosen_below_the_ephemeral_range_and_never_twice() {
        let low: u16 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .map(|s| s.split_whitespace().next().unwrap().parse().unwrap())
            .unwrap_or(32768);
        let mut taken = Vec::new();
        for _ in 0..50 {
            let port = free_port(&taken).unwrap();
            assert!(!taken.contains(&port), "{port} chosen twice");
            if low > 11_000 {
                assert!((10_000..low).contains(&port), "{port} not below {low}");
            }
            taken.push(port);
        }
    }

    #[test]
    fn only_a_lost_port_makes_a_start_try_again() {
        let failed = |tail: &str| Error::NotReady {
            component: "kube-controller-manager".into(),
            reason: "it exited with exit status: 1".into(),
            log: PathBuf::from("/tmp/kcm.log"),
            tail: tail.into(),
        };
        assert!(lost_a_port(&failed(
            "failed to listen on 127.0.0.1:39267: bind: address already in use"
        )));
        assert!(!lost_a_port(&failed("unknown flag: --nope")));
        assert!(!lost_a_port(&Error::Kubeconfig(
            "address already in use".into()
        )));
    }
}
