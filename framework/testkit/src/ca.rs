//! Throw-away cluster certificates for tests and examples.

use std::path::PathBuf;

/// A fresh folder under the system's temporary folder with a cluster CA
/// (named `tag`), the head's certificate for the first of `names` (role
/// head), an `admin` certificate (role admin) and a worker's certificate
/// for each of the others.
pub fn scratch_certs(tag: &str, names: &[&str]) -> Result<PathBuf, flotilla_transport::CertError> {
    let dir = std::env::temp_dir().join(format!("flotilla-certs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let head = names.first().copied().unwrap_or("head");
    flotilla_transport::certs::init_ca(&dir, tag, head)?;
    for name in names {
        if !dir.join(format!("{name}.crt")).exists() {
            issue_role(&dir, name, flotilla_proto::role::Role::Worker)?;
        }
    }
    Ok(dir)
}

/// Issues a certificate of `role` for `name` in the CA folder `dir`.
pub fn issue_role(
    dir: &std::path::Path,
    name: &str,
    role: flotilla_proto::role::Role,
) -> Result<(), flotilla_transport::CertError> {
    flotilla_transport::certs::issue(
        dir,
        name,
        role,
        flotilla_transport::certs::DEFAULT_VALIDITY,
        dir,
    )
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
