//! The sweep configuration file: `key = value` lines, `#` comments, one `server =` line per
//! server under test (`name | port | command line`, `{port}` substituted). See
//! `tools/sweep/*.conf` for complete examples.
//!
//! `commands =` names what each point runs: the built-ins `get` and `set` (memtier's
//! `--ratio=0:1` / `1:0`), or a name defined by a `command =` line:
//!
//! ```text
//! command = NAME | TEMPLATE [| OPTION]...
//! ```
//!
//! TEMPLATE is a memtier `--command` (`__key__`, `__data__`, plus `__rand__`: a random
//! number per request, and `;` between commands sent as one request, answered when the
//! last reply arrives: `MULTI ; SET __key__ __data__ ; EXEC`). OPTIONs: `read` (a nil reply is a miss, and misses fail the
//! check), `distinct_keys` (each `__key__` draws its own key: MGET of 10 different keys),
//! `prefix=STR` (the command works on its own keyspace `STR1..STRkeys` instead of
//! `key_prefix`), `fill=TEMPLATE` (how that keyspace is filled before the sweep, once per
//! prefix, every key exactly once, e.g. `fill=SET __key__ 1` so INCR finds integers).
//! `server_args = NAME | ARGS` appends ARGS to that server's command line;
//! `key_pattern = R` (uniform) or `G` (Gaussian around the middle key, memtier's G:G)
//! chooses the keys of every point and of the warm-up.

use crate::options::KeyPattern;

/// One server under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    pub name: String,
    pub port: u16,
    /// Shell command line that starts the server in the foreground.
    pub command: String,
}

/// One named request shape a sweep can measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    /// Lower-case name used in `commands =` and in the reports.
    pub name: String,
    /// memtier-style template; empty for the built-in `get` / `set` (run with `--ratio`).
    pub args: Vec<String>,
    pub is_read: bool,
    pub distinct_keys: bool,
    /// Own keyspace prefix (None: the sweep's `key_prefix`).
    pub prefix: Option<String>,
    /// Template that fills the own keyspace (None: it starts empty).
    pub fill: Option<Vec<String>>,
}

impl CommandSpec {
    fn builtin(name: &str) -> Self {
        Self {
            name: name.into(),
            args: Vec::new(),
            is_read: name == "get",
            distinct_keys: false,
            prefix: None,
            fill: None,
        }
    }

    pub fn is_builtin(&self) -> bool {
        self.args.is_empty()
    }

    /// Different keys one request reads or writes: the divisor of "cost per key".
    pub fn keys_per_request(&self) -> u32 {
        let placeholders = self.args.iter().filter(|a| *a == "__key__").count() as u32;
        if self.distinct_keys {
            placeholders.max(1)
        } else {
            1
        }
    }
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
    /// Names of `get`, `set` or `command =` definitions, in sweep order.
    pub commands: Vec<String>,
    /// `command =` definitions (only those named in `commands` are run).
    pub command_specs: Vec<CommandSpec>,
    /// Key pattern of the measured points and the warm-up: Random or Gaussian.
    pub key_pattern: KeyPattern,
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
            command_specs: Vec::new(),
            key_pattern: KeyPattern::Random,
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

impl SweepConfig {
    /// The definition of a command named in `commands` (validation guarantees it exists).
    pub fn command(&self, name: &str) -> CommandSpec {
        self.command_specs
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .unwrap_or_else(|| CommandSpec::builtin(name))
    }

    /// The key prefix a command works on.
    pub fn prefix_of(&self, name: &str) -> String {
        self.command(name)
            .prefix
            .unwrap_or_else(|| self.key_prefix.clone())
    }

