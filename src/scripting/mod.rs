//! Lua scripting: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT, with Redis 7's semantics.
//!
//! What this module owns:
//!
//! - **One Lua 5.1 state per worker thread** (`Engine`, created lazily in a thread-local), with
//!   the sandbox Redis 7 gives scripts: no `os`/`io`/`dofile`/`loadfile`/`print`, the global
//!   table and every library table read-only ("Attempt to modify a readonly table"), a read of
//!   a missing global is an error ("Script attempted to access nonexistent global variable"),
//!   the `redis` API and the `cjson`, `cmsgpack`, `bit` and `struct` libraries (in Rust).
//! - **The script catalog** (`Catalog`): every script any worker has seen through EVAL or
//!   SCRIPT LOAD, by SHA1, shared by all workers through `server::Shared`. A worker compiles a
//!   script into its own state on first use (EVAL carries the body; EVALSHA finds it in the
//!   catalog). SCRIPT FLUSH empties the catalog and bumps its generation; each engine drops
//!   its compiled functions when it sees a new generation.
//! - **Conversions** (`convert`): inner command replies (RESP bytes written by the handlers)
//!   to Lua values, and the script's return value to the client's RESP2/RESP3 reply.
//!
//! Invariants:
//!
//! - A script runs inside one keyed-command handler call, on the `Ctx` the router built for
//!   the keys EVAL declared (`numkeys` movable keys): it is atomic like any multi-key command.
//!   `redis.call` runs the inner command's handler on that same `Ctx`, and only for keys the
//!   script declared: any other key fails with Redis Cluster's text ("Script attempted to
//!   access a non local key in a cluster node"), whether or not its shard happens to be held.
//!   That keeps the promise the asynchronous execution path relies on: a command touches only
//!   the keys at its declared positions.
//! - Nothing a script does can outlive its call: the `redis.call` closures borrow the `Ctx`
//!   for the call only (an `mlua` scope) and globals cannot be written.
//!
//! - **Functions** (`functions`): the library catalog in `Catalog::functions`, durable in a
//!   file beside the data file; each engine compiles the libraries itself.
//! - **Running scripts** (`Catalog::script_started`): what SCRIPT KILL, FUNCTION KILL,
//!   FUNCTION STATS and the workers' `-BUSY` check (`busy-reply-threshold`) look at.
//!
//! - **Busy rounds**: past `busy-reply-threshold` the instruction hook asks the worker, through
//!   the run's `Ctx::busy_round`, to answer its other connections once (-BUSY, SCRIPT KILL,
//!   FUNCTION KILL, SHUTDOWN NOSAVE), as Redis processes events from its script hook.
//!
//! Deliberately missing (see `docs/scripting.md`): a script that misses a page after its
//! first write still reads it synchronously (no suspension of the Lua run), the script debugger,
//! calling connection/server commands (PING, INFO, ...) or whole-keyspace commands from a
//! script, and `math.random`'s sequence is per worker (Redis has one per server).

pub mod bit;
pub mod cjson;
pub mod cmsgpack;
pub mod convert;
mod engine;
pub mod functions;
pub mod structlib;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use engine::{Engine, EvalMode, Invocation};

/// Error texts shared with the command handlers.
pub mod engine_errors {
    pub use super::engine::ERR_NOSCRIPT as NOSCRIPT;
}

/// Script id: the SHA1 of the body, 40 lowercase hex digits.
pub type Sha = [u8; 40];

pub fn sha1_hex(body: &[u8]) -> Sha {
    use sha1::{Digest, Sha1};
    let digest = Sha1::digest(body);
    let mut out = [0u8; 40];
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in digest.iter().enumerate() {
        out[2 * i] = HEX[(b >> 4) as usize];
        out[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out
}

/// A user-given SHA, lowercased; `None` unless it is 40 bytes long (Redis: NOSCRIPT then).
pub fn parse_sha(arg: &[u8]) -> Option<Sha> {
    let mut out: Sha = arg.try_into().ok()?;
    out.make_ascii_lowercase();
    Some(out)
}

/// The server-wide script catalog (in `server::Shared`).
pub struct Catalog {
    bodies: Mutex<HashMap<Sha, Arc<[u8]>>>,
    /// Bumped by every SCRIPT FLUSH; engines compare it to drop stale compiled scripts.
    generation: AtomicU64,
    /// Scripts and functions running now (one per worker at most); `running` counts them
    /// so the per-command busy check is one atomic load while nothing runs.
    runs: Mutex<Vec<Run>>,
    running: AtomicUsize,
    next_run: AtomicU64,
    /// `busy-reply-threshold` (alias `lua-time-limit`), in milliseconds.
    busy_threshold_ms: AtomicU64,
    /// The function libraries (FUNCTION LOAD ...), durable.
    pub functions: functions::Libraries,
}

/// `busy-reply-threshold`'s default (Redis's `lua-time-limit` default).
pub const BUSY_THRESHOLD_DEFAULT_MS: u64 = 5000;

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            bodies: Mutex::default(),
            generation: AtomicU64::new(0),
            runs: Mutex::default(),
            running: AtomicUsize::new(0),
            next_run: AtomicU64::new(1),
            busy_threshold_ms: AtomicU64::new(BUSY_THRESHOLD_DEFAULT_MS),
            functions: functions::Libraries::default(),
        }
    }
}

