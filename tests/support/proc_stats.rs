//! Memory and liveness of processes, read from `/proc` (Linux).

#![allow(dead_code)]

/// Resident set size of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss(pid: u32) -> u64 {
    status_field(pid, "VmRSS:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no VmRSS for process {pid}"))
}

/// Resident set size of this process in bytes.
pub fn own_rss() -> u64 {
    rss(std::process::id())
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    status_field(pid, "State:").is_some_and(|s| !s.starts_with('Z'))
}

fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_owned())
}
