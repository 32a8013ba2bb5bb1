//! TLS on `--tls-port`: `redis-cli --tls` with and without client certificates under
//! `tls-auth-clients` yes/optional/no, certificates from the wrong CA refused both ways,
//! plaintext and TLS ports at once, a 1 MiB value and a pipelined burst through a rustls
//! client, certificate reload by CONFIG SET, and a TLS-only server from a config file.
//! Certificates are made with the `openssl` command for each run.
mod common;
use common::{free_port, temp_dir, Server};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (package openssl) is needed by this test");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Test certificates: two CAs, each with a server certificate (for localhost and
/// 127.0.0.1) and a client certificate. Keys are P-256 except `other-server`'s (RSA).
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = temp_dir(tag);
        let p = Pki { dir };
        std::fs::write(
            p.dir.join("server.ext"),
            "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(
            p.dir.join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        // One RSA key (the reload test's new server certificate): RSA keys take openssl
        // a second or more to make, P-256 keys milliseconds.
        for ca in ["ca", "other"] {
            p.make_ca(ca, false);
            p.make_leaf(ca, &format!("{ca}-server"), "server.ext", ca == "other");
            p.make_leaf(ca, &format!("{ca}-client"), "client.ext", false);
        }
        p
    }

    fn key_args(rsa: bool) -> Vec<&'static str> {
        if rsa {
            vec!["-newkey", "rsa:2048"]
        } else {
            vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        }
    }

    fn make_ca(&self, name: &str, rsa: bool) {
        let (key, crt, subj) = (
            format!("{name}.key"),
            format!("{name}.crt"),
            format!("/CN=lavik test {name}"),
        );
        let mut a = vec!["req", "-x509", "-nodes", "-days", "3650", "-subj", &subj];
        a.extend(Self::key_args(rsa));
        a.extend(["-keyout", &key, "-out", &crt]);
        openssl(&self.dir, &a);
    }

    fn make_leaf(&self, ca: &str, name: &str, ext: &str, rsa: bool) {
        let (key, csr, crt, subj) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("/CN={name}"),
        );
        let mut a = vec!["req", "-nodes", "-subj", &subj];
        a.extend(Self::key_args(rsa));
        a.extend(["-keyout", &key, "-out", &csr]);
        openssl(&self.dir, &a);
        let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "3650",
                "-extfile",
                ext,
                "-out",
                &crt,
            ],
        );
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// Server flags for a TLS port with CA `ca`'s server certificate.
    fn server_flags(&self, tls_port: u16, auth: &str) -> Vec<String> {
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            self.path("ca-server.crt"),
            "--tls-key-file".into(),
            self.path("ca-server.key"),
            "--tls-ca-cert-file".into(),
            self.path("ca.crt"),
            "--tls-auth-clients".into(),
            auth.into(),
        ]
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(tag: &str, flags: &[String]) -> Server {
    let f: Vec<&str> = flags.iter().map(|s| s.as_str()).collect();
    Server::start(tag, &f)
}

