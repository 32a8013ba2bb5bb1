//! memtier_benchmark-compatible command-line options.
//!
//! The published fill / warm-up / sweep scripts call memtier_benchmark; they must run with
//! only the binary name changed. memtier parses with `getopt_long`, so we accept the same
//! spellings: `--name=value`, `--name value`, `-x value`, `-xvalue`, and options in any
//! order. Order matters for one thing, as in memtier: `--command-ratio`,
//! `--command-key-pattern` and `--command-is-read` apply to the most recent `--command`.
//!
//! Deliberately missing: memcache protocols, TLS, authentication, cluster mode, arbitrary
//! data-size lists/ranges, `--reconnect-interval`. They are rejected with a clear error
//! rather than silently ignored, so a script never measures something other than it asked.

use std::fmt;

/// How keys are chosen for one kind of request (memtier's `--key-pattern` letters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyPattern {
    /// `S`: each client walks the whole key range in order, wrapping.
    Sequential,
    /// `R`: uniform random over the key range.
    Random,
    /// `G`: Gaussian around `--key-median` with `--key-stddev`, clamped to the range.
    Gaussian,
    /// `P`: the range is split into one contiguous slice per client (across all threads);
    /// each client walks its own slice in order, so together they cover it exactly once.
    Parallel,
}

impl KeyPattern {
    fn parse(letter: &str) -> Result<Self, OptionError> {
        match letter {
            "S" => Ok(Self::Sequential),
            "R" => Ok(Self::Random),
            "G" => Ok(Self::Gaussian),
            "P" => Ok(Self::Parallel),
            other => Err(OptionError(format!(
                "unknown key pattern '{other}' (want S, R, G or P)"
            ))),
        }
    }

    pub fn letter(self) -> char {
        match self {
            Self::Sequential => 'S',
            Self::Random => 'R',
            Self::Gaussian => 'G',
            Self::Parallel => 'P',
        }
    }
}

/// How many requests each client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requests {
    /// A fixed number per client.
    PerClient(u64),
    /// memtier's `allkeys`: each client sends as many requests as its share of the key
    /// range (with `P` patterns: exactly its slice).
    AllKeys,
}

/// One user-supplied `--command` template, e.g. `SET __key__ __data__`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandTemplate {
    /// Arguments as split on whitespace; `__key__` / `__data__` are substituted per request.
    pub args: Vec<String>,
    /// Relative weight among the commands (`--command-ratio`, default 1).
    pub ratio: u32,
    pub key_pattern: KeyPattern,
    /// Count nil replies as misses and others as hits (`--command-is-read`).
    pub is_read: bool,
    /// Each `__key__` of one request gets its own key (`--command-distinct-keys`, not a
    /// memtier option; memtier repeats one key), e.g. MGET of 10 different keys.
    pub distinct_keys: bool,
}

impl CommandTemplate {
    /// Name shown in reports: the command word, capitalised like memtier ("Get", "Hset").
    pub fn display_name(&self) -> String {
        let word = self.args.first().map(String::as_str).unwrap_or("");
        let mut name = String::with_capacity(word.len());
        for (i, c) in word.chars().enumerate() {
            if i == 0 {
                name.extend(c.to_uppercase());
            } else {
                name.extend(c.to_lowercase());
            }
        }
        name
    }
}

/// The parsed, validated benchmark configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    pub server: String,
    pub port: u16,
    pub threads: u32,
    pub clients_per_thread: u32,
    pub requests: Requests,
    /// When set, run for this long and ignore `requests`.
    pub test_time_secs: Option<u64>,
    /// SET:GET weights (`--ratio`).
    pub ratio_set: u32,
    pub ratio_get: u32,
    pub pipeline: u32,
    pub key_pattern_set: KeyPattern,
    pub key_pattern_get: KeyPattern,
    pub key_minimum: u64,
    pub key_maximum: u64,
    pub key_prefix: String,
    pub key_median: Option<f64>,
    pub key_stddev: Option<f64>,
    pub data_size_bytes: usize,
    pub distinct_client_seed: bool,
    pub randomize: bool,
    pub run_count: u32,
    pub commands: Vec<CommandTemplate>,
    pub print_percentiles: Vec<f64>,
    pub hide_histogram: bool,
    pub json_out_file: Option<String>,
    pub out_file: Option<String>,
    pub show_config: bool,
    /// No progress line (not a memtier option; useful when output goes to a log).
    pub hide_progress: bool,
}

