//! TLS for client connections (rustls), driven by the worker's loop.
//!
//! What it owns: the server's TLS context (certificate, key, trusted CAs, versions,
//! suites, client-certificate policy) built from the `tls-*` settings, and one
//! [`TlsSession`] per connection accepted on the `--tls-port` listener.
//!
//! Sans-IO: a session never touches the socket. The worker hands it the ciphertext its
//! ring received ([`TlsSession::receive`] appends the plaintext to the connection's input
//! buffer) and, when the connection's previous send has completed, asks it to encrypt the
//! connection's pending replies into the connection's send buffer ([`TlsSession::seal`]);
//! handshake messages and alerts leave the same way. So the handshake and record
//! processing run inside the worker's loop on the bytes the ring delivers, and nothing
//! ever blocks on a socket.
//!
//! Invariants: a session that failed (bad handshake, bad record, refused certificate)
//! yields no more plaintext and accepts no more replies; its last alert is still sent,
//! then the worker closes the connection. Replies reach the session only after group
//! commit released them (`gate_replies` runs first), so TLS changes no durability rule.
//!
//! Reloading: CONFIG SET of a `tls-*` parameter builds a whole new context; on success
//! it replaces the old one for connections accepted afterwards (sessions in progress keep
//! the context they started with, as in Redis), on failure the old one stays.
//!
//! Deliberately missing: TLS on the DPDK userspace stack, TLS 1.0/1.1 (rustls has
//! neither), encrypted private keys (`tls-key-file-pass`), DH parameter files (rustls
//! uses ECDHE only), `tls-replication`/`tls-cluster` (no replication or cluster bus),
//! OpenSSL cipher-string expressions such as `HIGH:!aNULL` (only suite names).

use super::conn::Conn;
use crate::config::tls::{AuthClients, TlsSettings};
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig, ServerConnection, SupportedCipherSuite};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, RwLock};

/// TLS 1.3 session tickets sent after a handshake when session caching is on (each is a
/// key into the server's session cache; clients use one per resumption).
const TLS13_TICKETS_PER_HANDSHAKE: usize = 2;

/// The TLS context of the server: the settings in force and the rustls configuration
/// new connections get.
pub struct TlsContext {
    /// The TLS listener's port (0: none), fixed for the process.
    port: u16,
    /// Settings as CONFIG GET shows them; changed only by a successful [`apply`].
    ///
    /// [`apply`]: TlsContext::apply
    settings: Mutex<TlsSettings>,
    /// The configuration for new connections (`None` when there is no TLS port).
    config: RwLock<Option<Arc<ServerConfig>>>,
}

impl TlsContext {
    /// Builds the context at start; with a TLS port the files must load.
    pub fn new(settings: &TlsSettings) -> Result<TlsContext, String> {
        let config = if settings.port != 0 {
            Some(build_config(settings)?)
        } else {
            None
        };
        Ok(TlsContext {
            port: settings.port,
            settings: Mutex::new(settings.clone()),
            config: RwLock::new(config),
        })
    }

    /// The TLS listener's port (0: none).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn settings(&self) -> TlsSettings {
        self.settings.lock().expect("tls settings lock").clone()
    }

    /// Replaces the settings, rebuilding the configuration when TLS is on: on error
    /// nothing changes (connections keep getting the old context).
    pub fn apply(&self, mut new: TlsSettings) -> Result<(), String> {
        new.port = self.port;
        let mut settings = self.settings.lock().expect("tls settings lock");
        if new.port != 0 {
            let config = build_config(&new)?;
            *self.config.write().expect("tls config lock") = Some(config);
        }
        *settings = new;
        Ok(())
    }

    /// A session for a connection accepted on the TLS port, or why there is none.
    pub fn accept(&self) -> Result<Box<TlsSession>, String> {
        let config = self
            .config
            .read()
            .expect("tls config lock")
            .clone()
            .ok_or_else(|| "no TLS context".to_string())?;
        TlsSession::new(config)
    }
}

