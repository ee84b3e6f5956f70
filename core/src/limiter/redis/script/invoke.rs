//! A call sent: by function or by script, loading what Redis lacks and going back to the
//! script when Redis refuses functions.

use super::*;

/// Runs a call. By function: `FCALL`; on `Function not found`, `FUNCTION LOAD` and `FCALL`
/// again; when Redis refuses functions, the call goes to the script and so do the limiter's
/// next ones (`functions`). By script: `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL`.
pub async fn invoke<C: ConnectionLike + Send>(
    conn: &mut C,
    call: &Call,
    functions: &Functions,
) -> redis::RedisResult<Value> {
    if call.via == Via::Script {
        return by_script(conn, &call.cmd).await;
    }
    match send(conn, &call.cmd).await {
        Err(e) if function_missing(&e) => match send(conn, &load_library()).await {
            Ok(_) => match send(conn, &call.cmd).await {
                // Still missing: loaded, but not on this call's node (a Cluster changing
                // under us). The script answers this once.
                Err(e) if function_missing(&e) => {}
                other => return other,
            },
            Err(e) if load_refused(&e) => functions.refused(&e),
            Err(e) => return Err(e),
        },
        Err(e) if command_refused(&e) => functions.refused(&e),
        other => return other,
    }
    by_script(conn, &with_head(&call.cmd, "EVALSHA", &SHA)).await
}

/// `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL` (which caches the script).
async fn by_script<C: ConnectionLike + Send>(
    conn: &mut C,
    evalsha: &Cmd,
) -> redis::RedisResult<Value> {
    match send(conn, evalsha).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            send(conn, &with_head(evalsha, "EVAL", &SOURCE)).await
        }
        other => other,
    }
}

/// `FUNCTION LOAD REPLACE` of the library (on every master of a Cluster).
fn load_library() -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(LIBRARY.source.as_str());
    cmd
}

/// The answer to an `FCALL` of a function the server does not have.
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// The answer to a command this server does not know or does not let this user run (an
/// `FCALL` to a Redis before 7.0, or an ACL without it).
fn command_refused(e: &RedisError) -> bool {
    const UNKNOWN: &str = "unknown command";
    e.code() == Some("NOPERM")
        || (e.code() == Some("ERR")
            && e.detail()
                .and_then(|d| d.get(..UNKNOWN.len()))
                .is_some_and(|d| d.eq_ignore_ascii_case(UNKNOWN)))
}

/// A failed `FUNCTION LOAD` that loading again would not fix: the command refused
/// (`NOPERM`, or `ERR unknown command`), or the library refused (any other `ERR`). Not a
/// time-out, a lost connection, or a busy, loading or read-only server.
fn load_refused(e: &RedisError) -> bool {
    matches!(e.code(), Some("ERR" | "NOPERM"))
}

/// The same keys and arguments as `cmd`, after another command name and first argument
/// (`EVALSHA <sha>` or `EVAL <source>` in place of `FCALL <name>` or `EVALSHA <sha>`).
fn with_head(cmd: &Cmd, name: &str, first: &str) -> Cmd {
    let mut out = redis::cmd(name);
    out.arg(first);
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            out.arg(bytes);
        }
    }
    out
}

/// Sends one command; an error reply becomes an error.
async fn send<C: ConnectionLike + Send>(conn: &mut C, cmd: &Cmd) -> redis::RedisResult<Value> {
    match conn.req_packed_command(cmd).await? {
        error @ Value::ServerError(_) => error.extract_error(),
        reply => Ok(reply),
    }
}