impl Default for BenchOptions {
    /// memtier_benchmark's defaults.
    fn default() -> Self {
        Self {
            server: "localhost".into(),
            port: 6379,
            threads: 4,
            clients_per_thread: 50,
            requests: Requests::PerClient(10_000),
            test_time_secs: None,
            ratio_set: 1,
            ratio_get: 10,
            pipeline: 1,
            key_pattern_set: KeyPattern::Random,
            key_pattern_get: KeyPattern::Random,
            key_minimum: 0,
            key_maximum: 10_000_000,
            key_prefix: "memtier-".into(),
            key_median: None,
            key_stddev: None,
            data_size_bytes: 32,
            distinct_client_seed: false,
            randomize: false,
            run_count: 1,
            commands: Vec::new(),
            print_percentiles: vec![50.0, 99.0, 99.9],
            hide_histogram: false,
            json_out_file: None,
            out_file: None,
            show_config: false,
            hide_progress: false,
        }
    }
}

impl BenchOptions {
    pub fn total_clients(&self) -> u64 {
        u64::from(self.threads) * u64::from(self.clients_per_thread)
    }

    /// Number of keys in `[key_minimum, key_maximum]`.
    pub fn key_count(&self) -> u64 {
        self.key_maximum - self.key_minimum + 1
    }

    pub fn median(&self) -> f64 {
        self.key_median
            .unwrap_or((self.key_minimum as f64 + self.key_maximum as f64) / 2.0)
    }

    pub fn stddev(&self) -> f64 {
        self.key_stddev.unwrap_or(self.key_count() as f64 / 6.0)
    }

    fn validate(&self) -> Result<(), OptionError> {
        let fail = |m: &str| Err(OptionError(m.to_string()));
        if self.threads == 0 || self.clients_per_thread == 0 {
            return fail("--threads and --clients must be at least 1");
        }
        if self.run_count == 0 {
            return fail("--run-count must be at least 1");
        }
        if self.pipeline == 0 {
            return fail("--pipeline must be at least 1");
        }
        if self.key_minimum > self.key_maximum {
            return fail("--key-minimum must not exceed --key-maximum");
        }
        if self.commands.is_empty() && self.ratio_set == 0 && self.ratio_get == 0 {
            return fail("--ratio 0:0 sends nothing");
        }
        if self.requests == Requests::AllKeys && self.key_count() < self.total_clients() {
            return fail("--requests=allkeys needs at least one key per client");
        }
        if self
            .print_percentiles
            .iter()
            .any(|p| !(0.0..=100.0).contains(p))
        {
            return fail("--print-percentiles values must be within 0..100");
        }
        if !self.commands.is_empty() && self.commands.iter().all(|c| c.ratio == 0) {
            return fail("every --command has ratio 0");
        }
        Ok(())
    }

    /// The configuration as memtier's `--show-config` lists it (name = value lines).
    pub fn describe(&self) -> String {
        let requests = match self.requests {
            Requests::PerClient(n) => n.to_string(),
            Requests::AllKeys => "allkeys".into(),
        };
        let mut lines = vec![
            format!("server = {}", self.server),
            format!("port = {}", self.port),
            "protocol = redis".to_string(),
            format!("threads = {}", self.threads),
            format!("clients = {}", self.clients_per_thread),
            format!("requests = {requests}"),
            format!("test_time = {}", self.test_time_secs.unwrap_or(0)),
            format!("ratio = {}:{}", self.ratio_set, self.ratio_get),
            format!("pipeline = {}", self.pipeline),
            format!(
                "key_pattern = {}:{}",
                self.key_pattern_set.letter(),
                self.key_pattern_get.letter()
            ),
            format!("key_minimum = {}", self.key_minimum),
            format!("key_maximum = {}", self.key_maximum),
            format!("key_prefix = {}", self.key_prefix),
            format!("key_median = {}", self.median()),
            format!("key_stddev = {}", self.stddev()),
            format!("data_size = {}", self.data_size_bytes),
            format!("distinct_client_seed = {}", self.distinct_client_seed),
            format!("randomize = {}", self.randomize),
            format!("run_count = {}", self.run_count),
            format!("print-percentiles = {:?}", self.print_percentiles),
            format!("hide_histogram = {}", self.hide_histogram),
            format!(
                "json_out_file = {}",
                self.json_out_file.as_deref().unwrap_or("")
            ),
        ];
        for c in &self.commands {
            lines.push(format!(
                "command = {} (ratio {}, key pattern {}, read {}, distinct keys {})",
                c.args.join(" "),
                c.ratio,
                c.key_pattern.letter(),
                c.is_read,
                c.distinct_keys
            ));
        }
        lines.join("\n")
    }
}

