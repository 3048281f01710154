//! The cluster certificate authority: creating it, issuing node and admin
//! certificates, and loading a node's identity.
//!
//! ```text
//! DIR/ca.crt            the cluster CA certificate (every node trusts it)
//! DIR/ca.key            the CA key (keep it off worker machines)
//! DIR/NAME.crt/.key     a node's certificate (SAN = NAME) and key, 0600
//! DIR/admin.crt/.key    the operator's certificate for `node status`
//! DIR/cookie            the cluster cookie (random, 0600): nodes and tools
//!                       using the folder present it in every hello
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why certificates could not be created or loaded. These are configuration
/// errors: fail at start-up with the hint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file could not be read or written.
    #[error("NODE-CERT-001: {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("NODE-CERT-002: {path} is not a valid PEM {what}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
        /// The parser's complaint.
        reason: String,
    },
    /// Generating or signing a certificate failed.
    #[error("NODE-CERT-003: cannot generate certificate: {0}")]
    Generate(String),
    /// The name cannot be a certificate name.
    #[error(
        "NODE-CERT-004: {0:?} is not a valid node name (letters, digits, '-' and '.', at most 63 characters)"
    )]
    InvalidName(String),
    /// Refusing to overwrite an existing file.
    #[error("NODE-CERT-005: {0} exists; remove it first to create a new one")]
    Exists(PathBuf),
    /// The cookie file is empty.
    #[error("NODE-CERT-006: {0} is empty; it should hold the cluster cookie")]
    EmptyCookie(PathBuf),
    /// No random bytes for a new cookie.
    #[error("NODE-CERT-007: the system's random number generator failed")]
    Random,
}

/// Name of the cookie file in a certs folder.
pub const COOKIE_FILE: &str = "cookie";

/// The digest of `cookie` that hellos carry.
pub fn cookie_digest(cookie: &str) -> flotilla_proto::hello::CookieDigest {
    use sha2::Digest;
    sha2::Sha256::digest(cookie.as_bytes()).into()
}

/// A fresh random cookie: 32 random bytes, in hex.
fn random_cookie() -> Result<String, CertError> {
    let mut bytes = [0u8; 32];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| CertError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The cookie in `dir/cookie`, or `None` when the folder has none.
pub fn load_cookie(dir: &Path) -> Result<Option<String>, CertError> {
    let path = dir.join(COOKIE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => Err(CertError::EmptyCookie(path)),
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CertError::Io { path, source }),
    }
}

/// Whether `name` is usable as a node name and certificate DNS name.
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
}

fn gen_err(e: rcgen::Error) -> CertError {
    CertError::Generate(e.to_string())
}

fn ca_params(common_name: &str) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, common_name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() {
        return Err(CertError::Exists(path.to_path_buf()));
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = opts.open(path).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)
}

fn read(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates a new cluster CA in `dir` (`ca.crt`, `ca.key`), a random
/// cluster cookie (`cookie`, 0600) and an `admin` certificate for
/// operators' tools. Refuses to overwrite existing files.
pub fn init_ca(dir: &Path, cluster_name: &str) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = ca_params(cluster_name)?
        .self_signed(&key)
        .map_err(gen_err)?;
    write_new(&dir.join("ca.crt"), &cert.pem(), false)?;
    write_new(&dir.join("ca.key"), &key.serialize_pem(), true)?;
    write_new(&dir.join(COOKIE_FILE), &(random_cookie()? + "\n"), true)?;
    issue(dir, flotilla_proto::hello::ADMIN_NAME, dir)
}

/// Issues a certificate for `name` signed by the CA in `ca_dir`, written to
/// `out_dir/NAME.crt` and `out_dir/NAME.key` (0600). The certificate is valid
/// for both sides of mutual TLS, with `name` as its only DNS name.
pub fn issue(ca_dir: &Path, name: &str, out_dir: &Path) -> Result<(), CertError> {
    if !valid_node_name(name) {
        return Err(CertError::InvalidName(name.to_owned()));
    }
    let ca_key_path = ca_dir.join("ca.key");
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(|e| CertError::Pem {
        path: ca_key_path,
        what: "private key",
        reason: e.to_string(),
    })?;
    let ca_cert_path = ca_dir.join("ca.crt");
    let issuer =
        Issuer::from_ca_cert_pem(&read(&ca_cert_path)?, ca_key).map_err(|e| CertError::Pem {
            path: ca_cert_path,
            what: "certificate",
            reason: e.to_string(),
        })?;
    let mut p = CertificateParams::new(vec![name.to_owned()]).map_err(gen_err)?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = p.signed_by(&key, &issuer).map_err(gen_err)?;
    std::fs::create_dir_all(out_dir).map_err(|source| CertError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    write_new(&out_dir.join(format!("{name}.crt")), &cert.pem(), false)?;
    write_new(
        &out_dir.join(format!("{name}.key")),
        &key.serialize_pem(),
        true,
    )
}

/// A node's TLS identity: its certificate chain and key, and the cluster CA.
#[derive(Debug)]
pub struct Identity {
    /// The name in the certificate.
    pub name: String,
    /// The node's certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The node's private key.
    pub key: PrivateKeyDer<'static>,
    /// The cluster CA certificates.
    pub ca: Vec<CertificateDer<'static>>,
    /// The cluster cookie of the folder (`dir/cookie`), if it has one.
    pub cookie: Option<String>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            ca: self.ca.clone(),
            cookie: self.cookie.clone(),
        }
    }
}

