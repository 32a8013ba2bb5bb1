//! systemd's service notification protocol (`sd_notify(3)`), written with std alone.
//!
//! Under a `Type=notify` unit systemd passes `NOTIFY_SOCKET`: the path of a unix datagram
//! socket, or `@name` for one in the abstract namespace. A service tells it its state by
//! sending one datagram of `KEY=value` lines. lavik sends `READY=1` once recovery has
//! handed every worker its shards (clients get answers instead of `-LOADING`), and
//! `STOPPING=1` when it begins to shut down. Without the variable nothing is sent. A
//! failure to notify is logged by the caller and never stops the server: the protocol is
//! advisory, and systemd reports a service that never became ready on its own.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Sends `state` to `$NOTIFY_SOCKET`. `Ok(false)` when the variable is unset or empty.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os(NOTIFY_SOCKET_ENV) {
        Some(socket) if !socket.is_empty() => notify_to(&socket, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` (newline-separated `KEY=value` assignments) to the socket `socket` names.
pub fn notify_to(socket: &OsStr, state: &str) -> io::Result<()> {
    let bytes = socket.as_bytes();
    let sender = UnixDatagram::unbound()?;
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sender.send_to_addr(state.as_bytes(), &addr)?
    } else if bytes.first() == Some(&b'/') {
        sender.send_to(state.as_bytes(), socket)?
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{NOTIFY_SOCKET_ENV} must be an absolute path or @name, got '{}'",
                socket.to_string_lossy()
            ),
        ));
    };
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "notification datagram truncated",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    // A path socket receives the exact datagram, as systemd would read it.
    #[test]
    fn notifies_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("lavik-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        assert_eq!(recv(&sock), "READY=1\nSTATUS=serving");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // `@name` reaches a socket in the abstract namespace.
    #[test]
    fn notifies_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("lavik-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        assert_eq!(recv(&sock), "STOPPING=1");
    }

    // A relative name or a socket nobody listens on is an error, not a silent success.
    #[test]
    fn bad_targets_are_errors() {
        assert!(notify_to(OsStr::new("relative.sock"), "READY=1").is_err());
        let missing = std::env::temp_dir().join(format!("lavik-no-sock-{}", std::process::id()));
        assert!(notify_to(missing.as_os_str(), "READY=1").is_err());
    }
}