/// What `redis-cli --tls` prints for `cmd` (stdout and stderr), trusting CA `cacert`
/// and presenting client certificate `cert` (a name in the PKI, e.g. `ca-client`).
fn cli(pki: &Pki, port: u16, cacert: &str, cert: Option<&str>, cmd: &[&str]) -> String {
    let mut c = Command::new("redis-cli");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls"]);
    c.args(["--cacert", &pki.path(&format!("{cacert}.crt"))]);
    if let Some(name) = cert {
        c.args(["--cert", &pki.path(&format!("{name}.crt"))]);
        c.args(["--key", &pki.path(&format!("{name}.key"))]);
    }
    let out = c.args(cmd).output().expect("redis-cli");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn pong(out: &str) -> bool {
    out.trim() == "PONG"
}

/// A RESP client over rustls (the Rust-client side of the tests).
struct TlsClient {
    s: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl TlsClient {
    fn connect(pki: &Pki, port: u16, cacert: &str, cert: Option<&str>) -> TlsClient {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(pki.path(&format!("{cacert}.crt"))).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match cert {
            Some(name) => {
                let chain: Vec<_> = CertificateDer::pem_file_iter(pki.path(&format!("{name}.crt")))
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{name}.key"))).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
            None => builder.with_no_client_auth(),
        };
        let name = ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        TlsClient {
            s: rustls::StreamOwned::new(conn, tcp),
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut m = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            m.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            m.extend_from_slice(a);
            m.extend_from_slice(b"\r\n");
        }
        self.s.write_all(&m).unwrap();
    }

    /// Reads exactly `want.len()` bytes and compares them with `want`.
    fn expect(&mut self, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        self.s.read_exact(&mut got).unwrap();
        assert!(
            got == want,
            "got {:?}... want {:?}...",
            String::from_utf8_lossy(&got[..got.len().min(80)]),
            String::from_utf8_lossy(&want[..want.len().min(80)])
        );
    }
}

// Under tls-auth-clients yes (Redis's default): a client with a certificate from the
// server's CA is served, one without a certificate or with another CA's is refused, a
// client that does not know the server's CA refuses the server, and the plaintext port
// serves the same data at the same time.
#[test]
fn auth_clients_yes() {
    let pki = Pki::new("tls-yes");
    let tls_port = free_port();
    let s = start("tls-yes", &pki.server_flags(tls_port, "yes"));
    let good = Some("ca-client");
    assert!(pong(&cli(&pki, tls_port, "ca", good, &["PING"])));
    assert_eq!(
        cli(&pki, tls_port, "ca", good, &["SET", "k", "over-tls"]).trim(),
        "OK"
    );
    assert_eq!(
        cli(&pki, tls_port, "ca", good, &["GET", "k"]).trim(),
        "over-tls"
    );
    let none = cli(&pki, tls_port, "ca", None, &["PING"]);
    assert!(
        !pong(&none),
        "no client certificate must be refused: {none}"
    );
    let wrong = cli(&pki, tls_port, "ca", Some("other-client"), &["PING"]);
    assert!(!pong(&wrong), "a foreign CA's client certificate: {wrong}");
    let untrusted = cli(&pki, tls_port, "other", good, &["PING"]);
    assert!(
        !pong(&untrusted) && untrusted.contains("certificate verify failed"),
        "the client must refuse a server certificate it cannot verify: {untrusted}"
    );
    // Plaintext at once, on the same data.
    let mut raw = s.raw();
    raw.expect(&[b"GET", b"k"], b"$8\r\nover-tls\r\n");
    // Refused handshakes left the server serving.
    assert!(pong(&cli(&pki, tls_port, "ca", good, &["PING"])));
    let log = s.stderr();
    assert!(log.contains("Error accepting a client connection"), "{log}");
}

// Under tls-auth-clients optional a client without a certificate is served, one with a
// certificate from the server's CA too, one with another CA's is refused.
#[test]
fn auth_clients_optional() {
    let pki = Pki::new("tls-optional");
    let tls_port = free_port();
    let _s = start("tls-optional", &pki.server_flags(tls_port, "optional"));
    assert!(pong(&cli(&pki, tls_port, "ca", None, &["PING"])));
    assert!(pong(&cli(
        &pki,
        tls_port,
        "ca",
        Some("ca-client"),
        &["PING"]
    )));
    let wrong = cli(&pki, tls_port, "ca", Some("other-client"), &["PING"]);
    assert!(!pong(&wrong), "a foreign CA's client certificate: {wrong}");
}

// Under tls-auth-clients no no certificate is asked for: clients with none, or with any,
// are served (no CA is needed then); the server's own certificate is still checked.
#[test]
fn auth_clients_no() {
    let pki = Pki::new("tls-no");
    let tls_port = free_port();
    let mut flags = pki.server_flags(tls_port, "no");
    flags.drain(6..8); // no --tls-ca-cert-file
    let _s = start("tls-no", &flags);
    assert!(pong(&cli(&pki, tls_port, "ca", None, &["PING"])));
    assert!(pong(&cli(
        &pki,
        tls_port,
        "ca",
        Some("other-client"),
        &["PING"]
    )));
    assert!(!pong(&cli(&pki, tls_port, "other", None, &["PING"])));
}

// A rustls client moves a 1 MiB value both ways and a pipelined burst of 2000 SETs and
// 2000 GETs (keys on both workers) whose replies come back complete and in order.
#[test]
fn large_value_and_pipeline() {
    let pki = Pki::new("tls-bulk");
    let tls_port = free_port();
    let s = start("tls-bulk", &pki.server_flags(tls_port, "yes"));
    let mut c = TlsClient::connect(&pki, tls_port, "ca", Some("ca-client"));
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    c.send(&[b"SET", b"big", &big]);
    c.expect(b"+OK\r\n");
    c.send(&[b"GET", b"big"]);
    let mut want = format!("${}\r\n", big.len()).into_bytes();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\n");
    c.expect(&want);
    let n = 2000;
    let mut burst = Vec::new();
    let mut want = Vec::new();
    for i in 0..n {
        let (k, v) = (format!("key:{i}"), format!("value-{i}"));
        for a in [&b"SET"[..], k.as_bytes(), v.as_bytes()] {
            burst.push(a.to_vec());
        }
        want.extend_from_slice(b"+OK\r\n");
    }
    for i in 0..n {
        let v = format!("value-{i}");
        want.extend_from_slice(format!("${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let mut wire = Vec::new();
    for chunk in burst.chunks(3) {
        wire.extend_from_slice(b"*3\r\n");
        for a in chunk {
            wire.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            wire.extend_from_slice(a);
            wire.extend_from_slice(b"\r\n");
        }
    }
    for i in 0..n {
        let k = format!("key:{i}");
        wire.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n{k}\r\n", k.len()).as_bytes());
    }
    c.s.write_all(&wire).unwrap();
    c.expect(&want);
    // The plaintext port sees what TLS wrote.
    s.raw()
        .expect(&[b"GET", b"key:1999"], b"$10\r\nvalue-1999\r\n");
}

// CONFIG SET of the certificate and key takes effect for the next connection (a client
// trusting only the new CA gets in, one trusting only the old CA no longer does) while an
// open session goes on; a bad path is refused with Redis's error, the old context stays.
#[test]
fn config_set_reloads_certificate() {
    let pki = Pki::new("tls-reload");
    let tls_port = free_port();
    let s = start("tls-reload", &pki.server_flags(tls_port, "optional"));
    let mut raw = s.raw();
    let mut open = TlsClient::connect(&pki, tls_port, "ca", None);
    open.send(&[b"PING"]);
    open.expect(b"+PONG\r\n");
    let bad = b"-ERR CONFIG SET failed (possibly related to argument 'tls-cert-file') - Unable to update TLS configuration. Check server logs.\r\n";
    raw.expect(
        &[
            b"CONFIG",
            b"SET",
            b"tls-cert-file",
            b"/nonexistent/cert.pem",
        ],
        bad,
    );
    raw.expect(
        &[b"CONFIG", b"GET", b"tls-cert-file"],
        format!(
            "*2\r\n$13\r\ntls-cert-file\r\n${}\r\n{}\r\n",
            pki.path("ca-server.crt").len(),
            pki.path("ca-server.crt")
        )
        .as_bytes(),
    );
    // A certificate without its key (they do not match) is refused the same way.
    let other_cert = pki.path("other-server.crt");
    raw.expect(
        &[b"CONFIG", b"SET", b"tls-cert-file", other_cert.as_bytes()],
        bad,
    );
    assert!(pong(&cli(&pki, tls_port, "ca", None, &["PING"])));
    let other_key = pki.path("other-server.key");
    raw.expect(
        &[
            b"CONFIG",
            b"SET",
            b"tls-cert-file",
            other_cert.as_bytes(),
            b"tls-key-file",
            other_key.as_bytes(),
        ],
        b"+OK\r\n",
    );
    assert!(pong(&cli(&pki, tls_port, "other", None, &["PING"])));
    let old = cli(&pki, tls_port, "ca", None, &["PING"]);
    assert!(!pong(&old), "the old certificate must be gone: {old}");
    open.send(&[b"PING"]);
    open.expect(b"+PONG\r\n");
    // tls-auth-clients changes for new connections too, with Redis's value check.
    raw.expect(
        &[b"CONFIG", b"SET", b"tls-auth-clients", b"maybe"],
        b"-ERR CONFIG SET failed (possibly related to argument 'tls-auth-clients') - argument(s) must be one of the following: no, yes, optional\r\n",
    );
    raw.expect(
        &[b"CONFIG", b"SET", b"tls-auth-clients", b"yes"],
        b"+OK\r\n",
    );
    assert!(!pong(&cli(&pki, tls_port, "other", None, &["PING"])));
    raw.expect(
        &[b"CONFIG", b"SET", b"tls-port", b"1234"],
        b"-ERR CONFIG SET failed (possibly related to argument 'tls-port') - can't set immutable config\r\n",
    );
}

// A config file with `port 0` and TLS directives gives a TLS-only server, and a TLS port
// whose certificate cannot load stops the start with a message naming the file.
#[test]
fn tls_only_from_config_file() {
    let pki = Pki::new("tls-conf");
    let dir = temp_dir("tls-conf");
    let tls_port = free_port();
    let conf = format!(
        "port 0\ntls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-dir {}\n\
         tls-auth-clients yes\ntls-protocols \"TLSv1.2 TLSv1.3\"\ntls-replication no\n\
         data-file {}\ndata-file-size 64mb\nthreads 2\n",
        pki.path("ca-server.crt"),
        pki.path("ca-server.key"),
        pki.dir.display(),
        dir.join("lavik.data").display()
    );
    let conf_path = dir.join("lavik.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lavik"))
        .arg(&conf_path)
        .arg("--no-pin-workers")
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        last = cli(&pki, tls_port, "ca", Some("ca-client"), &["PING"]);
        if pong(&last) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The CA directory holds every test certificate: both CAs' clients are trusted.
    let foreign = cli(&pki, tls_port, "ca", Some("other-client"), &["PING"]);
    let no_cert = cli(&pki, tls_port, "ca", None, &["PING"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(pong(&last), "TLS-only server did not answer: {last}");
    assert!(pong(&foreign), "{foreign}");
    assert!(!pong(&no_cert), "{no_cert}");

    let bad = Command::new(env!("CARGO_BIN_EXE_lavik"))
        .args(["--port", "0", "--tls-port", &free_port().to_string()])
        .args([
            "--tls-cert-file",
            "/nonexistent/c.pem",
            "--tls-key-file",
            "/nonexistent/k.pem",
        ])
        .args(["--data-file", &dir.join("bad.data").display().to_string()])
        .args([
            "--data-file-size",
            "64mb",
            "--threads",
            "1",
            "--no-pin-workers",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(err.contains("/nonexistent/c.pem"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts Debian's redis-server with TLS beside a plaintext port (the oracle for CONFIG
/// replies); `None` if it did not come up.
fn start_redis(pki: &Pki, dir: &Path, port: u16, tls_port: u16) -> Option<std::process::Child> {
    let mut args: Vec<String> = vec![
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        "".into(),
        "--appendonly".into(),
        "no".into(),
    ];
    args.extend(pki.server_flags(tls_port, "optional"));
    let mut child = Command::new("redis-server")
        .args(&args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server is installed (tools/test installs it)");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if pong(&cli(pki, tls_port, "ca", None, &["PING"])) {
            return Some(child);
        }
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

// CONFIG GET/SET of the tls-* parameters answer byte for byte as redis-server does
// (refused files, values and suites included), and both keep serving TLS afterwards.
#[test]
fn config_replies_match_redis() {
    use common::diff::RespConn;
    let pki = Pki::new("tls-diff");
    let dir = temp_dir("tls-diff-redis");
    let (redis_port, redis_tls) = (free_port(), free_port());
    let mut redis = start_redis(&pki, &dir, redis_port, redis_tls).expect("redis-server with TLS");
    let lavik_tls = free_port();
    let s = start("tls-diff", &pki.server_flags(lavik_tls, "optional"));
    let mut a = RespConn::connect(redis_port);
    let mut b = RespConn::connect(s.port);
    let cases: &[&[&str]] = &[
        &["CONFIG", "GET", "tls-auth-clients"],
        &["CONFIG", "SET", "tls-cert-file", "/nonexistent/cert.pem"],
        &["CONFIG", "SET", "tls-key-file", "/nonexistent/key.pem"],
        &["CONFIG", "SET", "tls-ca-cert-file", "/nonexistent/ca.pem"],
        &["CONFIG", "SET", "tls-auth-clients", "maybe"],
        &["CONFIG", "SET", "tls-ciphersuites", "bogus"],
        &["CONFIG", "SET", "tls-ciphers", "bogus"],
        &["CONFIG", "SET", "tls-protocols", "TLSv1.2 bogus"],
        &["CONFIG", "SET", "tls-session-caching", "maybe"],
        &["CONFIG", "SET", "tls-session-cache-size", "many"],
        &[
            "CONFIG",
            "SET",
            "tls-ciphersuites",
            "TLS_AES_256_GCM_SHA384",
        ],
        &["CONFIG", "GET", "tls-ciphersuites"],
        &["CONFIG", "SET", "tls-protocols", "TLSv1.3"],
        &["CONFIG", "SET", "tls-auth-clients", "no"],
        &["CONFIG", "GET", "tls-auth-clients"],
        &["CONFIG", "GET", "tls-protocols"],
        &["CONFIG", "GET", "tls-session-caching"],
        &["CONFIG", "GET", "tls-session-cache-size"],
        &["CONFIG", "GET", "tls-replication"],
        &["CONFIG", "SET", "tls-prefer-server-ciphers", "maybe"],
        &["CONFIG", "SET", "tls-prefer-server-ciphers", "yes"],
        &["CONFIG", "GET", "tls-prefer-server-ciphers"],
    ];
    for cmd in cases {
        let args: Vec<&[u8]> = cmd.iter().map(|x| x.as_bytes()).collect();
        let (want, got) = (a.call(&args), b.call(&args));
        assert!(
            want == got,
            "{cmd:?}: redis {:?}, lavik {:?}",
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&got)
        );
    }
    for port in [redis_tls, lavik_tls] {
        assert!(pong(&cli(&pki, port, "ca", None, &["PING"])), "port {port}");
    }
    let _ = redis.kill();
    let _ = redis.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `openssl s_client` for one PING (`-sess_out`/`-sess_in` file `sess`, `resume`
/// chooses which) and returns its report line, `New, ...` or `Reused, ...`.
fn s_client_session(pki: &Pki, port: u16, version: &str, sess: &Path, resume: bool) -> String {
    let sess = sess.display().to_string();
    let flag = if resume { "-sess_in" } else { "-sess_out" };
    s_client(pki, port, &[version, flag, &sess])
}

/// Runs `openssl s_client` with `extra` arguments for one PING and returns its report
/// line (`New, TLSv1.2, Cipher is ...` or `Reused, ...`).
fn s_client(pki: &Pki, port: u16, extra: &[&str]) -> String {
    use std::io::BufRead;
    let mut c = Command::new("openssl");
    c.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]);
    c.args(["-CAfile", &pki.path("ca.crt")]);
    c.args([
        "-cert",
        &pki.path("ca-client.crt"),
        "-key",
        &pki.path("ca-client.key"),
    ]);
    c.args(extra);
    let mut child = c
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    // A refused handshake may end s_client before this lands.
    let _ = stdin.write_all(b"PING\r\n");
    let mut report = String::new();
    // The PONG comes after any TLS 1.3 ticket, so the saved session has one.
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.starts_with("New,") || line.starts_with("Reused,") {
            report = line.clone();
        }
        if line.contains("+PONG") {
            break;
        }
    }
    drop(stdin);
    let _ = child.wait();
    report
}

// With tls-session-caching yes a client resumes its TLS 1.2 and 1.3 sessions; under a
// context made with caching off it is offered no session to resume.
#[test]
fn session_resumption() {
    let pki = Pki::new("tls-resume");
    let tls_port = free_port();
    let s = start("tls-resume", &pki.server_flags(tls_port, "yes"));
    for version in ["-tls1_2", "-tls1_3"] {
        let sess = pki.dir.join(format!("session{version}.pem"));
        let first = s_client_session(&pki, tls_port, version, &sess, false);
        assert!(first.starts_with("New,"), "{version}: {first}");
        let again = s_client_session(&pki, tls_port, version, &sess, true);
        assert!(again.starts_with("Reused,"), "{version}: {again}");
    }
    s.raw().expect(
        &[b"CONFIG", b"SET", b"tls-session-caching", b"no"],
        b"+OK\r\n",
    );
    for version in ["-tls1_2", "-tls1_3"] {
        let sess = pki.dir.join(format!("nocache{version}.pem"));
        let first = s_client_session(&pki, tls_port, version, &sess, false);
        assert!(first.starts_with("New,"), "{version}: {first}");
        // s_client saves a session only when the server offered one to resume
        // (a session id or a ticket): none now.
        assert!(
            !sess.exists(),
            "{version}: a resumable session without caching"
        );
    }
}

// tls-ciphers narrows the TLS 1.2 suites, and tls-prefer-server-ciphers decides whose
// order picks among those both sides have: the client's (no, the default) or the server's.
#[test]
fn cipher_order() {
    let pki = Pki::new("tls-ciphers");
    let tls_port = free_port();
    let mut flags = pki.server_flags(tls_port, "yes");
    flags.extend([
        "--tls-ciphers".into(),
        "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256".into(),
    ]);
    let s = start("tls-ciphers", &flags);
    let client_order = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305";
    let got = s_client(&pki, tls_port, &["-tls1_2", "-cipher", client_order]);
    assert!(got.ends_with("ECDHE-ECDSA-AES128-GCM-SHA256"), "{got}");
    s.raw().expect(
        &[b"CONFIG", b"SET", b"tls-prefer-server-ciphers", b"yes"],
        b"+OK\r\n",
    );
    let got = s_client(&pki, tls_port, &["-tls1_2", "-cipher", client_order]);
    assert!(got.ends_with("ECDHE-ECDSA-CHACHA20-POLY1305"), "{got}");
    // A suite outside tls-ciphers is never chosen: the handshake fails.
    let got = s_client(
        &pki,
        tls_port,
        &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"],
    );
    assert!(!got.contains("AES256"), "{got}");
}
