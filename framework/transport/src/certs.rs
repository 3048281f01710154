//! The cluster certificate authority: creating it, issuing, renewing and
//! revoking certificates, and loading a node's identity.
//!
//! ```text
//! DIR/ca.crt            the cluster CA certificate (every node trusts it)
//! DIR/ca.key            the CA key (keep it off worker machines)
//! DIR/NAME.crt/.key     a certificate (SAN = NAME, its role in the subject's
//!                       organizational unit, valid for a year by default) and key, 0600
//! DIR/head.crt/.key     the head's certificate (role head), made by init
//! DIR/admin.crt/.key    the operator's certificate (role admin), made by init
//! DIR/cookie            the cluster cookie (random, 0600): nodes and tools
//!                       using the folder present it in every hello
//! DIR/issued.tsv        every certificate the CA issued: serial, name, role, expiry
//! DIR/revoked.tsv       the revoked ones: serial, name, when
//! DIR/crl.pem           the revocation list, signed by the CA, that the head
//!                       reads and hands to every member
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flotilla_proto::role::Role;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SerialNumber,
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
    /// The certificate to renew carries no role.
    #[error(
        "NODE-CERT-009: {0} carries no role; issue a new certificate with `node certs issue --role …`"
    )]
    NoRole(PathBuf),
    /// The CA never issued a certificate of that name.
    #[error(
        "NODE-CERT-010: the CA in {dir} issued no certificate named {name:?} (see {dir}/issued.tsv)"
    )]
    NotIssued {
        /// The CA folder.
        dir: PathBuf,
        /// The name asked for.
        name: String,
    },
    /// A revocation list that does not parse or is not signed by the CA.
    #[error("NODE-CERT-011: {path} is not a revocation list signed by the cluster CA: {reason}")]
    BadRevocationList {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A validity of zero days.
    #[error("NODE-CERT-012: a certificate must be valid for at least one day")]
    Validity,
}

/// Name of the cookie file in a certs folder.
pub const COOKIE_FILE: &str = "cookie";

/// Name of the revocation list in a certs folder.
pub const CRL_FILE: &str = "crl.pem";

/// How long node and operator certificates are valid unless told
/// otherwise: one year.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long the CA certificate is valid: ten years.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Index of every certificate the CA issued.
const ISSUED_FILE: &str = "issued.tsv";

/// Index of the revoked ones.
const REVOKED_FILE: &str = "revoked.tsv";

/// The digest of `cookie` that hellos carry.
pub fn cookie_digest(cookie: &str) -> flotilla_proto::hello::CookieDigest {
    use sha2::Digest;
    sha2::Sha256::digest(cookie.as_bytes()).into()
}

/// `n` random bytes from the system.
fn random_bytes<const N: usize>() -> Result<[u8; N], CertError> {
    let mut bytes = [0u8; N];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| CertError::Random)?;
    Ok(bytes)
}

