//! Prometheus text exposition on `--metrics-port` (plain HTTP, one small
//! thread, loopback or the first `--bind` address). Only counters the
//! process keeps anyway; nothing here touches shards.

use super::Shared;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn render(shared: &Shared) -> String {
    let st = &shared.stats;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    };
    metric(
        "lavik_commands_processed_total",
        "counter",
        "Commands executed.",
        st.total_commands.load(Ordering::Relaxed),
    );
    metric(
        "lavik_connections_received_total",
        "counter",
        "Connections accepted.",
        st.total_connections.load(Ordering::Relaxed),
    );
    metric(
        "lavik_connections_rejected_total",
        "counter",
        "Connections refused (maxclients, protected mode).",
        st.rejected_connections.load(Ordering::Relaxed),
    );
    metric(
        "lavik_connected_clients",
        "gauge",
        "Clients connected now.",
        st.connected_clients.load(Ordering::Relaxed) as u64,
    );
    metric(
        "lavik_net_input_bytes_total",
        "counter",
        "Bytes received from clients.",
        st.net_input_bytes.load(Ordering::Relaxed),
    );
    metric(
        "lavik_net_output_bytes_total",
        "counter",
        "Bytes sent to clients.",
        st.net_output_bytes.load(Ordering::Relaxed),
    );
    metric(
        "lavik_instantaneous_ops_per_sec",
        "gauge",
        "Commands per second over the last 1.6 s.",
        st.instantaneous_ops.load(Ordering::Relaxed),
    );
    metric(
        "lavik_flush_failures_total",
        "counter",
        "Storage flushes that failed.",
        st.flush_failures.load(Ordering::Relaxed),
    );
    metric(
        "lavik_resident_memory_bytes",
        "gauge",
        "Resident set size.",
        super::local::rss_bytes(),
    );
    metric(
        "lavik_uptime_seconds",
        "gauge",
        "Seconds since start.",
        shared.start.elapsed().as_secs(),
    );
    out
}

/// Serves `GET /metrics` until shutdown. Errors only end one request.
pub fn serve(shared: Arc<Shared>, listener: std::net::TcpListener) {
    let _ = listener.set_nonblocking(true);
    while !shared.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let (status, body) = if req.starts_with("GET /metrics") || req.starts_with("GET / ")
                {
                    ("200 OK", render(&shared))
                } else {
                    ("404 Not Found", "not found\n".to_string())
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}
