//! The TLS settings: Redis's `tls-*` directives as flags, config-file lines and CONFIG
//! GET/SET parameters. This module only holds and checks the words; `server::tls` turns
//! them into a rustls context (loading files, choosing versions and suites), and that is
//! where a bad file or an unknown suite is refused.

use super::Cli;

/// `tls-auth-clients`: whether a client must present a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthClients {
    /// No certificate is asked for.
    No,
    /// Asked for; a client without one is served, a bad one is refused.
    Optional,
    /// Required (Redis's default).
    Yes,
}

impl AuthClients {
    pub fn parse(s: &str) -> Option<AuthClients> {
        match s.to_ascii_lowercase().as_str() {
            "no" => Some(AuthClients::No),
            "optional" => Some(AuthClients::Optional),
            "yes" => Some(AuthClients::Yes),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthClients::No => "no",
            AuthClients::Optional => "optional",
            AuthClients::Yes => "yes",
        }
    }
}

/// The `tls-*` parameters. Paths and lists are kept as given (CONFIG GET shows them so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// Fixed for the process (the listeners open at start).
    pub port: u16,
    pub cert_file: String,
    pub key_file: String,
    pub ca_cert_file: String,
    pub ca_cert_dir: String,
    pub auth_clients: AuthClients,
    pub protocols: String,
    pub ciphersuites: String,
    pub ciphers: String,
    pub session_caching: bool,
    pub session_cache_size: usize,
    pub prefer_server_ciphers: bool,
}

/// The parameters CONFIG SET may change (all but `tls-port`), in CONFIG GET order.
pub const SETTABLE: &[&str] = &[
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-ca-cert-dir",
    "tls-auth-clients",
    "tls-protocols",
    "tls-ciphersuites",
    "tls-ciphers",
    "tls-session-caching",
    "tls-session-cache-size",
    "tls-prefer-server-ciphers",
];

impl TlsSettings {
    pub fn from_cli(cli: &Cli) -> Result<TlsSettings, String> {
        let auth_clients = AuthClients::parse(&cli.tls_auth_clients).ok_or_else(|| {
            format!(
                "--tls-auth-clients takes no, yes or optional, got '{}'",
                cli.tls_auth_clients
            )
        })?;
        let session_caching = super::parse_yes_no(&cli.tls_session_caching).ok_or_else(|| {
            format!(
                "--tls-session-caching takes yes or no, got '{}'",
                cli.tls_session_caching
            )
        })?;
        let prefer_server_ciphers = super::parse_yes_no(&cli.tls_prefer_server_ciphers)
            .ok_or_else(|| {
                format!(
                    "--tls-prefer-server-ciphers takes yes or no, got '{}'",
                    cli.tls_prefer_server_ciphers
                )
            })?;
        let s = TlsSettings {
            port: cli.tls_port,
            cert_file: cli.tls_cert_file.clone().unwrap_or_default(),
            key_file: cli.tls_key_file.clone().unwrap_or_default(),
            ca_cert_file: cli.tls_ca_cert_file.clone().unwrap_or_default(),
            ca_cert_dir: cli.tls_ca_cert_dir.clone().unwrap_or_default(),
            auth_clients,
            protocols: cli.tls_protocols.clone(),
            ciphersuites: cli.tls_ciphersuites.clone(),
            ciphers: cli.tls_ciphers.clone(),
            session_caching,
            session_cache_size: cli.tls_session_cache_size,
            prefer_server_ciphers,
        };
        if s.port != 0 && cli.port == s.port {
            return Err(format!(
                "--tls-port {} is also --port: give them different ports",
                s.port
            ));
        }
        Ok(s)
    }

    /// `(name, value)` for CONFIG GET, `tls-port` first.
    pub fn params(&self) -> Vec<(String, String)> {
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        vec![
            ("tls-port".into(), self.port.to_string()),
            ("tls-cert-file".into(), self.cert_file.clone()),
            ("tls-key-file".into(), self.key_file.clone()),
            ("tls-ca-cert-file".into(), self.ca_cert_file.clone()),
            ("tls-ca-cert-dir".into(), self.ca_cert_dir.clone()),
            ("tls-auth-clients".into(), self.auth_clients.as_str().into()),
            ("tls-protocols".into(), self.protocols.clone()),
            ("tls-ciphersuites".into(), self.ciphersuites.clone()),
            ("tls-ciphers".into(), self.ciphers.clone()),
            ("tls-session-caching".into(), yes_no(self.session_caching)),
            (
                "tls-session-cache-size".into(),
                self.session_cache_size.to_string(),
            ),
            (
                "tls-prefer-server-ciphers".into(),
                yes_no(self.prefer_server_ciphers),
            ),
            // What lavik does not do, reported as off (CONFIG SET refuses them).
            ("tls-replication".into(), "no".into()),
            ("tls-cluster".into(), "no".into()),
        ]
    }

