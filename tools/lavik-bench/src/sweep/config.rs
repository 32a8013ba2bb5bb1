//! The sweep configuration file: `key = value` lines, `#` comments, one `server =` line per
//! server under test (`name | port | command line`, `{port}` substituted). See
//! `tools/sweep/*.conf` for complete examples.

/// One server under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    pub name: String,
    pub port: u16,
    /// Shell command line that starts the server in the foreground.
    pub command: String,
}

/// Everything a sweep needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    pub out_dir: String,
    pub title: String,
    /// `taskset -c` CPU lists; empty means "do not pin".
    pub server_cpus: String,
    pub client_cpus: String,
    pub keys: u64,
    pub data_size_bytes: usize,
    pub key_prefix: String,
    pub connections: Vec<u32>,
    /// "get" and/or "set", in sweep order.
    pub commands: Vec<String>,
    pub point_seconds: u64,
    /// Each point is measured this many times per server (A B A B ...); reports show the
    /// run with the median throughput, the CSV and JSON every run.
    pub repeats: u32,
    pub warmup_seconds: u64,
    pub pipeline: u32,
    pub client_threads: u32,
    pub fill_connections: u32,
    pub fill_pipeline: u32,
    pub strlen_samples: u32,
    /// When set, each point is also measured with this `redis-benchmark`.
    pub redis_benchmark: Option<String>,
    pub servers: Vec<ServerSpec>,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            out_dir: "sweep-out".into(),
            title: "lavik-bench sweep".into(),
            server_cpus: String::new(),
            client_cpus: String::new(),
            keys: 100_000,
            data_size_bytes: 100,
            key_prefix: "memtier-".into(),
            connections: vec![1, 2, 4, 8, 16, 32, 64],
            commands: vec!["get".into(), "set".into()],
            point_seconds: 3,
            repeats: 1,
            warmup_seconds: 2,
            pipeline: 1,
            client_threads: 1,
            fill_connections: 16,
            fill_pipeline: 32,
            strlen_samples: 100,
            redis_benchmark: None,
            servers: Vec::new(),
        }
    }
}

fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{key}: '{v}' is not a valid number"))
}

fn server_line(v: &str) -> Result<ServerSpec, String> {
    let parts: Vec<&str> = v.splitn(3, '|').map(str::trim).collect();
    let [name, port, command] = parts[..] else {
        return Err(format!(
            "server: expected 'name | port | command', got '{v}'"
        ));
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!(
            "server name '{name}' must be non-empty [A-Za-z0-9._-]"
        ));
    }
    if command.is_empty() {
        return Err(format!("server {name}: empty command"));
    }
    Ok(ServerSpec {
        name: name.to_string(),
        port: num("server port", port)?,
        command: command.replace("{port}", port),
    })
}

/// Parse a configuration file's text.
pub fn parse(text: &str) -> Result<SweepConfig, String> {
    let mut c = SweepConfig::default();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| format!("line {}: expected key = value", n + 1))?;
        let list = || {
            value
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        match key {
            "out_dir" => c.out_dir = value.into(),
            "title" => c.title = value.into(),
            "server_cpus" => c.server_cpus = value.into(),
            "client_cpus" => c.client_cpus = value.into(),
            "keys" => c.keys = num(key, value)?,
            "data_size" => c.data_size_bytes = num(key, value)?,
            "key_prefix" => c.key_prefix = value.into(),
            "connections" => {
                c.connections = list().map(|s| num(key, &s)).collect::<Result<_, _>>()?
            }
            "commands" => c.commands = list().map(|s| s.to_lowercase()).collect(),
            "point_seconds" => c.point_seconds = num(key, value)?,
            "warmup_seconds" => c.warmup_seconds = num(key, value)?,
            "repeats" => c.repeats = num(key, value)?,
            "pipeline" => c.pipeline = num(key, value)?,
            "client_threads" => c.client_threads = num(key, value)?,
            "fill_connections" => c.fill_connections = num(key, value)?,
            "fill_pipeline" => c.fill_pipeline = num(key, value)?,
            "strlen_samples" => c.strlen_samples = num(key, value)?,
            "redis_benchmark" => c.redis_benchmark = (!value.is_empty()).then(|| value.into()),
            "server" => c.servers.push(server_line(value)?),
            other => return Err(format!("line {}: unknown key '{other}'", n + 1)),
        }
    }
    validate(&c)?;
    Ok(c)
}

fn validate(c: &SweepConfig) -> Result<(), String> {
    if c.servers.is_empty() {
        return Err("no server = lines".into());
    }
    let mut names: Vec<&str> = c.servers.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() != c.servers.len() {
        return Err("server names must be unique".into());
    }
    if let Some(bad) = c
        .commands
        .iter()
        .find(|m| !matches!(m.as_str(), "get" | "set"))
    {
        return Err(format!("commands: '{bad}' is not get or set"));
    }
    if c.commands.is_empty() || c.connections.is_empty() {
        return Err("commands and connections must not be empty".into());
    }
    if c.client_threads == 0
        || c.pipeline == 0
        || c.point_seconds == 0
        || c.fill_pipeline == 0
        || c.repeats == 0
    {
        return Err(
            "client_threads, pipeline, point_seconds, fill_pipeline, repeats must be >= 1".into(),
        );
    }
    for &conns in &c.connections {
        let threads = c.client_threads.min(conns);
        if conns == 0 || conns % threads != 0 {
            return Err(format!(
                "{conns} connections do not split over {threads} client threads"
            ));
        }
    }
    if c.keys < u64::from(c.fill_connections.max(1)) {
        return Err("keys must be at least fill_connections".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves a complete file parses, {port} is substituted and unspecified keys keep defaults.
    #[test]
    fn parses_full_file() {
        let c = parse(
            "# comment\nout_dir = /tmp/x\nconnections = 1, 2,4\ncommands = GET\nkeys = 500\n\
             server_cpus = 0\nclient_cpus = 1\nredis_benchmark = redis-benchmark\n\
             server = a | 7001 | redis-server --port {port} --save \"\"\n\
             server = lavik | 7002 | /x/lavik --port {port}\n",
        )
        .unwrap();
        assert_eq!(c.out_dir, "/tmp/x");
        assert_eq!(c.connections, vec![1, 2, 4]);
        assert_eq!(c.commands, vec!["get"]);
        assert_eq!(c.keys, 500);
        assert_eq!(c.servers.len(), 2);
        assert_eq!(c.servers[0].command, "redis-server --port 7001 --save \"\"");
        assert_eq!(c.servers[1].name, "lavik");
        assert_eq!(c.redis_benchmark.as_deref(), Some("redis-benchmark"));
        assert_eq!(c.point_seconds, SweepConfig::default().point_seconds);
    }

    // Proves mistakes in the file are reported instead of producing a wrong sweep.
    #[test]
    fn rejects_mistakes() {
        let server = "server = a | 1 | x\n";
        for bad in [
            String::new(),
            format!("{server}connections = 3\nclient_threads = 2\n"),
            format!("{server}commands = incr\n"),
            format!("{server}{server}"),
            format!("{server}bogus = 1\n"),
            "server = a | notaport | x\n".to_string(),
            "server = a b | 1 | x\n".to_string(),
            format!("{server}keys\n"),
        ] {
            assert!(parse(&bad).is_err(), "accepted: {bad}");
        }
    }
}