/// One running script or function.
struct Run {
    id: u64,
    started: Instant,
    /// The function's name (FCALL); `None` for EVAL and friends.
    function: Option<String>,
    /// The calling command (FUNCTION STATS shows it).
    command: Vec<Vec<u8>>,
    wrote: bool,
    kill: bool,
}

/// What FUNCTION STATS shows about a running function.
pub struct RunningFunction {
    pub name: String,
    pub command: Vec<Vec<u8>>,
    pub duration_ms: u64,
}

/// SCRIPT KILL's / FUNCTION KILL's answer.
#[derive(Debug, PartialEq, Eq)]
pub enum KillOutcome {
    Requested,
    NotBusy,
    Unkillable,
    /// SCRIPT KILL found a function running (`true`), or FUNCTION KILL a script (`false`).
    WrongKind {
        function_running: bool,
    },
}

pub const ERR_BUSY_EVAL: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
pub const ERR_BUSY_FUNCTION: &str =
    "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.";

impl Catalog {
    pub fn insert(&self, sha: Sha, body: &[u8]) {
        let mut map = self.bodies.lock().expect("script catalog lock");
        map.entry(sha).or_insert_with(|| Arc::from(body));
    }

    pub fn get(&self, sha: &Sha) -> Option<Arc<[u8]>> {
        self.bodies
            .lock()
            .expect("script catalog lock")
            .get(sha)
            .cloned()
    }

    pub fn contains(&self, sha: &Sha) -> bool {
        self.bodies
            .lock()
            .expect("script catalog lock")
            .contains_key(sha)
    }

