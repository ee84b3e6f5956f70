//! `sluice why`: asks a running sluice's admin port `POST /why` and prints the answer for
//! people. A plain HTTP/1.1 request over TCP (the admin port speaks nothing else), one per
//! run, within a time-out.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long one question may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The `/why` body for one descriptor of `entries` (`key=value` each) in `domain`.
pub fn body(domain: &str, entries: &[String]) -> Result<String, String> {
    let entries = entries
        .iter()
        .map(|e| {
            let (k, v) = e
                .split_once('=')
                .ok_or_else(|| format!("{e:?} is not key=value"))?;
            Ok(json!({ "key": k, "value": v }))
        })
        .collect::<Result<Vec<Value>, String>>()?;
    Ok(json!({ "domain": domain, "descriptors": [{ "entries": entries }] }).to_string())
}

/// Asks `/why` with `body` (from [`body`]) on a runtime of its own: the answer for people
/// (or as it came, with `json`), or why there is none (`<status>: <reason>` when refused).
pub fn why(admin: &str, token: Option<&str>, body: &str, json: bool) -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (status, answer) = runtime.block_on(post(admin, "/why", token, body))?;
    if status != 200 {
        return Err(format!("{status}: {}", answer.trim()));
    }
    if json {
        return Ok(format!("{answer}\n"));
    }
    let why: Value =
        serde_json::from_str(&answer).map_err(|e| format!("not a /why answer ({e})"))?;
    Ok(render(&why))
}

/// `POST <path>` with `body` to the admin server at `admin` (`http://host:port` or
/// `host:port`); its status and body.
pub async fn post(
    admin: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Result<(u16, String), String> {
    let host = admin.strip_prefix("http://").unwrap_or(admin);
    if host.contains("://") {
        return Err(format!("{admin}: the admin port speaks plain http://"));
    }
    let host = host.split('/').next().unwrap_or(host);
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{auth}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut conn = TcpStream::connect(host).await?;
        conn.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Err(format!("{host}: {e}")),
        Err(_) => return Err(format!("{host}: no answer within {TIMEOUT:?}")),
    };
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{host}: not an HTTP answer"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{host}: not an HTTP answer"))?;
    Ok((status, body.to_owned()))
}

/// A `/why` answer for people.
pub fn render(why: &Value) -> String {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let mut out = format!(
        "domain {}: {} now ({} backend; nothing was charged)\n",
        s(&why["domain"]),
        s(&why["overall_code"]),
        s(&why["backend"]),
    );
    let descriptors = why["descriptors"].as_array().cloned().unwrap_or_default();
    for (i, d) in descriptors.iter().enumerate() {
        let entries: Vec<String> = d["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| format!("{}={}", s(&e["key"]), s(&e["value"])))
            .collect();
        let _ = writeln!(
            out,
            "descriptor {}: {} (cost {})",
            i + 1,
            entries.join(" "),
            s(&d["cost"])
        );
        let m = &d["match"];
        match m["rule"].as_object() {
            Some(rule) => {
                let at = rule.get("location").map(s).unwrap_or_default();
                let name = rule.get("name").map(s).unwrap_or_default();
                let _ = writeln!(out, "  rule {name} ({at}): {}", s(&m["reason"]));
            }
            None => {
                let _ = writeln!(out, "  no rule ({}): {}", s(&m["code"]), s(&m["reason"]));
            }
        }
        let _ = writeln!(
            out,
            "  applies: {}{}; denied on this replica: {} in the last minute, {} in the last hour",
            s(&d["applies"]),
            d["mode"]
                .as_str()
                .map_or_else(String::new, |m| format!(", mode {m}")),
            s(&d["denied"]["last_minute"]["cost"]),
            s(&d["denied"]["last_hour"]["cost"]),
        );
        for l in d["limits"].as_array().into_iter().flatten() {
            let (st, v) = (&l["state"], &l["verdict"]);
            let verdict = if v["admitted"] == true {
                format!("admits, {} left after it", s(&v["remaining"]))
            } else {
                format!("denies, retry in {}s", s(&v["reset_seconds"]))
            };
            let _ = writeln!(
                out,
                "  limit {} {}/{} x{} (burst {}, charge {}{}): remaining {}, reset in {}s{}; this request: {verdict}",
                s(&l["algorithm"]),
                s(&l["requests_per_unit"]),
                s(&l["unit"]).to_lowercase(),
                s(&l["unit_multiplier"]),
                s(&l["burst"]),
                s(&l["charge"]),
                if l["override"] == true {
                    ", client override"
                } else {
                    ""
                },
                s(&st["remaining"]),
                s(&st["reset_seconds"]),
                if st["in_debt"] == true {
                    " (in debt)"
                } else {
                    ""
                },
            );
            let leases = &st["leases"];
            if leases.is_object() {
                let here = &leases["here"];
                let _ = writeln!(
                    out,
                    "    leased: {} unit(s) out on lease by {} replica record(s) (counted as spent above); this replica holds {} of {}",
                    s(&leases["out"]),
                    leases["records"].as_array().map_or(0, Vec::len),
                    if here.is_object() {
                        s(&here["left"])
                    } else {
                        "0".to_owned()
                    },
                    if here.is_object() {
                        s(&here["units"])
                    } else {
                        "0".to_owned()
                    },
                );
            }
        }
    }
    out
}
