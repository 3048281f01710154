//! An S3-compatible server on 127.0.0.1 (moto's `moto_server`, which
//! `scripts/fetch-test-tools` installs) for tests and benches that need an
//! object store with conditional writes: a head set's lease, object-store
//! inputs and outputs. Stopped when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket every server starts with.
pub const BUCKET: &str = "embeds";

/// A running server with the bucket [`BUCKET`].
pub struct S3Server {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl S3Server {
    /// Starts `program` (a `moto_server`) on a free port and waits until it
    /// answers and holds the bucket.
    pub fn start(program: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let server = Self { child, port };
        let start = Instant::now();
        while server
            .request("PUT", &format!("/{BUCKET}"))
            .is_none_or(|status| !status.contains(" 200"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "S3 test server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// One plain HTTP request; the status line, if any answer came.
    pub fn request(&self, method: &str, path: &str) -> Option<String> {
        self.response(method, path)
            .and_then(|r| r.lines().next().map(str::to_owned))
    }

    /// One plain HTTP request; the whole response, if any came.
    pub fn response(&self, method: &str, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// Stores `body` as `key` of the test bucket with a plain HTTP `PUT`;
    /// the status line, if any answer came.
    pub fn put(&self, key: &str, body: &[u8]) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(
            s,
            "PUT /{BUCKET}/{key} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        )
        .ok()?;
        s.write_all(body).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines().next().map(str::to_owned)
    }

    /// The environment a process reads the server's settings from
    /// (object_store's `AWS_*` variables).
    pub fn env(&self) -> [(&'static str, String); 5] {
        [
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