/// Builds a rustls server configuration from the settings (loads every file).
pub fn build_config(s: &TlsSettings) -> Result<Arc<ServerConfig>, String> {
    if s.cert_file.is_empty() {
        return Err("no tls-cert-file configured".into());
    }
    if s.key_file.is_empty() {
        return Err("no tls-key-file configured".into());
    }
    let certs = load_certs(&s.cert_file)?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", s.cert_file));
    }
    let key = PrivateKeyDer::from_pem_file(&s.key_file)
        .map_err(|e| format!("{}: cannot load private key: {e}", s.key_file))?;
    let provider = Arc::new(provider(s)?);
    let versions = protocol_versions(&s.protocols)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls-protocols/tls-ciphers: {e}"))?;
    let builder = match s.auth_clients {
        AuthClients::No => builder.with_no_client_auth(),
        auth => {
            let roots = Arc::new(load_roots(s)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = if auth == AuthClients::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("client certificate verifier: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} / {}: {e}", s.cert_file, s.key_file))?;
    config.ignore_client_order = s.prefer_server_ciphers;
    if s.session_caching && s.session_cache_size > 0 {
        config.session_storage = ServerSessionMemoryCache::new(s.session_cache_size);
        config.send_tls13_tickets = TLS13_TICKETS_PER_HANDSHAKE;
    } else {
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    Ok(Arc::new(config))
}

fn load_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{path}: cannot read certificates: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path}: bad certificate: {e}"))
}

/// The CAs client certificates must chain to: the file's and every certificate in the
/// directory's files (files with none are skipped, as OpenSSL's hashed-name directories
/// hold other files too).
fn load_roots(s: &TlsSettings) -> Result<RootCertStore, String> {
    if s.ca_cert_file.is_empty() && s.ca_cert_dir.is_empty() {
        return Err(
            "tls-auth-clients is yes or optional: set tls-ca-cert-file or tls-ca-cert-dir".into(),
        );
    }
    let mut roots = RootCertStore::empty();
    let mut add = |certs: Vec<CertificateDer<'static>>, from: &str| -> Result<(), String> {
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("{from}: unusable CA certificate: {e}"))?;
        }
        Ok(())
    };
    if !s.ca_cert_file.is_empty() {
        let certs = load_certs(&s.ca_cert_file)?;
        if certs.is_empty() {
            return Err(format!("{}: no CA certificate found", s.ca_cert_file));
        }
        add(certs, &s.ca_cert_file)?;
    }
    if !s.ca_cert_dir.is_empty() {
        let dir = std::fs::read_dir(&s.ca_cert_dir)
            .map_err(|e| format!("{}: cannot read directory: {e}", s.ca_cert_dir))?;
        let mut paths: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths.iter().filter(|p| p.is_file()) {
            let name = p.display().to_string();
            if let Ok(certs) = load_certs(&name) {
                add(certs, &name)?;
            }
        }
    }
    if roots.is_empty() {
        return Err("no CA certificate in tls-ca-cert-file / tls-ca-cert-dir".into());
    }
    Ok(roots)
}

/// `tls-protocols`: Redis's words, case-insensitive; empty means TLS 1.2 and 1.3.
/// TLSv1 and TLSv1.1 are skipped (rustls has neither) as long as another one remains.
fn protocol_versions(
    words: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    if words.trim().is_empty() {
        return Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12]);
    }
    let mut v = Vec::new();
    for w in words.split_whitespace() {
        match w.to_ascii_lowercase().as_str() {
            "tlsv1.3" => v.push(&rustls::version::TLS13),
            "tlsv1.2" => v.push(&rustls::version::TLS12),
            "tlsv1" | "tlsv1.1" => {
                tracing::warn!("tls-protocols: {w} is not supported (rustls), skipped")
            }
            _ => {
                return Err(format!(
                    "invalid tls-protocols '{w}': use a combination of 'TLSv1.2' and 'TLSv1.3'"
                ))
            }
        }
    }
    if v.is_empty() {
        return Err(format!(
            "tls-protocols '{words}' names no version this build supports (TLSv1.2, TLSv1.3)"
        ));
    }
    Ok(v)
}

/// The ring provider with its suites narrowed by `tls-ciphersuites` (TLS 1.3) and
/// `tls-ciphers` (TLS 1.2); empty lists keep all of that version's suites.
fn provider(s: &TlsSettings) -> Result<CryptoProvider, String> {
    let mut p = rustls::crypto::ring::default_provider();
    let (tls13, tls12): (Vec<_>, Vec<_>) = p
        .cipher_suites
        .iter()
        .copied()
        .partition(|c| c.version() == &rustls::version::TLS13);
    let tls13 = select_suites(tls13, &s.ciphersuites, "tls-ciphersuites")?;
    let tls12 = select_suites(tls12, &s.ciphers, "tls-ciphers")?;
    p.cipher_suites = tls13.into_iter().chain(tls12).collect();
    Ok(p)
}