    /// Keyspaces to fill besides the main one: (prefix, fill template), first use order.
    pub fn extra_fills(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for name in &self.commands {
            let c = self.command(name);
            if let (Some(prefix), Some(fill)) = (c.prefix, c.fill) {
                if prefix != self.key_prefix && !out.iter().any(|(p, _)| *p == prefix) {
                    out.push((prefix, fill));
                }
            }
        }
        out
    }
}

fn command_line(v: &str) -> Result<CommandSpec, String> {
    let mut parts = v.split('|').map(str::trim);
    let name = parts.next().unwrap_or("").to_lowercase();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
    {
        return Err(format!(
            "command name '{name}' must be non-empty [A-Za-z0-9_-]"
        ));
    }
    let words = |t: &str| t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let args = words(parts.next().unwrap_or(""));
    if !args.iter().any(|a| a == "__key__") {
        return Err(format!("command {name}: the template needs a __key__"));
    }
    let mut c = CommandSpec {
        name: name.clone(),
        args,
        is_read: false,
        distinct_keys: false,
        prefix: None,
        fill: None,
    };
    for option in parts {
        match option.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            None if option == "read" => c.is_read = true,
            None if option == "distinct_keys" => c.distinct_keys = true,
            Some(("prefix", p)) if !p.is_empty() => c.prefix = Some(p.into()),
            Some(("fill", t)) if words(t).iter().any(|a| a == "__key__") => c.fill = Some(words(t)),
            _ => return Err(format!("command {name}: bad option '{option}'")),
        }
    }
    if c.fill.is_some() && c.prefix.is_none() {
        return Err(format!("command {name}: fill= needs its own prefix="));
    }
    Ok(c)
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
            "command" => c.command_specs.push(command_line(value)?),
            "key_pattern" => {
                c.key_pattern = match value {
                    "R" | "R:R" => KeyPattern::Random,
                    "G" | "G:G" => KeyPattern::Gaussian,
                    _ => return Err(format!("key_pattern: '{value}' is not R or G")),
                }
            }
            "server_args" => {
                let (name, args) = value
                    .split_once('|')
                    .map(|(n, a)| (n.trim(), a.trim()))
                    .ok_or_else(|| format!("line {}: server_args = NAME | ARGS", n + 1))?;
                let server = c
                    .servers
                    .iter_mut()
                    .find(|s| s.name == name)
                    .ok_or_else(|| format!("line {}: server_args before server '{name}'", n + 1))?;
                server.command = format!("{} {args}", server.command);
            }
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
    let mut defined: Vec<&str> = c.command_specs.iter().map(|s| s.name.as_str()).collect();
    defined.sort_unstable();
    let count = defined.len();
    defined.dedup();
    if defined.len() != count {
        return Err("command names must be unique".into());
    }
    if let Some(bad) = c
        .commands
        .iter()
        .find(|m| !matches!(m.as_str(), "get" | "set") && !defined.contains(&m.as_str()))
    {
        return Err(format!(
            "commands: '{bad}' is neither get, set nor defined by a command = line"
        ));
    }
    let mut fills: Vec<(String, Option<Vec<String>>)> = Vec::new();
    for name in &c.commands {
        let spec = c.command(name);
        if let Some(prefix) = spec.prefix {
            match fills.iter().find(|(p, _)| *p == prefix) {
                Some((_, fill)) if *fill != spec.fill => {
                    return Err(format!("prefix {prefix}: commands disagree on its fill"))
                }
                Some(_) => {}
                None => fills.push((prefix, spec.fill)),
            }
        }
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

    // Proves command templates, their options, key_pattern and server_args parse, and that
    // builtins and own keyspaces resolve as documented.
    #[test]
    fn parses_command_templates() {
        let c = parse(
            "commands = get, incr, mget, pfadd
key_pattern = G:G
             command = incr | INCR __key__ | prefix=counter- | fill=SET __key__ 1
             command = MGET | MGET __key__ __key__ __key__ | read | distinct_keys
             command = pfadd | PFADD __key__ __rand__ | prefix=hll- | fill=PFADD __key__ __rand__
             server = lavik | 7002 | /x/lavik --port {port}
             server_args = lavik | --cache-size 0
",
        )
        .unwrap();
        assert_eq!(c.key_pattern, KeyPattern::Gaussian);
        assert_eq!(c.servers[0].command, "/x/lavik --port 7002 --cache-size 0");
        let get = c.command("get");
        assert!(get.is_builtin() && get.is_read);
        assert_eq!(get.keys_per_request(), 1);
        let incr = c.command("incr");
        assert_eq!(incr.args, vec!["INCR", "__key__"]);
        assert_eq!(c.prefix_of("incr"), "counter-");
        assert_eq!(c.prefix_of("get"), "memtier-");
        let mget = c.command("mget");
        assert!(mget.is_read && mget.distinct_keys);
        assert_eq!(mget.keys_per_request(), 3);
        assert_eq!(
            c.extra_fills(),
            vec![
                (
                    "counter-".to_string(),
                    vec!["SET".to_string(), "__key__".into(), "1".into()]
                ),
                (
                    "hll-".to_string(),
                    vec!["PFADD".to_string(), "__key__".into(), "__rand__".into()]
                ),
            ]
        );
    }

    // Proves malformed command definitions and uses are rejected.
    #[test]
    fn rejects_bad_commands() {
        let server = "server = a | 1 | x
";
        for bad in [
            format!(
                "{server}commands = incr
command = incr | INCR k
"
            ),
            format!(
                "{server}commands = incr
command = incr | INCR __key__ | bogus
"
            ),
            format!(
                "{server}commands = incr
command = incr | INCR __key__ | fill=SET __key__ 1
"
            ),
            format!(
                "{server}commands = x
command = x | GET __key__
command = X | GET __key__
"
            ),
            format!(
                "{server}commands = a,b
command = a | INCR __key__ | prefix=c- | fill=SET __key__ 1
                 command = b | DECR __key__ | prefix=c- | fill=SET __key__ 2
"
            ),
            format!(
                "{server}key_pattern = S
"
            ),
            format!(
                "server_args = a | --x
{server}"
            ),
        ] {
            assert!(parse(&bad).is_err(), "accepted: {bad}");
        }
    }

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
