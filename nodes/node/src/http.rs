//! The little HTTP/1.1 the node serves (`/metrics`, the dashboard): one
//! GET per connection, its head read within a limit of size and time,
//! answered and closed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest request head read.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request head.
const READ_WITHIN: Duration = Duration::from_secs(5);

/// A request's line, as far as it was understood.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// A GET of `path`, with its query string (without the `?`).
    Get {
        /// The path.
        path: String,
        /// The query string, `""` when none.
        query: String,
    },
    /// Another method.
    NotAllowed,
    /// Not an HTTP/1 request line.
    Malformed,
}

impl Request {
    /// Reads the request line of `head` (the bytes up to the blank line).
    pub(crate) fn parse(head: &[u8]) -> Self {
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let Ok(line) = std::str::from_utf8(line) else {
            return Self::Malformed;
        };
        let mut parts = line.trim_end_matches('\r').split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Self::Malformed;
        };
        if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
            return Self::Malformed;
        }
        if method != "GET" {
            return Self::NotAllowed;
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Self::Get {
            path: path.to_owned(),
            query: query.to_owned(),
        }
    }
}

/// The value of `key` in a query string `a=1&b=2` (percent-decoded), if
/// present.
pub(crate) fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Reads a request head: `None` when it is over the limit, too slow, or
/// the client went away.
pub(crate) async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Some(());
            }
            if head.len() > MAX_REQUEST {
                return None;
            }
        }
    };
    tokio::time::timeout(READ_WITHIN, read).await.ok()??;
    Some(Request::parse(&head))
}

/// An answer: its status line, type, extra headers and body.
pub(crate) struct Response {
    /// `200 OK`, `404 Not Found`…
    pub(crate) status: &'static str,
    /// Its content type.
    pub(crate) content_type: &'static str,
    /// Headers beside the type, length and `Connection: close`.
    pub(crate) headers: &'static [(&'static str, &'static str)],
    /// Its body.
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// A plain-text answer.
    pub(crate) fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: &[],
            body: body.into().into_bytes(),
        }
    }

    /// The answer to a request that is not a GET, or not a request.
    pub(crate) fn refusal(request: &Request) -> Self {
        match request {
            Request::NotAllowed => Self::text("405 Method Not Allowed", "only GET\n"),
            _ => Self::text("400 Bad Request", "malformed request\n"),
        }
    }

    /// Writes it to `stream` and closes it.
    pub(crate) async fn send(self, mut stream: TcpStream) -> std::io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        for (name, value) in self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&self.body).await?;
        stream.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_read_strictly() {
        assert_eq!(
            Request::parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Get {
                path: "/metrics".into(),
                query: String::new()
            }
        );
        assert_eq!(
            Request::parse(b"GET /api/jobs?page=2 HTTP/1.0\r\n\r\n"),
            Request::Get {
                path: "/api/jobs".into(),
                query: "page=2".into()
            }
        );
        assert_eq!(
            Request::parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::NotAllowed
        );
        assert_eq!(Request::parse(b"GET /metrics\r\n\r\n"), Request::Malformed);
        assert_eq!(
            Request::parse(b"GET /metrics SPDY/3\r\n\r\n"),
            Request::Malformed
        );
        assert_eq!(
            Request::parse(b"GET http://x/ HTTP/1.1\r\n\r\n"),
            Request::Malformed
        );
        assert_eq!(Request::parse(&[0xff, 0xfe, b'\n']), Request::Malformed);
        assert_eq!(Request::parse(b""), Request::Malformed);
    }

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(
            query_value("id=job-1%2D2&page=3", "id").as_deref(),
            Some("job-1-2")
        );
        assert_eq!(query_value("id=a&page=3", "page").as_deref(), Some("3"));
        assert_eq!(query_value("page", "page").as_deref(), Some(""));
        assert_eq!(query_value("", "id"), None);
    }
}