/// A fresh random cookie: 32 random bytes, in hex.
fn random_cookie() -> Result<String, CertError> {
    Ok(random_bytes::<32>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
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

/// Seconds since the Unix epoch now.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `secs` after the Unix epoch, as rcgen takes times.
fn at(secs: u64) -> time::OffsetDateTime {
    rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(secs)
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
    let now = unix_now();
    p.not_before = at(now.saturating_sub(3600));
    p.not_after = at(now + CA_VALIDITY.as_secs());
    Ok(p)
}

fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    if path.exists() {
        return Err(CertError::Exists(path.to_path_buf()));
    }
    write_file(path, contents, private, true)
}

/// Writes `contents` to `path` (a new file when `new`, else through a
/// temporary file renamed over it), synced, 0600 when `private`.
fn write_file(path: &Path, contents: &str, private: bool, new: bool) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = if new {
        path.to_path_buf()
    } else {
        path.with_extension("partial")
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if new {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = opts.open(&target).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    if !new {
        std::fs::rename(&target, path).map_err(io)?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn append(path: &Path, line: &str) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    file.write_all(line.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Creates a new cluster CA in `dir` (`ca.crt`, `ca.key`), a random
/// cluster cookie (`cookie`, 0600), the head's certificate (`head_name`,
/// role head) and an `admin` certificate (role admin) for operators'
/// tools. Refuses to overwrite existing files.
pub fn init_ca(dir: &Path, cluster_name: &str, head_name: &str) -> Result<(), CertError> {
    if !valid_node_name(head_name) {
        return Err(CertError::InvalidName(head_name.to_owned()));
    }
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
    issue(dir, head_name, Role::Head, DEFAULT_VALIDITY, dir)?;
    issue(
        dir,
        flotilla_proto::hello::ADMIN_NAME,
        Role::Admin,
        DEFAULT_VALIDITY,
        dir,
    )
}

/// The CA of `ca_dir` as an issuer.
fn issuer(ca_dir: &Path) -> Result<Issuer<'static, KeyPair>, CertError> {
    let ca_key_path = ca_dir.join("ca.key");
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(|e| CertError::Pem {
        path: ca_key_path,
        what: "private key",
        reason: e.to_string(),
    })?;
    let ca_cert_path = ca_dir.join("ca.crt");
    Issuer::from_ca_cert_pem(&read(&ca_cert_path)?, ca_key).map_err(|e| CertError::Pem {
        path: ca_cert_path,
        what: "certificate",
        reason: e.to_string(),
    })
}

/// A new certificate and key for `name` of `role`, valid for `validity`
/// from now, recorded in the CA's index: the PEM texts.
fn make(
    ca_dir: &Path,
    name: &str,
    role: Role,
    validity: Duration,
) -> Result<(String, String), CertError> {
    if validity < Duration::from_secs(24 * 3600) {
        return Err(CertError::Validity);
    }
    let now = unix_now();
    // An hour of slack for clocks a little behind the CA's.
    make_between(
        ca_dir,
        name,
        role,
        now.saturating_sub(3600),
        now + validity.as_secs(),
    )
}

/// Issues a certificate valid from `not_before` to `not_after` (seconds
/// since the Unix epoch), whatever they are: a certificate that expired
/// already, or is not valid yet, for tests of how nodes refuse them.
/// Never reachable from the command line.
pub fn dangerous_issue_between(
    ca_dir: &Path,
    name: &str,
    role: Role,
    not_before: u64,
    not_after: u64,
    out_dir: &Path,
) -> Result<(), CertError> {
    tracing::warn!(%name, not_before, not_after, "issuing a certificate with a chosen validity window");
    let (cert_pem, key_pem) = make_between(ca_dir, name, role, not_before, not_after)?;
    write_new(&out_dir.join(format!("{name}.crt")), &cert_pem, false)?;
    write_new(&out_dir.join(format!("{name}.key")), &key_pem, true)
}

fn make_between(
    ca_dir: &Path,
    name: &str,
    role: Role,
    not_before: u64,
    not_after: u64,
) -> Result<(String, String), CertError> {
    if !valid_node_name(name) {
        return Err(CertError::InvalidName(name.to_owned()));
    }
    let issuer = issuer(ca_dir)?;
    let mut p = CertificateParams::new(vec![name.to_owned()]).map_err(gen_err)?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.distinguished_name
        .push(DnType::OrganizationalUnitName, role.certificate_marker());
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    // A positive serial of 16 random bytes whose first byte is not zero:
    // one encoding for it in certificates and revocation lists alike.
    let mut serial = random_bytes::<16>()?;
    serial[0] = (serial[0] & 0x7f) | 0x01;
    p.serial_number = Some(SerialNumber::from_slice(&serial));
    p.not_before = at(not_before);
    p.not_after = at(not_after);
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = p.signed_by(&key, &issuer).map_err(gen_err)?;
    append(
        &ca_dir.join(ISSUED_FILE),
        &format!("{}\t{name}\t{role}\t{not_after}\n", hex(&serial)),
    )?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Issues a certificate for `name` with `role`, signed by the CA in
/// `ca_dir`, valid for `validity`, written to `out_dir/NAME.crt` and
/// `out_dir/NAME.key` (0600). The certificate is valid for both sides of
/// mutual TLS, with `name` as its only DNS name.
pub fn issue(
    ca_dir: &Path,
    name: &str,
    role: Role,
    validity: Duration,
    out_dir: &Path,
) -> Result<(), CertError> {
    let (crt, key) = (
        out_dir.join(format!("{name}.crt")),
        out_dir.join(format!("{name}.key")),
    );
    for path in [&crt, &key] {
        if path.exists() {
            return Err(CertError::Exists(path.clone()));
        }
    }
    let (cert_pem, key_pem) = make(ca_dir, name, role, validity)?;
    std::fs::create_dir_all(out_dir).map_err(|source| CertError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    write_new(&crt, &cert_pem, false)?;
    write_new(&key, &key_pem, true)
}

/// Renews the certificate `dir/NAME.crt`: a new key and certificate of the
/// same name and role, valid for `validity` from now, replacing the files
/// (each through a rename, so a reader sees the old or the new one). The
/// old certificate stays valid until it expires or is revoked.
pub fn renew(ca_dir: &Path, name: &str, dir: &Path, validity: Duration) -> Result<Role, CertError> {
    let crt = dir.join(format!("{name}.crt"));
    let old = load_certs(&crt)?;
    let role = cert_info(&old[0])
        .and_then(|i| i.role)
        .ok_or_else(|| CertError::NoRole(crt.clone()))?;
    let (cert_pem, key_pem) = make(ca_dir, name, role, validity)?;
    write_file(&dir.join(format!("{name}.key")), &key_pem, true, false)?;
    write_file(&crt, &cert_pem, false, false)?;
    Ok(role)
}

/// Revokes every certificate the CA in `ca_dir` issued for `name`: they go
/// into `ca_dir/revoked.tsv` and a new revocation list, `ca_dir/crl.pem`,
/// signed by the CA. Returns how many were newly revoked.
pub fn revoke(ca_dir: &Path, name: &str) -> Result<usize, CertError> {
    let issued = read_index(&ca_dir.join(ISSUED_FILE))?;
    let serials: Vec<&str> = issued
        .iter()
        .filter(|f| f.get(1).map(String::as_str) == Some(name))
        .filter_map(|f| f.first().map(String::as_str))
        .collect();
    if serials.is_empty() {
        return Err(CertError::NotIssued {
            dir: ca_dir.to_path_buf(),
            name: name.to_owned(),
        });
    }
    let revoked_path = ca_dir.join(REVOKED_FILE);
    let revoked = read_index(&revoked_path)?;
    let mut added = 0;
    let now = unix_now();
    for serial in serials {
        if !revoked
            .iter()
            .any(|f| f.first().map(String::as_str) == Some(serial))
        {
            append(&revoked_path, &format!("{serial}\t{name}\t{now}\n"))?;
            added += 1;
        }
    }
    write_crl(ca_dir)?;
    Ok(added)
}

/// Writes `ca_dir/crl.pem` from `ca_dir/revoked.tsv`, numbered after the
/// list it replaces, valid for a year (nodes use the newest they have).
fn write_crl(ca_dir: &Path) -> Result<(), CertError> {
    let revoked = read_index(&ca_dir.join(REVOKED_FILE))?;
    let now = unix_now();
    let revoked_certs = revoked
        .iter()
        .filter_map(|f| {
            let serial = unhex(f.first()?)?;
            let when = f.get(2).and_then(|t| t.parse().ok()).unwrap_or(now);
            Some(RevokedCertParams {
                serial_number: SerialNumber::from_slice(&serial),
                revocation_time: at(when),
                reason_code: None,
                invalidity_date: None,
            })
        })
        .collect();
    let params = CertificateRevocationListParams {
        this_update: at(now),
        next_update: at(now + DEFAULT_VALIDITY.as_secs()),
        // Numbered by the time it was made: a later list has a larger number.
        crl_number: SerialNumber::from_slice(&now.to_be_bytes()),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params.signed_by(&issuer(ca_dir)?).map_err(gen_err)?;
    let pem = crl.pem().map_err(gen_err)?;
    write_file(&ca_dir.join(CRL_FILE), &pem, false, false)
}

/// The lines of a tab-separated index, split; none when it does not exist.
fn read_index(path: &Path) -> Result<Vec<Vec<String>>, CertError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CertError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The serial numbers a revocation list names, normalised (no leading
/// zero bytes), sorted.
pub type Revoked = Vec<Vec<u8>>;

/// Reads the revocation list at `path` and checks it is signed by one of
/// the `ca` certificates: the serials it revokes; `None` when the file does
/// not exist.
pub fn load_revocations(
    path: &Path,
    ca: &[CertificateDer<'_>],
) -> Result<Option<Revoked>, CertError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CertError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let bad = |reason: String| CertError::BadRevocationList {
        path: path.to_path_buf(),
        reason,
    };
    let der = rustls::pki_types::CertificateRevocationListDer::from_pem_slice(&bytes)
        .map_err(|e| bad(e.to_string()))?;
    revocations_from_der(der.as_ref(), ca)
        .map(Some)
        .map_err(bad)
}

/// The serials a DER revocation list names, once its signature checks
/// against one of the `ca` certificates.
pub fn revocations_from_der(der: &[u8], ca: &[CertificateDer<'_>]) -> Result<Revoked, String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, crl) = x509_parser::parse_x509_crl(der).map_err(|e| e.to_string())?;
    let signed = ca.iter().any(|c| {
        X509Certificate::from_der(c.as_ref())
            .is_ok_and(|(_, ca)| crl.verify_signature(ca.public_key()).is_ok())
    });
    if !signed {
        return Err("its signature does not check against the cluster CA".into());
    }
    let mut serials: Revoked = crl
        .iter_revoked_certificates()
        .map(|r| normalise(r.raw_serial()))
        .collect();
    serials.sort();
    serials.dedup();
    Ok(serials)
}

fn normalise(serial: &[u8]) -> Vec<u8> {
    let start = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
    serial[start..].to_vec()
}

/// What a certificate says of its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Its first DNS name.
    pub name: String,
    /// Its role, if it carries one.
    pub role: Option<Role>,
    /// Its serial number, normalised (no leading zero bytes).
    pub serial: Vec<u8>,
    /// When it expires, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// What `cert` says of its holder; `None` when it cannot be parsed or
/// carries no DNS name.
pub fn cert_info(cert: &CertificateDer<'_>) -> Option<CertInfo> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).ok()?;
    let name = parsed
        .subject_alternative_name()
        .ok()
        .flatten()?
        .value
        .general_names
        .iter()
        .find_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })?;
    let role = parsed
        .subject()
        .iter_organizational_unit()
        .filter_map(|a| a.as_str().ok())
        .find_map(Role::from_certificate_marker);
    Some(CertInfo {
        name,
        role,
        serial: normalise(parsed.raw_serial()),
        not_after: parsed.validity().not_after.timestamp(),
    })
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let pem = |reason: String| CertError::Pem {
        path: path.to_path_buf(),
        what: "certificate",
        reason,
    };
    let bytes = std::fs::read(path).map_err(|source| CertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let list = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if list.is_empty() {
        return Err(pem("no certificate in file".into()));
    }
    Ok(list)
}

/// A node's TLS identity: its certificate chain and key, and the cluster CA.
#[derive(Debug)]
pub struct Identity {
    /// The name in the certificate.
    pub name: String,
    /// The role the certificate carries, if any.
    pub role: Option<Role>,
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
            role: self.role,
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
        let ca = load_certs(&dir.join("ca.crt"))?;
        let chain = load_certs(&dir.join(format!("{name}.crt")))?;
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
        let role = cert_info(&chain[0]).and_then(|i| i.role);
        Ok(Self {
            name: name.to_owned(),
            role,
            chain,
            key,
            ca,
            cookie: load_cookie(dir)?,
        })
    }

    /// A key derived from the node's private key for `purpose`: the same
    /// for every start of the node with these certificates, unknown to
    /// anyone without the key (what the head seals placement-group records
    /// with).
    pub fn derived_key(&self, purpose: &str) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"flotilla derived key\0");
        h.update(purpose.as_bytes());
        h.update([0]);
        h.update(self.key.secret_der());
        h.finalize().into()
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
        init_ca(&dir, "test-cluster", "head").unwrap();
        issue(&dir, "n1", Role::Worker, DEFAULT_VALIDITY, &dir).unwrap();
        let id = Identity::load(&dir, "n1").unwrap();
        assert_eq!(dns_names(&id.chain[0]), vec!["n1".to_owned()]);
        assert_eq!(id.role, Some(Role::Worker));
        let admin = Identity::load(&dir, "admin").unwrap();
        assert_eq!(dns_names(&admin.chain[0]), vec!["admin".to_owned()]);
        assert_eq!(admin.role, Some(Role::Admin));
        assert_eq!(Identity::load(&dir, "head").unwrap().role, Some(Role::Head));
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
        init_ca(&a, "c", "head").unwrap();
        init_ca(&b, "c", "head").unwrap();
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
        init_ca(&dir, "c", "head").unwrap();
        assert!(matches!(
            init_ca(&dir, "c", "head"),
            Err(CertError::Exists(_))
        ));
        issue(&dir, "n1", Role::Worker, DEFAULT_VALIDITY, &dir).unwrap();
        assert!(matches!(
            issue(&dir, "n1", Role::Worker, DEFAULT_VALIDITY, &dir),
            Err(CertError::Exists(_))
        ));
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

    #[test]
    fn certificates_expire_after_their_validity_and_renew_keeps_the_role() {
        let dir = tempdir("expiry");
        init_ca(&dir, "c", "head").unwrap();
        let day = Duration::from_secs(24 * 3600);
        issue(&dir, "d1", Role::Driver, day * 30, &dir).unwrap();
        let info = cert_info(&Identity::load(&dir, "d1").unwrap().chain[0]).unwrap();
        let in_30_days = unix_now() as i64 + 30 * 24 * 3600;
        assert!((info.not_after - in_30_days).abs() < 5, "{info:?}");
        assert_eq!(info.role, Some(Role::Driver));
        assert!(matches!(
            issue(&dir, "d2", Role::Driver, Duration::from_secs(60), &dir),
            Err(CertError::Validity)
        ));
        let before = Identity::load(&dir, "d1").unwrap();
        assert_eq!(renew(&dir, "d1", &dir, day * 400).unwrap(), Role::Driver);
        let after = Identity::load(&dir, "d1").unwrap();
        let renewed = cert_info(&after.chain[0]).unwrap();
        assert_ne!(renewed.serial, info.serial);
        assert!(renewed.not_after > info.not_after + 300 * 24 * 3600);
        assert_ne!(before.key.secret_der(), after.key.secret_der(), "a new key");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn revoked_certificates_are_in_the_signed_list_and_a_forged_list_is_refused() {
        let dir = tempdir("revoke");
        init_ca(&dir, "c", "head").unwrap();
        issue(&dir, "w1", Role::Worker, DEFAULT_VALIDITY, &dir).unwrap();
        issue(&dir, "w2", Role::Worker, DEFAULT_VALIDITY, &dir).unwrap();
        let ca = Identity::load(&dir, "w1").unwrap().ca;
        assert_eq!(load_revocations(&dir.join(CRL_FILE), &ca).unwrap(), None);
        let w1 = cert_info(&Identity::load(&dir, "w1").unwrap().chain[0]).unwrap();
        renew(&dir, "w1", &dir, DEFAULT_VALIDITY).unwrap();
        let w1b = cert_info(&Identity::load(&dir, "w1").unwrap().chain[0]).unwrap();
        assert_eq!(revoke(&dir, "w1").unwrap(), 2, "both of w1's certificates");
        assert_eq!(revoke(&dir, "w1").unwrap(), 0, "once");
        let revoked = load_revocations(&dir.join(CRL_FILE), &ca).unwrap().unwrap();
        assert!(revoked.contains(&w1.serial) && revoked.contains(&w1b.serial));
        let w2 = cert_info(&Identity::load(&dir, "w2").unwrap().chain[0]).unwrap();
        assert!(!revoked.contains(&w2.serial));
        assert!(matches!(
            revoke(&dir, "nobody"),
            Err(CertError::NotIssued { .. })
        ));
        // A list signed by another CA is refused.
        let other = tempdir("revoke-other");
        init_ca(&other, "c", "head").unwrap();
        issue(&other, "w1", Role::Worker, DEFAULT_VALIDITY, &other).unwrap();
        revoke(&other, "w1").unwrap();
        assert!(matches!(
            load_revocations(&other.join(CRL_FILE), &ca),
            Err(CertError::BadRevocationList { .. })
        ));
        std::fs::write(dir.join(CRL_FILE), "junk").unwrap();
        assert!(matches!(
            load_revocations(&dir.join(CRL_FILE), &ca),
            Err(CertError::BadRevocationList { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }
}