/// The suites `list` names (colon, comma or space separated), in the list's order.
/// Names are IANA's (`TLS_AES_128_GCM_SHA256`, `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`)
/// or OpenSSL's (`ECDHE-RSA-AES128-GCM-SHA256`); unknown names are skipped as OpenSSL
/// skips them, but a list that selects nothing is refused.
fn select_suites(
    all: Vec<SupportedCipherSuite>,
    list: &str,
    param: &str,
) -> Result<Vec<SupportedCipherSuite>, String> {
    let names: Vec<&str> = list
        .split([':', ',', ' '])
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(all);
    }
    let mut chosen: Vec<SupportedCipherSuite> = Vec::new();
    for n in names {
        let want = n.to_ascii_uppercase();
        for c in &all {
            if suite_names(*c).contains(&want) && !chosen.iter().any(|x| x.suite() == c.suite()) {
                chosen.push(*c);
            }
        }
    }
    if chosen.is_empty() {
        return Err(format!("{param} '{list}' selects no supported suite"));
    }
    Ok(chosen)
}

/// The names a suite goes by: IANA's and OpenSSL's.
fn suite_names(c: SupportedCipherSuite) -> Vec<String> {
    // rustls names TLS 1.3 suites `TLS13_...`; IANA and OpenSSL say `TLS_...`.
    let rustls_name = format!("{:?}", c.suite());
    let iana = match rustls_name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => rustls_name.clone(),
    };
    let openssl = iana
        .strip_prefix("TLS_ECDHE_")
        .map(|rest| {
            // TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 -> ECDHE-RSA-AES128-GCM-SHA256
            let rest = rest
                .replace("_WITH_", "_")
                .replace("AES_128", "AES128")
                .replace("AES_256", "AES256")
                .replace("CHACHA20_POLY1305_SHA256", "CHACHA20_POLY1305");
            format!("ECDHE-{}", rest.replace('_', "-"))
        })
        .unwrap_or_default();
    vec![rustls_name, iana, openssl]
}

/// Whether a connection accepted on `local` came in on the TLS port: `Ok(Some)` with
/// its session, `Ok(None)` for plaintext, `Err` when it must be dropped (no context).
pub(super) fn accepts_tls(
    ctx: &TlsContext,
    local: Option<std::net::SocketAddr>,
) -> Result<Option<Box<TlsSession>>, ()> {
    let port = ctx.port();
    if port == 0 || local.map(|a| a.port()) != Some(port) {
        return Ok(None);
    }
    ctx.accept().map(Some).map_err(|e| {
        tracing::warn!("Error accepting a client connection: {e}");
    })
}

/// Feeds a TLS connection's received bytes into its input buffer. On a fault, or when
/// the client ends the session, the connection closes once what is queued (the alert
/// included) is sent.
pub(super) fn received(conn: &mut Conn, data: &[u8]) {
    let Some(tls) = conn.tls.as_deref_mut() else {
        return;
    };
    match tls.receive(data, &mut conn.inbuf) {
        Ok(false) => {}
        Ok(true) => conn.close_after_reply = true,
        Err(TlsFault(e)) => {
            tracing::warn!(
                "Error accepting a client connection: {e} (addr={})",
                conn.addr
            );
            conn.close_after_reply = true;
        }
    }
}

/// Why a session stopped.
#[derive(Debug)]
pub struct TlsFault(pub String);

/// One connection's TLS state: the handshake, then the records both ways.
pub struct TlsSession {
    conn: ServerConnection,
    /// A fault ended the session: no more plaintext either way.
    failed: bool,
}

impl TlsSession {
    pub fn new(config: Arc<ServerConfig>) -> Result<Box<TlsSession>, String> {
        let mut conn = ServerConnection::new(config).map_err(|e| e.to_string())?;
        // Replies are encrypted as soon as they are sealed, straight into the send
        // buffer: rustls's own buffers stay small, the connection's output limit
        // (client-output-buffer-limit) bounds what waits.
        conn.set_buffer_limit(None);
        Ok(Box::new(TlsSession {
            conn,
            failed: false,
        }))
    }

