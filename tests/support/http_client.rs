//! A minimal HTTP/1.1 client for tests that talk to Envoy: one request per connection, extra
//! request headers, the answer's status, headers (lower-cased names) and body.

#![allow(dead_code)]

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

/// `GET path` with `headers`; panics if there is no complete answer within 10 s.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    match tokio::time::timeout(Duration::from_secs(10), exchange(addr, path, headers)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("GET http://{addr}{path}: {e}"),
        Err(_) => panic!("GET http://{addr}{path}: no answer within 10 s"),
    }
}

/// The same, `None` when the connection fails or the answer is incomplete (for polling).
pub async fn try_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    tokio::time::timeout(Duration::from_secs(2), exchange(addr, path, headers))
        .await
        .ok()?
        .ok()
}

async fn exchange(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&String::from_utf8_lossy(&raw))
        .ok_or_else(|| std::io::Error::other(format!("an incomplete answer: {raw:?}")))
}

fn parse(raw: &str) -> Option<Answer> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}