    pub fn flush(&self) {
        let mut map = self.bodies.lock().expect("script catalog lock");
        map.clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, Vec<Run>> {
        self.runs.lock().expect("script runs lock")
    }

    /// Registers a run; the id goes to `script_wrote`, `take_kill_request`, `script_ended`.
    pub(crate) fn script_started(
        &self,
        function: Option<String>,
        command: Vec<Vec<u8>>,
    ) -> (u64, Instant) {
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        self.runs().push(Run {
            id,
            started,
            function,
            command,
            wrote: false,
            kill: false,
        });
        self.running.fetch_add(1, Ordering::AcqRel);
        (id, started)
    }

    pub(crate) fn script_wrote(&self, id: u64) {
        if let Some(r) = self.runs().iter_mut().find(|r| r.id == id) {
            r.wrote = true;
        }
    }

    pub(crate) fn script_ended(&self, id: u64) {
        self.runs().retain(|r| r.id != id);
        self.running.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a kill was asked for run `id` (checked by the engine's instruction hook).
    pub(crate) fn take_kill_request(&self, id: u64) -> bool {
        self.running.load(Ordering::Acquire) > 0
            && self.runs().iter().any(|r| r.id == id && r.kill && !r.wrote)
    }

    /// SCRIPT KILL (`function == false`) or FUNCTION KILL: asks the oldest running script
    /// to stop, with Redis's checks in Redis's order.
    pub fn request_kill(&self, function: bool) -> KillOutcome {
        let mut runs = self.runs();
        let Some(r) = runs.first_mut() else {
            return KillOutcome::NotBusy;
        };
        if r.wrote {
            return KillOutcome::Unkillable;
        }
        if r.function.is_some() != function {
            return KillOutcome::WrongKind {
                function_running: r.function.is_some(),
            };
        }
        r.kill = true;
        KillOutcome::Requested
    }

    pub fn busy_threshold_ms(&self) -> u64 {
        self.busy_threshold_ms.load(Ordering::Relaxed)
    }

    pub fn set_busy_threshold_ms(&self, ms: u64) {
        self.busy_threshold_ms.store(ms, Ordering::Relaxed);
    }

    /// The -BUSY error other commands get while a script has run longer than
    /// `busy-reply-threshold` (`None` when none has).
    pub fn busy_error(&self) -> Option<&'static str> {
        if self.running.load(Ordering::Acquire) == 0 {
            return None;
        }
        let threshold = Duration::from_millis(self.busy_threshold_ms());
        let runs = self.runs();
        let r = runs.iter().find(|r| r.started.elapsed() >= threshold)?;
        Some(if r.function.is_some() {
            ERR_BUSY_FUNCTION
        } else {
            ERR_BUSY_EVAL
        })
    }

    /// Whether an EVAL-family script (not a function) is running now.
    pub fn eval_running(&self) -> bool {
        self.running.load(Ordering::Acquire) > 0 && self.runs().iter().any(|r| r.function.is_none())
    }

    /// The running function, for FUNCTION STATS.
    pub fn running_function(&self) -> Option<RunningFunction> {
        if self.running.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.runs().iter().find_map(|r| {
            r.function.as_ref().map(|name| RunningFunction {
                name: name.clone(),
                command: r.command.clone(),
                duration_ms: r.started.elapsed().as_millis() as u64,
            })
        })
    }

    pub fn len(&self) -> usize {
        self.bodies.lock().expect("script catalog lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Commands Redis runs while a script is busy (`allow_busy`); the rest get -BUSY (EXEC
/// -EXECABORT with the -BUSY text, as Redis's `rejectCommand`).
pub fn allowed_while_busy(name: &str, args: &[&[u8]]) -> bool {
    let sub = |s: &str| {
        args.get(1)
            .is_some_and(|a| a.eq_ignore_ascii_case(s.as_bytes()))
    };
    match name {
        "auth" | "hello" | "quit" | "reset" | "multi" | "discard" | "watch" | "unwatch"
        | "replconf" => true,
        // Redis's `shutdownCommand` answers -BUSY itself unless NOSAVE is given.
        "shutdown" => args[1..].iter().any(|a| a.eq_ignore_ascii_case(b"nosave")),
        "script" => sub("kill"),
        "function" => sub("kill") || sub("stats"),
        _ => false,
    }
}

/// Startup: opens the function catalog's durable file at `path` and loads the libraries
/// it holds (evaluated in a temporary Lua state, for their functions' metadata).
pub fn open_function_file(
    catalog: &Arc<Catalog>,
    path: std::path::PathBuf,
) -> Result<usize, String> {
    let codes = catalog
        .functions
        .open(path)
        .map_err(|e| format!("function catalog: {e}"))?;
    if codes.is_empty() {
        return Ok(0);
    }
    let mut engine = Engine::new(catalog.clone()).map_err(|e| format!("Lua init: {e}"))?;
    let libs = engine
        .evaluate_libraries(&codes)
        .map_err(|e| format!("function catalog: {e}"))?;
    let n = libs.len();
    catalog.functions.recovered(libs);
    Ok(n)
}

/// Stack a thread running scripts needs: the nesting limits Redis sets (cjson and reply
/// conversion both allow 1000 levels) recurse in Rust, ~16 KiB a level in debug builds.
pub const THREAD_STACK_BYTES: usize = 32 << 20;

/// Runs `f` on a thread with `THREAD_STACK_BYTES` of stack (for tests of deep nesting).
#[cfg(test)]
pub(crate) fn with_big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(THREAD_STACK_BYTES)
        .spawn(f)
        .expect("spawn test thread")
        .join()
        .expect("test thread");
}

thread_local! {
    /// The catalog of the server this thread works for (set by `install_catalog` when a
    /// worker starts; a thread that never installs one, e.g. a unit test, gets its own).
    static CATALOG: RefCell<Option<Arc<Catalog>>> = const { RefCell::new(None) };
    /// This thread's Lua state, created on the first script.
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// Makes `catalog` the one this thread's scripts use (called once per worker thread).
pub fn install_catalog(catalog: Arc<Catalog>) {
    CATALOG.with(|c| *c.borrow_mut() = Some(catalog));
}

pub fn catalog() -> Arc<Catalog> {
    CATALOG.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| Arc::new(Catalog::default()))
            .clone()
    })
}

/// Runs `f` with this thread's engine, creating it on first use. `Err` if the Lua state
/// could not be created (out of memory), as an error reply text.
pub fn with_engine<R>(f: impl FnOnce(&mut Engine) -> R) -> Result<R, String> {
    ENGINE.with(|e| {
        let mut slot = e.borrow_mut();
        if slot.is_none() {
            *slot = Some(Engine::new(catalog()).map_err(|e| format!("ERR Lua init: {e}"))?);
        }
        Ok(f(slot.as_mut().expect("just created")))
    })
}

/// An error raised from a Rust function into Lua, carried through `mlua` as its external
/// error: `Table` is Redis's `{err=...}` error (the text of `err`), `Message` a plain
/// string error (as `luaL_error` raises, position already prefixed).
#[derive(Debug)]
pub(crate) enum Raised {
    Table(Vec<u8>),
    Message(String),
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Raised::Table(t) => write!(f, "{}", String::from_utf8_lossy(t)),
            Raised::Message(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Raised {}

pub(crate) fn raise_table<T>(text: impl Into<Vec<u8>>) -> mlua::Result<T> {
    Err(mlua::Error::external(Raised::Table(text.into())))
}

pub(crate) fn raise_message<T>(text: String) -> mlua::Result<T> {
    Err(mlua::Error::external(Raised::Message(text)))
}

/// `luaL_error` from a Rust library function: the message prefixed with the calling
/// script's position ("user_script:1: ...").
pub(crate) fn raise_error(lua: &mlua::Lua, msg: String) -> mlua::Error {
    mlua::Error::external(Raised::Message(format!("{}{msg}", caller_position(lua))))
}

/// `luaL_where(L, 1)`: "user_script:LINE: " when the caller of the running Rust function is
/// Lua code, "" otherwise.
pub(crate) fn caller_position(lua: &mlua::Lua) -> String {
    lua.inspect_stack(1, |d| {
        let src = d.source();
        match (src.what, d.current_line()) {
            ("C", _) | (_, None) => String::new(),
            (_, Some(line)) => format!("{}:{line}: ", src.short_src.unwrap_or_default()),
        }
    })
    .unwrap_or_default()
}

/// `printf("%.17g", v)` as C formats it: how Redis turns a Lua number into a command argument.
pub fn fmt_g17(v: f64) -> String {
    fmt_g(v, 17)
}

/// `printf("%.{precision}g", v)` (glibc's output for finite and non-finite values).
pub fn fmt_g(v: f64, precision: usize) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let p = precision.max(1);
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{:.*e}", p - 1, v);
    let (mantissa, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent digits");
    if exp < -4 || exp >= p as i32 {
        let m = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        trim_fraction(&format!("{v:.decimals$}")).to_string()
    }
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `%.17g` and `%.14g` give C's digits, exponents and trimming.
    #[test]
    fn g_format() {
        assert_eq!(fmt_g17(1.5), "1.5");
        assert_eq!(fmt_g17(1e20), "1e+20");
        assert_eq!(fmt_g17(3.0), "3");
        assert_eq!(fmt_g17(-0.1), "-0.10000000000000001");
        assert_eq!(fmt_g17(0.0001), "0.0001");
        assert_eq!(fmt_g17(0.00001), "1.0000000000000001e-05");
        assert_eq!(fmt_g17(123456789012345678.0), "1.2345678901234568e+17");
        assert_eq!(fmt_g(0.1, 14), "0.1");
        assert_eq!(fmt_g(1e15, 14), "1e+15");
        assert_eq!(fmt_g(f64::INFINITY, 14), "inf");
    }

    // Script ids are lowercase hex SHA1, and user-given ids are case-insensitive.
    #[test]
    fn sha() {
        assert_eq!(&sha1_hex(b""), b"da39a3ee5e6b4b0d3255bfef95601890afd80709");
        let upper = b"DA39A3EE5E6B4B0D3255BFEF95601890AFD80709";
        assert_eq!(parse_sha(upper), Some(sha1_hex(b"")));
        assert_eq!(parse_sha(b"abc"), None);
    }

    // A flush empties the catalog and moves its generation on.
    #[test]
    fn catalog_flush() {
        let c = Catalog::default();
        let s = sha1_hex(b"return 1");
        c.insert(s, b"return 1");
        assert!(c.contains(&s));
        let g = c.generation();
        c.flush();
        assert!(!c.contains(&s));
        assert_eq!(c.generation(), g + 1);
    }
}
