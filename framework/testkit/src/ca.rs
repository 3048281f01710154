//! Throw-away cluster certificates for tests and examples.

use std::path::PathBuf;

/// A fresh folder under the system's temporary folder with a cluster CA
/// (named `tag`) and a certificate for each of `names`.
pub fn scratch_certs(tag: &str, names: &[&str]) -> Result<PathBuf, flotilla_transport::CertError> {
    let dir = std::env::temp_dir().join(format!("flotilla-certs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flotilla_transport::certs::init_ca(&dir, tag)?;
    for name in names {
        flotilla_transport::certs::issue(&dir, name, &dir)?;
    }
    Ok(dir)
}

/// A free UDP address on loopback (the OS picks the port).
pub fn free_addr() -> std::net::SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("loopback has a free UDP port")
}

/// A free TCP address on loopback (the OS picks the port), for HTTP
/// listeners such as `--metrics-listen`.
pub fn free_tcp_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("loopback has a free TCP port")
}