    /// Sets one CONFIG SET parameter (`name` lower case, one of [`SETTABLE`]). The error
    /// is the part of Redis's message after "argument 'NAME') - ".
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "tls-cert-file" => self.cert_file = value.into(),
            "tls-key-file" => self.key_file = value.into(),
            "tls-ca-cert-file" => self.ca_cert_file = value.into(),
            "tls-ca-cert-dir" => self.ca_cert_dir = value.into(),
            "tls-auth-clients" => {
                self.auth_clients = AuthClients::parse(value).ok_or_else(|| {
                    "argument(s) must be one of the following: no, yes, optional".to_string()
                })?
            }
            "tls-protocols" => self.protocols = value.into(),
            "tls-ciphersuites" => self.ciphersuites = value.into(),
            "tls-ciphers" => self.ciphers = value.into(),
            "tls-session-caching" => {
                self.session_caching = super::parse_yes_no(value)
                    .ok_or_else(|| "argument must be 'yes' or 'no'".to_string())?
            }
            "tls-session-cache-size" => {
                self.session_cache_size = value
                    .parse::<usize>()
                    .map_err(|_| "argument couldn't be parsed into an integer".to_string())?
            }
            "tls-prefer-server-ciphers" => {
                self.prefer_server_ciphers = super::parse_yes_no(value)
                    .ok_or_else(|| "argument must be 'yes' or 'no'".to_string())?
            }
            _ => return Err(format!("not a settable TLS parameter: {name}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn settings(args: &[&str]) -> Result<TlsSettings, String> {
        let mut v = vec!["lavik"];
        v.extend_from_slice(args);
        TlsSettings::from_cli(&Cli::try_parse_from(v).map_err(|e| e.to_string())?)
    }

    // Defaults are Redis's: no TLS port, client certificates required, caching on.
    #[test]
    fn defaults_are_redis_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.port, 0);
        assert_eq!(s.auth_clients, AuthClients::Yes);
        assert!(s.session_caching);
        assert_eq!(s.session_cache_size, 20480);
        assert_eq!(s.protocols, "");
    }

    // Bad words are refused at start and by CONFIG SET, with Redis's CONFIG SET wording.
    #[test]
    fn bad_values_refused() {
        assert!(settings(&["--tls-auth-clients", "maybe"]).is_err());
        assert!(settings(&["--tls-session-caching", "perhaps"]).is_err());
        assert!(settings(&["--port", "7000", "--tls-port", "7000"]).is_err());
        let mut s = settings(&["--tls-auth-clients", "OPTIONAL"]).unwrap();
        assert_eq!(s.auth_clients, AuthClients::Optional);
        assert_eq!(
            s.set("tls-auth-clients", "maybe").unwrap_err(),
            "argument(s) must be one of the following: no, yes, optional"
        );
        assert_eq!(s.auth_clients, AuthClients::Optional);
        s.set("tls-auth-clients", "no").unwrap();
        s.set("tls-session-cache-size", "12").unwrap();
        assert!(s.set("tls-session-cache-size", "x").is_err());
        let p = s.params();
        assert!(p.contains(&("tls-auth-clients".into(), "no".into())));
        assert!(p.contains(&("tls-session-cache-size".into(), "12".into())));
    }

    // Config-file lines become the same settings; tls-protocols' words stay one value,
    // and tls-replication/tls-cluster are accepted only when off.
    #[test]
    fn config_file_lines() {
        let text = "tls-port 6380\ntls-cert-file /c.pem\ntls-key-file /k.pem\n\
                    tls-auth-clients optional\ntls-protocols TLSv1.2 TLSv1.3\n\
                    tls-replication no\ntls-cluster no\n";
        let mut args = vec!["lavik".to_string()];
        args.extend(super::super::config_file_args(text).unwrap());
        let s = TlsSettings::from_cli(&Cli::try_parse_from(args).unwrap()).unwrap();
        assert_eq!(s.port, 6380);
        assert_eq!(s.cert_file, "/c.pem");
        assert_eq!(s.auth_clients, AuthClients::Optional);
        assert_eq!(s.protocols, "TLSv1.2 TLSv1.3");
        assert!(super::super::config_file_args("tls-replication yes\n").is_err());
        assert!(super::super::config_file_args("tls-cluster yes\n").is_err());
    }
}
