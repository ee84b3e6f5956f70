//! Just enough of the Chrome DevTools Protocol to drive a page of a real headless Chromium:
//! evaluate a script in it (and wait for its promise), and take a screenshot. Chromium is
//! started with `--remote-debugging-port=0` and writes its port to `DevToolsActivePort` in
//! its profile; the page's WebSocket is spoken here directly (text frames, a zero mask: only
//! what a client on loopback needs), so that no WebSocket crate is needed for one test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// A headless Chromium with one page, killed when dropped.
pub(crate) struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: TcpStream,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Chromium (`program`) showing `url` in a window of `size` (`"1280,900"`).
    pub(crate) async fn open(program: &Path, url: &str, size: &str) -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let child = Command::new(program)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={size}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
        let port = active_port(profile.path()).await;
        let page = page_socket(port).await;
        let ws = connect(port, &page).await;
        Browser {
            child,
            _profile: profile,
            ws,
            next_id: 0,
        }
    }

    /// Sends one command and returns its `result` (events before it are skipped).
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({ "id": id, "method": method, "params": params }).to_string();
        send(&mut self.ws, text.as_bytes()).await;
        let read = async {
            loop {
                let message: Value = serde_json::from_slice(&receive(&mut self.ws).await)
                    .expect("DevTools sends JSON");
                if message["id"] == id {
                    return message;
                }
            }
        };
        let message = tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .unwrap_or_else(|_| panic!("no answer to {method} within 20 s"));
        assert!(message.get("error").is_none(), "{method}: {message}");
        message["result"].clone()
    }

    /// The value of `expression` in the page (a promise is awaited); panics on an exception.
    pub(crate) async fn eval(&mut self, expression: &str) -> Value {
        let params =
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true });
        let result = self.call("Runtime.evaluate", params).await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Waits (at most 10 s) until `expression` is true in the page.
    pub(crate) async fn wait_for(&mut self, expression: &str) {
        let start = tokio::time::Instant::now();
        while self.eval(&format!("!!({expression})")).await != json!(true) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "not within 10 s: {expression}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A PNG of the page as shown, also written to `file`.
    pub(crate) async fn screenshot(&mut self, file: &Path) -> Vec<u8> {
        let result = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64(result["data"].as_str().expect("PNG data"));
        std::fs::write(file, &png).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        png
    }
}

/// The DevTools port, once Chromium wrote it (at most 20 s).
async fn active_port(profile: &Path) -> u16 {
    let file = profile.join("DevToolsActivePort");
    let start = tokio::time::Instant::now();
    loop {
        let port = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()));
        if let Some(port) = port {
            return port;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "chromium wrote no DevToolsActivePort"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The path of the page's WebSocket, from `/json/list`.
async fn page_socket(port: u16) -> String {
    let start = tokio::time::Instant::now();
    loop {
        let path = list(port).await.and_then(|v| {
            v.as_array()?
                .iter()
                .find(|t| t["type"] == "page")?
                .get("webSocketDebuggerUrl")?
                .as_str()
                .and_then(|u| u.split_once("/devtools/"))
                .map(|(_, p)| format!("/devtools/{p}"))
        });
        if let Some(path) = path {
            return path;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "chromium lists no page"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// DevTools' `/json/list` (HTTP/1.1; it keeps the connection open, so the body is read by
/// its length).
async fn list(port: u16) -> Option<Value> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let ask = format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    conn.write_all(ask.as_bytes()).await.ok()?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(conn.read_u8().await.ok()?);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse::<usize>()
        .ok()?;
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await.ok()?;
    serde_json::from_slice(&body).ok()
}

async fn connect(port: u16, path: &str) -> TcpStream {
    let mut ws = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to DevTools");
    let upgrade = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: c2x1aWNlLXVpLXRlc3QhIQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    ws.write_all(upgrade.as_bytes())
        .await
        .expect("send upgrade");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(ws.read_u8().await.expect("the upgrade answer"));
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    ws
}

/// One text frame, masked with a zero key (a client must mask; any key will do).
async fn send(ws: &mut TcpStream, payload: &[u8]) {
    let mut frame = vec![0x81];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= 0xffff => {
            frame.push(0x80 | 126);
            frame.extend((n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend((n as u64).to_be_bytes());
        }
    }
    frame.extend([0; 4]);
    frame.extend(payload);
    ws.write_all(&frame).await.expect("send a frame");
}

/// One whole message (continuation frames joined; pings skipped).
async fn receive(ws: &mut TcpStream) -> Vec<u8> {
    let mut message = Vec::new();
    loop {
        let b0 = ws.read_u8().await.expect("a frame");
        let b1 = ws.read_u8().await.expect("a frame");
        let len = match b1 & 0x7f {
            126 => u64::from(ws.read_u16().await.expect("a length")),
            127 => ws.read_u64().await.expect("a length"),
            n => u64::from(n),
        };
        let mut mask = [0; 4];
        if b1 & 0x80 != 0 {
            ws.read_exact(&mut mask).await.expect("a mask");
        }
        let mut payload = vec![0; usize::try_from(len).expect("a frame that fits")];
        ws.read_exact(&mut payload).await.expect("a payload");
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        let opcode = b0 & 0x0f;
        if matches!(opcode, 0x0..=0x2) {
            message.extend(payload);
            if b0 & 0x80 != 0 {
                return message;
            }
        }
        assert_ne!(opcode, 0x8, "DevTools closed the connection");
    }
}

/// Standard base64, padded.
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(value(c)) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend(&bytes[1..chunk.len()]);
    }
    out
}