/// A command-line error, shown to the user with the usage hint.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionError(pub String);

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Result of parsing: run with options, or print help.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(Box<BenchOptions>),
    Help,
}

/// Options that take a value: (long name, short letter).
const VALUED: &[(&str, Option<char>)] = &[
    ("server", Some('s')),
    ("port", Some('p')),
    ("protocol", Some('P')),
    ("threads", Some('t')),
    ("clients", Some('c')),
    ("requests", Some('n')),
    ("test-time", None),
    ("ratio", None),
    ("pipeline", None),
    ("key-pattern", None),
    ("key-minimum", None),
    ("key-maximum", None),
    ("key-prefix", None),
    ("key-median", None),
    ("key-stddev", None),
    ("data-size", Some('d')),
    ("run-count", Some('x')),
    ("command", None),
    ("command-ratio", None),
    ("command-key-pattern", None),
    ("print-percentiles", None),
    ("json-out-file", None),
    ("out-file", Some('o')),
];

/// Options that are plain switches.
const SWITCHES: &[(&str, Option<char>)] = &[
    ("distinct-client-seed", None),
    ("randomize", None),
    ("hide-histogram", None),
    ("show-config", None),
    ("command-is-read", None),
    ("command-distinct-keys", None),
    ("hide-progress", None),
    ("help", Some('h')),
];

fn lookup_long(name: &str) -> Option<(&'static str, bool)> {
    let valued = VALUED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, _)| (*n, true));
    valued.or_else(|| {
        SWITCHES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, _)| (*n, false))
    })
}

fn lookup_short(letter: char) -> Option<(&'static str, bool)> {
    let valued = VALUED
        .iter()
        .find(|(_, s)| *s == Some(letter))
        .map(|(n, _)| (*n, true));
    valued.or_else(|| {
        SWITCHES
            .iter()
            .find(|(_, s)| *s == Some(letter))
            .map(|(n, _)| (*n, false))
    })
}

/// Split argv (without the program name) into (option name, value) pairs in order.
fn tokenize(args: &[String]) -> Result<Vec<(&'static str, Option<String>)>, OptionError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let (name, takes_value, inline) = if let Some(long) = arg.strip_prefix("--") {
            let (n, v) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let (name, takes) =
                lookup_long(n).ok_or_else(|| OptionError(format!("unknown option --{n}")))?;
            (name, takes, v)
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let letter = short.chars().next().unwrap_or('-');
            let (name, takes) = lookup_short(letter)
                .ok_or_else(|| OptionError(format!("unknown option -{letter}")))?;
            let rest = &short[letter.len_utf8()..];
            (name, takes, (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            return Err(OptionError(format!("unexpected argument '{arg}'")));
        };
        let value = match (takes_value, inline) {
            (true, Some(v)) => Some(v),
            (true, None) => {
                let v = args
                    .get(i)
                    .ok_or_else(|| OptionError(format!("option --{name} needs a value")))?;
                i += 1;
                Some(v.clone())
            }
            (false, Some(_)) => return Err(OptionError(format!("option --{name} takes no value"))),
            (false, None) => None,
        };
        out.push((name, value));
    }
    Ok(out)
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, OptionError> {
    value
        .trim()
        .parse()
        .map_err(|_| OptionError(format!("--{name}: '{value}' is not a valid number")))
}

fn pair(name: &str, value: &str) -> Result<(String, String), OptionError> {
    value
        .split_once(':')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .ok_or_else(|| OptionError(format!("--{name}: expected A:B, got '{value}'")))
}

fn last_command<'a>(
    o: &'a mut BenchOptions,
    name: &str,
) -> Result<&'a mut CommandTemplate, OptionError> {
    o.commands
        .last_mut()
        .ok_or_else(|| OptionError(format!("--{name} must follow a --command")))
}