impl Identity {
    /// Loads `dir/ca.crt`, `dir/NAME.crt`, `dir/NAME.key` and, when
    /// present, `dir/cookie`.
    pub fn load(dir: &Path, name: &str) -> Result<Self, CertError> {
        let certs = |path: PathBuf| -> Result<Vec<CertificateDer<'static>>, CertError> {
            let pem = |reason: String| CertError::Pem {
                path: path.clone(),
                what: "certificate",
                reason,
            };
            let bytes = std::fs::read(&path).map_err(|source| CertError::Io {
                path: path.clone(),
                source,
            })?;
            let list = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem(e.to_string()))?;
            if list.is_empty() {
                return Err(pem("no certificate in file".into()));
            }
            Ok(list)
        };
        let ca = certs(dir.join("ca.crt"))?;
        let chain = certs(dir.join(format!("{name}.crt")))?;
        let key_path = dir.join(format!("{name}.key"));
        let key_bytes = std::fs::read(&key_path).map_err(|source| CertError::Io {
            path: key_path.clone(),
            source,
        })?;
        let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| CertError::Pem {
            path: key_path,
            what: "private key",
            reason: e.to_string(),
        })?;
        Ok(Self {
            name: name.to_owned(),
            chain,
            key,
            ca,
            cookie: load_cookie(dir)?,
        })
    }
}

/// The DNS names a certificate is issued for (its subject alternative
/// names). Empty when the certificate cannot be parsed.
pub fn dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, parsed)) = X509Certificate::from_der(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-certs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn init_issue_and_load_round_trip() {
        let dir = tempdir("roundtrip");
        init_ca(&dir, "test-cluster").unwrap();
        issue(&dir, "n1", &dir).unwrap();
        let id = Identity::load(&dir, "n1").unwrap();
        assert_eq!(dns_names(&id.chain[0]), vec!["n1".to_owned()]);
        let admin = Identity::load(&dir, "admin").unwrap();
        assert_eq!(dns_names(&admin.chain[0]), vec!["admin".to_owned()]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for key in ["ca.key", "n1.key", "admin.key"] {
                let mode = std::fs::metadata(dir.join(key))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{key}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn init_writes_a_private_random_cookie_that_identities_load() {
        let (a, b) = (tempdir("cookie-a"), tempdir("cookie-b"));
        init_ca(&a, "c").unwrap();
        init_ca(&b, "c").unwrap();
        let cookie = load_cookie(&a).unwrap().expect("a cookie");
        assert_eq!(cookie.len(), 64);
        assert_ne!(Some(cookie.clone()), load_cookie(&b).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(a.join(COOKIE_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(
            Identity::load(&a, "admin").unwrap().cookie,
            Some(cookie.clone())
        );
        assert_ne!(cookie_digest(&cookie), cookie_digest("flotilla"));
        std::fs::write(a.join(COOKIE_FILE), "\n").unwrap();
        assert!(matches!(load_cookie(&a), Err(CertError::EmptyCookie(_))));
        std::fs::remove_file(a.join(COOKIE_FILE)).unwrap();
        assert_eq!(load_cookie(&a).unwrap(), None);
    }

    #[test]
    fn existing_files_are_not_overwritten() {
        let dir = tempdir("exists");
        init_ca(&dir, "c").unwrap();
        assert!(matches!(init_ca(&dir, "c"), Err(CertError::Exists(_))));
        issue(&dir, "n1", &dir).unwrap();
        assert!(matches!(issue(&dir, "n1", &dir), Err(CertError::Exists(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invalid_names_are_refused() {
        for bad in ["", "-a", "a b", "n1/../x", &"x".repeat(64)] {
            assert!(!valid_node_name(bad), "{bad:?}");
        }
        assert!(valid_node_name("worker-1.rack2"));
    }

    #[test]
    fn garbage_pem_is_a_typed_error_naming_the_file() {
        let dir = tempdir("garbage");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "not a pem").unwrap();
        let err = Identity::load(&dir, "n1").unwrap_err();
        assert!(err.to_string().contains("ca.crt"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
