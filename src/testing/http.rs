//! A minimal HTTP/1.1 client for tests (the admin server, Envoy, the upstream stub): one
//! request per connection, extra request headers, the answer's status, headers (lower-cased
//! names) and body (chunked bodies joined).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An answer: status code, headers (lower-cased names) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The value of header `name` (lower case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, &[], "").await
}

/// `GET path` with extra request `headers`.
pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    request(addr, "GET", path, headers, "").await
}

/// `POST path` with a JSON `body`.
pub async fn post(addr: SocketAddr, path: &str, body: &str) -> Answer {
    let json = [("content-type", "application/json")];
    request(addr, "POST", path, &json, body).await
}

/// `GET path`, `None` when the connection fails or the answer is incomplete within 2 s (for
/// polling).
pub async fn try_get(addr: SocketAddr, path: &str) -> Option<Answer> {
    let exchange = exchange(addr, "GET", path, &[], "");
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()?
        .ok()
}

/// Waits up to 20 s until `GET path` answers 200 (a starting process's health endpoint);
/// panics naming `what` otherwise.
pub async fn until_ok(addr: SocketAddr, path: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while try_get(addr, path).await.is_none_or(|a| a.status != 200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {path} on {addr} did not answer 200 within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Any request; panics if there is no complete answer within 10 s.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let exchange = exchange(addr, method, path, headers, body);
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("{method} http://{addr}{path}: {e}"),
        Err(_) => panic!("{method} http://{addr}{path}: no answer within 10 s"),
    }
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Answer> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw)
        .map_err(|e| std::io::Error::other(format!("an answer that is not UTF-8: {e}")))?;
    parse(&text).ok_or_else(|| std::io::Error::other(format!("an incomplete answer: {text:?}")))
}

fn parse(raw: &str) -> Option<Answer> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            break;
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
    Some(out)
}

/// The value of one sample in a metrics text, e.g.
/// `sample(text, "sluice_requests_total", &[("result", "ok")])`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let series = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{}}}", labels.join(","))
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}