/// Apply one option to `o`. Returns false for `--help`.
fn apply(o: &mut BenchOptions, name: &str, value: Option<String>) -> Result<bool, OptionError> {
    let v = value.unwrap_or_default();
    match name {
        "server" => o.server = v,
        "port" => o.port = number(name, &v)?,
        "protocol" => {
            if !matches!(v.as_str(), "redis" | "resp2") {
                return Err(OptionError(format!(
                    "--protocol {v} is not supported (redis only)"
                )));
            }
        }
        "threads" => o.threads = number(name, &v)?,
        "clients" => o.clients_per_thread = number(name, &v)?,
        "requests" => {
            o.requests = if v == "allkeys" {
                Requests::AllKeys
            } else {
                Requests::PerClient(number(name, &v)?)
            }
        }
        "test-time" => o.test_time_secs = Some(number(name, &v)?),
        "ratio" => {
            let (s, g) = pair(name, &v)?;
            o.ratio_set = number(name, &s)?;
            o.ratio_get = number(name, &g)?;
        }
        "pipeline" => o.pipeline = number(name, &v)?,
        "key-pattern" => {
            let (s, g) = pair(name, &v)?;
            o.key_pattern_set = KeyPattern::parse(&s)?;
            o.key_pattern_get = KeyPattern::parse(&g)?;
        }
        "key-minimum" => o.key_minimum = number(name, &v)?,
        "key-maximum" => o.key_maximum = number(name, &v)?,
        "key-prefix" => o.key_prefix = v,
        "key-median" => o.key_median = Some(number(name, &v)?),
        "key-stddev" => o.key_stddev = Some(number(name, &v)?),
        "data-size" => o.data_size_bytes = number(name, &v)?,
        "run-count" => o.run_count = number(name, &v)?,
        "command" => {
            let args: Vec<String> = v.split_whitespace().map(str::to_string).collect();
            if args.is_empty() {
                return Err(OptionError("--command is empty".into()));
            }
            o.commands.push(CommandTemplate {
                args,
                ratio: 1,
                key_pattern: KeyPattern::Random,
                is_read: false,
                distinct_keys: false,
            });
        }
        "command-ratio" => last_command(o, name)?.ratio = number(name, &v)?,
        "command-key-pattern" => last_command(o, name)?.key_pattern = KeyPattern::parse(&v)?,
        "command-is-read" => last_command(o, name)?.is_read = true,
        "command-distinct-keys" => last_command(o, name)?.distinct_keys = true,
        "print-percentiles" => {
            o.print_percentiles = v
                .split(',')
                .map(|p| number(name, p))
                .collect::<Result<_, _>>()?
        }
        "json-out-file" => o.json_out_file = Some(v),
        "out-file" => o.out_file = Some(v),
        "distinct-client-seed" => o.distinct_client_seed = true,
        "randomize" => o.randomize = true,
        "hide-histogram" => o.hide_histogram = true,
        "show-config" => o.show_config = true,
        "hide-progress" => o.hide_progress = true,
        "help" => return Ok(false),
        other => unreachable!("option table and apply() disagree on --{other}"),
    }
    Ok(true)
}

/// Parse memtier-style arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Parsed, OptionError> {
    let mut o = BenchOptions::default();
    for (name, value) in tokenize(args)? {
        if !apply(&mut o, name, value)? {
            return Ok(Parsed::Help);
        }
    }
    o.validate()?;
    Ok(Parsed::Run(Box::new(o)))
}

pub const USAGE: &str = "\
Usage: lavik-bench [options]            (memtier_benchmark-compatible)
       lavik-bench sweep --config FILE  (server comparison sweep, see tools/sweep/)

  -s, --server=ADDR            server address (default localhost)
  -p, --port=PORT              server port (default 6379)
  -P, --protocol=redis         only RESP is supported
  -t, --threads=N              client threads (default 4)
  -c, --clients=N              connections per thread (default 50)
  -n, --requests=N|allkeys     requests per client (default 10000)
      --test-time=SECS         run for SECS seconds instead of a request count
      --ratio=SET:GET          SET to GET ratio (default 1:10)
      --pipeline=N             outstanding requests per connection (default 1)
      --key-pattern=S:G        key patterns for SET:GET, letters S R G P (default R:R)
      --key-minimum=N          (default 0)
      --key-maximum=N          (default 10000000)
      --key-prefix=STR         (default memtier-)
      --key-median=N, --key-stddev=N   for the G pattern
  -d, --data-size=BYTES        value size (default 32)
      --distinct-client-seed   a different random seed per client
      --randomize              seed from the clock
  -x, --run-count=N            repeat the run N times
      --command=\"CMD __key__ __data__\"   arbitrary command (repeatable)
      --command-ratio=N, --command-key-pattern=S|R|G|P, --command-is-read
                               apply to the preceding --command
      --command-distinct-keys  (not memtier) each __key__ of the preceding --command
                               draws its own key; __rand__ is a random number
      --print-percentiles=50,99,99.9
      --hide-histogram         no latency distribution table
      --json-out-file=FILE     memtier-style JSON results
  -o, --out-file=FILE          also write the text report to FILE
      --show-config            print the configuration before running
      --hide-progress          no progress line on stderr
