//! statsd over TCP, as envoyproxy/ratelimit sends it: one persistent connection carrying
//! newline-terminated lines.
//!
//! Each flush appends its lines to a bounded buffer ([`MAX_PENDING`] bytes; lines beyond it
//! are dropped and counted), then writes as much of the buffer as the connection takes
//! within [`WRITE_TIMEOUT`]. A connection that the server closed (seen as end-of-file, since
//! a statsd server never writes), that fails or that times out is dropped; the next flush
//! reconnects once the backoff ([`BACKOFF_MIN`], doubling up to [`BACKOFF_MAX`]) has passed,
//! and sends what waited. A line cut by a failed write is not resent in part: its rest is
//! skipped, so the new connection starts on a line boundary.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The most bytes waiting for the connection.
pub(super) const MAX_PENDING: usize = 1 << 20;
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one flush may spend writing.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The connection, the lines waiting for it, and when to try connecting again.
pub(super) struct TcpSender {
    target: String,
    stream: Option<TcpStream>,
    pending: Vec<u8>,
    /// The first pending bytes are the rest of a line partly written on a lost connection.
    cut: bool,
    next_attempt: Instant,
    backoff: Duration,
    /// The current outage was logged.
    down_logged: bool,
}

impl TcpSender {
    pub(super) fn new(target: String) -> TcpSender {
        TcpSender {
            target,
            stream: None,
            pending: Vec::new(),
            cut: false,
            next_attempt: Instant::now(),
            backoff: BACKOFF_MIN,
            down_logged: false,
        }
    }

    /// Queues `lines` and sends what the connection takes; returns how many lines were
    /// dropped because the buffer was full.
    pub(super) async fn send(&mut self, lines: &[String]) -> u64 {
        let dropped = self.queue(lines);
        if self.stream.as_ref().is_some_and(closed) {
            self.lost("closed by the server");
        }
        if self.stream.is_none() && Instant::now() >= self.next_attempt {
            self.connect().await;
        }
        if self.stream.is_some() && !self.pending.is_empty() {
            self.write().await;
        }
        dropped
    }

    /// Appends whole lines while they fit; returns how many did not.
    fn queue(&mut self, lines: &[String]) -> u64 {
        let mut dropped = 0;
        for line in lines {
            if self.pending.len() + line.len() + 1 > MAX_PENDING {
                dropped += 1;
                continue;
            }
            self.pending.extend_from_slice(line.as_bytes());
            self.pending.push(b'\n');
        }
        dropped
    }

    async fn connect(&mut self) {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.target));
        match attempt.await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                tracing::info!(target = %self.target, "statsd: connected over TCP");
                self.stream = Some(stream);
                self.backoff = BACKOFF_MIN;
                self.down_logged = false;
                if self.cut {
                    let rest = self.pending.iter().position(|b| *b == b'\n');
                    self.pending
                        .drain(..rest.map_or(self.pending.len(), |i| i + 1));
                    self.cut = false;
                }
            }
            Ok(Err(e)) => self.failed(&e.to_string()),
            Err(_) => self.failed("connection timed out"),
        }
    }

    async fn write(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let pending = &mut self.pending;
        let cut = &mut self.cut;
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            while !pending.is_empty() {
                let n = stream.write(pending).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                *cut = pending[n - 1] != b'\n';
                pending.drain(..n);
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.lost(&e.to_string()),
            Err(_) => self.lost("write timed out"),
        }
    }

    fn lost(&mut self, why: &str) {
        tracing::warn!(target = %self.target, "statsd: TCP connection lost: {why}");
        self.stream = None;
        self.down_logged = true;
        self.next_attempt = Instant::now();
    }

    fn failed(&mut self, why: &str) {
        if !self.down_logged {
            tracing::warn!(target = %self.target, "statsd: cannot connect over TCP: {why} (retrying with backoff)");
            self.down_logged = true;
        }
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

/// The server closed the connection (or it broke): a statsd server never writes, so a
/// readable socket means end-of-file or an error.
fn closed(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    #[test]
    fn the_buffer_is_bounded_by_whole_lines() {
        let mut s = TcpSender::new("127.0.0.1:1".into());
        let line = "x".repeat(1000);
        let lines = vec![line; MAX_PENDING / 1000 + 10];
        let dropped = s.queue(&lines);
        assert!(s.pending.len() <= MAX_PENDING);
        assert_eq!(s.pending.len() % 1001, 0, "whole lines only");
        assert_eq!(dropped as usize, lines.len() - s.pending.len() / 1001);
        assert!(dropped > 0);
    }

    #[tokio::test]
    async fn lines_wait_for_the_server_and_a_cut_line_is_not_resent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut s = TcpSender::new(addr);
        assert_eq!(s.send(&["a:1|c".into(), "b:2|c".into()]).await, 0);
        let (conn, _) = listener.accept().await.unwrap();
        let mut reader = tokio::io::BufReader::new(conn).lines();
        assert_eq!(reader.next_line().await.unwrap().as_deref(), Some("a:1|c"));
        assert_eq!(reader.next_line().await.unwrap().as_deref(), Some("b:2|c"));
        // A line cut by a lost connection: its rest is skipped on the next one.
        s.pending.extend_from_slice(b"rest-of-cut|c\nc:3|c\n");
        s.cut = true;
        s.stream = None;
        s.send(&[]).await;
        let (conn, _) = listener.accept().await.unwrap();
        let mut reader = tokio::io::BufReader::new(conn).lines();
        assert_eq!(reader.next_line().await.unwrap().as_deref(), Some("c:3|c"));
    }
}