    /// Takes received ciphertext and appends what it decrypts to `plain`. `Ok(true)`
    /// when the client has closed the session (close_notify). On a fault the session
    /// keeps the alert to send; the caller closes the connection after [`seal`].
    ///
    /// [`seal`]: TlsSession::seal
    pub fn receive(&mut self, mut data: &[u8], plain: &mut Vec<u8>) -> Result<bool, TlsFault> {
        if self.failed {
            return Ok(false);
        }
        let mut closed = false;
        while !data.is_empty() {
            let n = self.conn.read_tls(&mut data).map_err(|e| self.fail(e))?;
            let state = self.conn.process_new_packets().map_err(|e| self.fail(e))?;
            let ready = state.plaintext_bytes_to_read();
            if ready > 0 {
                let start = plain.len();
                plain.resize(start + ready, 0);
                self.conn
                    .reader()
                    .read_exact(&mut plain[start..])
                    .map_err(|e| self.fail(e))?;
            }
            if state.peer_has_closed() {
                closed = true;
            }
            if n == 0 {
                // close_notify came: rustls reads nothing after it.
                break;
            }
        }
        Ok(closed)
    }

    fn fail(&mut self, e: impl std::fmt::Display) -> TlsFault {
        self.failed = true;
        TlsFault(e.to_string())
    }

    /// Encrypts `out` (cleared) and appends every TLS record ready to leave, handshake
    /// messages and alerts included, to `sending`. After a fault `out` is dropped.
    pub fn seal(&mut self, out: &mut Vec<u8>, sending: &mut Vec<u8>) {
        if !out.is_empty() {
            if !self.failed {
                // With no buffer limit the writer takes everything (before the handshake
                // ends it holds the plaintext and encrypts it once keys exist).
                if let Err(e) = self.conn.writer().write_all(out) {
                    tracing::debug!("TLS write failed: {e}");
                    self.failed = true;
                }
            }
            out.clear();
        }
        while self.conn.wants_write() {
            match self.conn.write_tls(sending) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Suites are found by IANA and OpenSSL names, the list order is kept, and a list of
    // unknown names is refused.
    #[test]
    fn cipher_names() {
        let all: Vec<_> = rustls::crypto::ring::default_provider().cipher_suites;
        let tls12: Vec<_> = all
            .iter()
            .copied()
            .filter(|c| c.version() == &rustls::version::TLS12)
            .collect();
        let tls13: Vec<_> = all
            .iter()
            .copied()
            .filter(|c| c.version() == &rustls::version::TLS13)
            .collect();
        let got = select_suites(
            tls12.clone(),
            "ECDHE-RSA-CHACHA20-POLY1305:TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            "tls-ciphers",
        )
        .unwrap();
        let names: Vec<String> = got.iter().map(|c| format!("{:?}", c.suite())).collect();
        assert_eq!(
            names,
            [
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
            ]
        );
        let got = select_suites(tls13.clone(), "TLS_AES_256_GCM_SHA384", "x").unwrap();
        assert_eq!(format!("{:?}", got[0].suite()), "TLS13_AES_256_GCM_SHA384");
        assert_eq!(got.len(), 1);
        assert!(select_suites(tls13.clone(), "bogus", "x").is_err());
        assert_eq!(
            select_suites(tls13.clone(), "", "x").unwrap().len(),
            tls13.len()
        );
        // A TLS 1.2 name does not select a TLS 1.3 suite.
        assert!(select_suites(tls13, "ECDHE-RSA-AES128-GCM-SHA256", "x").is_err());
    }

    // Redis's protocol words map to rustls versions; unknown or only-old ones are refused.
    #[test]
    fn protocols() {
        assert_eq!(protocol_versions("").unwrap().len(), 2);
        let v = protocol_versions("tlsv1.2").unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].version, rustls::ProtocolVersion::TLSv1_2);
        assert_eq!(protocol_versions("TLSv1.1 TLSv1.3").unwrap().len(), 1);
        assert!(protocol_versions("TLSv1 TLSv1.1").is_err());
        assert!(protocol_versions("SSLv3").is_err());
    }

    // Without files, or with a missing one, no context is built (and the error names it).
    #[test]
    fn missing_files_refused() {
        let mut s = TlsSettings::from_cli(&<crate::config::Cli as clap::Parser>::parse_from([
            "lavik",
            "--tls-port",
            "6380",
        ]))
        .unwrap();
        assert!(build_config(&s).unwrap_err().contains("tls-cert-file"));
        s.cert_file = "/nonexistent/cert.pem".into();
        s.key_file = "/nonexistent/key.pem".into();
        assert!(build_config(&s)
            .unwrap_err()
            .contains("/nonexistent/cert.pem"));
        assert!(TlsContext::new(&s).is_err());
        s.port = 0;
        let ctx = TlsContext::new(&s).unwrap();
        assert!(ctx.accept().is_err(), "no TLS port, no context");
    }
}