";

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn run(s: &[&str]) -> BenchOptions {
        match parse(&args(s)).expect("valid options") {
            Parsed::Run(o) => *o,
            Parsed::Help => panic!("unexpected help"),
        }
    }

    // Proves that no options at all yields memtier's documented defaults.
    #[test]
    fn defaults_match_memtier() {
        let o = run(&[]);
        assert_eq!((o.threads, o.clients_per_thread, o.pipeline), (4, 50, 1));
        assert_eq!((o.ratio_set, o.ratio_get), (1, 10));
        assert_eq!(o.requests, Requests::PerClient(10_000));
        assert_eq!((o.key_minimum, o.key_maximum), (0, 10_000_000));
        assert_eq!(o.key_prefix, "memtier-");
        assert_eq!(o.data_size_bytes, 32);
        assert_eq!(o.print_percentiles, vec![50.0, 99.0, 99.9]);
    }

    // Proves a typical published fill command line parses with both `=` and space forms.
    #[test]
    fn parses_memtier_fill_line() {
        let o = run(&[
            "--server=127.0.0.1",
            "--port",
            "7379",
            "-t",
            "2",
            "-c50",
            "--requests=allkeys",
            "--ratio=1:0",
            "--key-pattern=P:P",
            "--key-minimum=1",
            "--key-maximum=1000000",
            "--key-prefix=k:",
            "--data-size=1024",
            "--pipeline=16",
            "--distinct-client-seed",
            "--hide-histogram",
            "--print-percentiles=50,99,99.9,99.99",
            "--json-out-file=/tmp/x.json",
            "--show-config",
        ]);
        assert_eq!(o.server, "127.0.0.1");
        assert_eq!(o.port, 7379);
        assert_eq!((o.threads, o.clients_per_thread), (2, 50));
        assert_eq!(o.requests, Requests::AllKeys);
        assert_eq!((o.ratio_set, o.ratio_get), (1, 0));
        assert_eq!(o.key_pattern_set, KeyPattern::Parallel);
        assert_eq!(o.key_pattern_get, KeyPattern::Parallel);
        assert_eq!((o.key_minimum, o.key_maximum), (1, 1_000_000));
        assert_eq!(o.key_prefix, "k:");
        assert_eq!(o.data_size_bytes, 1024);
        assert_eq!(o.pipeline, 16);
        assert!(o.distinct_client_seed && o.hide_histogram && o.show_config);
        assert_eq!(o.print_percentiles, vec![50.0, 99.0, 99.9, 99.99]);
        assert_eq!(o.json_out_file.as_deref(), Some("/tmp/x.json"));
    }

    // Proves --command-* modifiers attach to the most recent --command, as in memtier.
    #[test]
    fn command_modifiers_attach_to_last_command() {
        let o = run(&[
            "--command=SET __key__ __data__",
            "--command-ratio=2",
            "--command-key-pattern=P",
            "--command",
            "GET __key__",
            "--command-is-read",
            "--test-time=5",
        ]);
        assert_eq!(o.commands.len(), 2);
        assert_eq!(o.commands[0].args, vec!["SET", "__key__", "__data__"]);
        assert_eq!(o.commands[0].ratio, 2);
        assert_eq!(o.commands[0].key_pattern, KeyPattern::Parallel);
        assert!(!o.commands[0].is_read);
        assert_eq!(o.commands[1].key_pattern, KeyPattern::Random);
        assert!(o.commands[1].is_read);
        assert_eq!(o.commands[1].display_name(), "Get");
        assert_eq!(o.test_time_secs, Some(5));
    }

    // Proves malformed or unsupported input is rejected with an error, never ignored.
    #[test]
    fn rejects_bad_input() {
        let bad: &[&[&str]] = &[
            &["--ratio=1"],
            &["--key-pattern=X:R"],
            &["--port=notaport"],
            &["--threads=0"],
            &["--pipeline=0"],
            &["--bogus"],
            &["--command-ratio=3"],
            &["--protocol=memcache_text"],
            &["--key-minimum=10", "--key-maximum=5"],
            &["--ratio=0:0"],
            &["-c"],
            &["--hide-histogram=yes"],
            &[
                "-c",
                "10",
                "-t",
                "1",
                "--requests=allkeys",
                "--key-maximum=5",
            ],
            &["--print-percentiles=50,101"],
            &["--command=GET __key__", "--command-ratio=0"],
            &["--run-count=0"],
        ];
        for case in bad {
            assert!(parse(&args(case)).is_err(), "accepted {case:?}");
        }
    }

    // Proves --help is recognised in both spellings.
    #[test]
    fn help() {
        assert_eq!(parse(&args(&["--help"])), Ok(Parsed::Help));
        assert_eq!(parse(&args(&["-h"])), Ok(Parsed::Help));
    }
}
