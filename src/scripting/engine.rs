//! One worker's Lua state: the sandbox, the `redis` API, compiled scripts, and running one.

use super::convert::{error_table_text, lua_to_reply, push_error, reply_to_lua};
use super::functions::{flag_bit, parse_metadata, valid_name, FunctionInfo, Library};
use super::functions::{ERR_BAD_NAME, FLAG_NO_WRITES};
use super::{caller_position, fmt_g17, raise_message, raise_table, Catalog, Raised, Sha};
use crate::commands::table::key_positions;
use crate::commands::{lookup, CmdResult, Ctx, Kind};
use crate::resp::{Proto, ReplyBuf};
use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const ERR_NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
/// The chunk name Redis gives every EVAL body (errors read `user_script:LINE:`).
const CHUNK_NAME: &str = "@user_script";
/// `redis.REDIS_VERSION`: the version lavik reports (`INFO server`).
const VERSION: &str = crate::server::local::REDIS_VERSION;
/// Redis's text for a key the script did not declare (Redis Cluster's rule; see mod docs).
pub const ERR_UNDECLARED_KEY: &str = "Script attempted to access a non local key in a cluster node";
/// A command lavik runs only outside scripts (connection, server and whole-keyspace
/// commands: a script holds only its declared keys' shards).
pub const ERR_NOT_FROM_SCRIPT_YET: &str =
    "lavik runs only commands on declared keys from scripts; this command is not one";

/// One EVAL/EVALSHA: `body` for EVAL (its id is `sha`), `None` for EVALSHA; `keys` and
/// `argv` become `KEYS` and `ARGV`.
#[derive(Clone, Copy)]
pub struct Invocation<'a> {
    pub sha: Sha,
    pub body: Option<&'a [u8]>,
    pub keys: &'a [&'a [u8]],
    pub argv: &'a [&'a [u8]],
    pub mode: EvalMode,
}

/// EVAL/EVALSHA or their `_RO` variants (write commands refused inside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalMode {
    ReadWrite,
    ReadOnly,
}

/// The text of the `err` field for an error value that is not a Lua table.
fn error_value_text(lua: &Lua, v: &Value) -> Vec<u8> {
    match v {
        Value::Error(e) => match e.downcast_ref::<Raised>() {
            Some(Raised::Table(t)) => t.clone(),
            Some(Raised::Message(m)) => format!("ERR {m}").into_bytes(),
            None => format!("ERR {e}").into_bytes(),
        },
        other => {
            let s = lua
                .coerce_string(other.clone())
                .ok()
                .flatten()
                .map(|s| s.as_bytes().to_vec())
                .unwrap_or_else(|| lua_tostring_fallback(other).into_bytes());
            let mut out = b"ERR ".to_vec();
            out.extend_from_slice(&s);
            out
        }
    }
}

fn lua_tostring_fallback(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Boolean(b) => b.to_string(),
        other => format!("{}: {:p}", other.type_name(), other.to_pointer()),
    }
}

/// A compiled script and what its shebang declared.
#[derive(Clone)]
struct Compiled {
    function: Function,
    /// `#!lua flags=no-writes`: runs as a read-only script.
    no_writes: bool,
}

/// What a `#!lua` first line says.
struct Shebang {
    /// Bytes before the first line feed (0 without a shebang).
    skip_bytes: usize,
    no_writes: bool,
}

/// The script flags Redis 7 knows (`scripts_flags_def`).
const SCRIPT_FLAGS: &[&str] = &[
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];

/// Redis 7's `evalExtractShebangFlags`: `#!lua [flags=a,b]` on the first line.
fn parse_shebang(body: &[u8]) -> Result<Shebang, String> {
    if !body.starts_with(b"#!") {
        return Ok(Shebang {
            skip_bytes: 0,
            no_writes: false,
        });
    }
    let end = body
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| "ERR Invalid script shebang".to_string())?;
    let line = String::from_utf8_lossy(&body[..end]);
    let mut parts = line.split_ascii_whitespace();
    let engine = parts
        .next()
        .ok_or_else(|| "ERR Invalid engine in script shebang".to_string())?;
    if engine != "#!lua" {
        return Err(format!("ERR Unexpected engine in script shebang: {engine}"));
    }
    let mut no_writes = false;
    for part in parts {
        let Some(flags) = part.strip_prefix("flags=") else {
            return Err(format!("ERR Unknown lua shebang option: {part}"));
        };
        for flag in flags.split(',').filter(|f| !f.is_empty()) {
            if !SCRIPT_FLAGS.contains(&flag) {
                return Err(format!("ERR Unexpected flag in script shebang: {flag}"));
            }
            no_writes |= flag == "no-writes";
        }
    }
    Ok(Shebang {
        skip_bytes: end,
        no_writes,
    })
}

/// A function a library registered while it loaded.
struct Registered {
    info: FunctionInfo,
    function: Function,
}

/// State of the script being run, read by the `redis` API functions.
#[derive(Default)]
struct RunState {
    /// The catalog's id of the run (`Catalog::script_started`).
    run_id: Cell<u64>,
    /// A library is loading: `redis.register_function` adds to this.
    loading: RefCell<Option<Vec<Registered>>>,
    /// FUNCTION LOAD's time limit (Redis's 500 ms), checked by the instruction hook.
    load_deadline: Cell<Option<Instant>>,
    /// `redis.setresp(3)` was called: inner replies are RESP3 and booleans return as RESP3.
    resp3: Cell<bool>,
    /// The script ran a write command (SCRIPT KILL can no longer stop it).
    wrote: Cell<bool>,
    /// SCRIPT KILL stopped this script: every hook and every `pcall` raises again.
    killed: Cell<bool>,
    /// When the run started (`Catalog::script_started`): the hook compares it with
    /// `busy-reply-threshold` to start busy rounds.
    started: Cell<Option<Instant>>,
    /// A call of this run met a record that is not in memory in a restartable run
    /// (`storage::prefetch::run_missed`): the run will be discarded and run again after the
    /// read, so it is stopped as a killed one is — every later `redis.call`, `pcall` and
    /// hook raises — and nothing it returns reaches the client.
    missed: Cell<bool>,
}

const ERR_KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";
/// What a script stopped by SHUTDOWN NOSAVE (or a shutdown signal) raises before the server
/// stops (Redis exits at once; its client sees the connection close).
const ERR_SHUTDOWN: &str = "ERR Script killed by SHUTDOWN NOSAVE";
/// The one value the instruction hook passes to the run's `redis.call` to ask it for a busy
/// round (`Ctx::busy_round`): a light userdata at this static's address, which no script
/// can make (scripts get no light userdata but `cjson.null`, the null pointer).
static BUSY_ROUND_TOKEN: u8 = 0;

fn busy_round_token() -> mlua::LightUserData {
    mlua::LightUserData(std::ptr::addr_of!(BUSY_ROUND_TOKEN) as *mut std::ffi::c_void)
}
/// What a discarded run (`RunState::missed`) raises; the worker drops the run's reply.
const ERR_MISSED: &str = "ERR script stopped: a record is being read (it runs again)";
/// The chunk name Redis gives library code (errors read `user_function:LINE:`).
const FUNCTION_CHUNK_NAME: &str = "@user_function";
/// How long a library's load may run (Redis's `LOAD_TIMEOUT_MS`).
const LOAD_TIMEOUT: Duration = Duration::from_millis(500);
const ERR_RO_WRITE_FLAG: &str = "ERR Can not execute a script with write flag using *_ro command.";
/// Instructions between two checks for SCRIPT KILL.
const KILL_CHECK_INSTRUCTIONS: u32 = 100_000;

pub struct Engine {
    lua: Lua,
    catalog: Arc<Catalog>,
    generation: u64,
    compiled: HashMap<Sha, Compiled>,
    /// What scripts see as their globals: an empty read-only proxy of `globals`.
    env: Table,
    globals: Table,
    redis: Table,
    xpcall: Function,
    handler: Function,
    run: Rc<RunState>,
    /// Library code's environment: reads go to `load_api` while a library loads, to the
    /// script globals otherwise (the `__index` of `fenv_mt` switches, as Redis switches
    /// its globals' metatable).
    fenv: Table,
    fenv_mt: Table,
    load_api: Table,
    /// `bind(f, keys, args)`: a closure calling `f(keys, args)`, for `xpcall`.
    bind: Function,
    /// Functions compiled from the catalog's libraries, by lowercased name, as of
    /// `fn_generation`.
    fn_compiled: HashMap<String, Function>,
    fn_generation: Option<u64>,
}

/// Wraps pcall/loadstring/load for the sandbox (run once, with the real globals).
const WRAPPERS: &str = r#"
local raw_pcall, raw_loadstring, raw_setfenv, env, unwrap, concat = ...
local type = type
local function fix(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if type(e) == 'userdata' then e = unwrap(e) end
  if type(e) == 'table' then
    local m = e.err
    if type(m) == 'string' or type(m) == 'number' then return false, m end
  end
  return false, e
end
local function pcall(f, ...)
  return fix(raw_pcall(f, ...))
end
local function loadstring(s, name)
  if type(s) == 'string' and s:byte(1) == 27 then
    return nil, 'binary chunks are not allowed in scripts'
  end
  local f, e = raw_loadstring(s, name)
  if f then raw_setfenv(f, env) end
  return f, e
end
local function load(reader, name)
  if type(reader) ~= 'function' then
    return nil, 'bad argument #1 to load (function expected)'
  end
  local parts = {}
  while true do
    local p = reader()
    if p == nil or p == '' then break end
    if type(p) ~= 'string' then return nil, 'reader function must return a string' end
    parts[#parts + 1] = p
  end
  return loadstring(concat(parts), name or '=(load)')
end
return pcall, loadstring, load
"#;

/// The libraries scripts see, all read-only.
const LIBRARIES: &[&str] = &[
    "string",
    "table",
    "math",
    "coroutine",
    "cjson",
    "bit",
    "struct",
    "cmsgpack",
    "redis",
];
/// Base-library globals Redis 7 does not give scripts.
const REMOVED_GLOBALS: &[&str] = &[
    "dofile", "loadfile", "print", "getfenv", "setfenv", "newproxy", "module", "require",
    "package", "debug", "os", "io",
];

impl Engine {
    pub fn new(catalog: Arc<Catalog>) -> mlua::Result<Engine> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )?;
        let globals = lua.globals();
        let raw_setfenv: Function = globals.raw_get("setfenv")?;
        let raw_loadstring: Function = globals.raw_get("loadstring")?;
        let raw_pcall: Function = globals.raw_get("pcall")?;
        let raw_rawset: Function = globals.raw_get("rawset")?;
        let xpcall: Function = globals.raw_get("xpcall")?;
        for name in REMOVED_GLOBALS {
            globals.raw_set(*name, Value::Nil)?;
        }
        let run = Rc::new(RunState::default());
        globals.raw_set("cjson", super::cjson::open(&lua)?)?;
        globals.raw_set("bit", super::bit::open(&lua)?)?;
        globals.raw_set("struct", super::structlib::open(&lua)?)?;
        globals.raw_set("cmsgpack", super::cmsgpack::open(&lua)?)?;
        let redis = redis_api(&lua, &run)?;
        globals.raw_set("redis", redis.clone())?;
        let math: Table = globals.raw_get("math")?;
        install_random(&lua, &math)?;

        // Read-only proxies: a write raises Redis's error; reads go to the real table.
        let protected = lua.create_table()?;
        let readonly = lua.create_function(|lua, _: MultiValue| -> mlua::Result<()> {
            raise_message(format!(
                "{}Attempt to modify a readonly table",
                caller_position(lua)
            ))
        })?;
        let proxy = |real: Value| -> mlua::Result<Table> {
            let p = lua.create_table()?;
            let mt = lua.create_table()?;
            mt.raw_set("__index", real)?;
            mt.raw_set("__newindex", readonly.clone())?;
            mt.raw_set("__metatable", false)?;
            p.set_metatable(Some(mt))?;
            protected.raw_set(p.clone(), true)?;
            Ok(p)
        };
        for name in LIBRARIES {
            let real: Value = globals.raw_get(*name)?;
            if !real.is_nil() {
                globals.raw_set(*name, proxy(real)?)?;
            }
        }
        // Strings find their methods through their metatable: point it at the read-only
        // `string`, and let `getmetatable('')` hand out only a read-only view of it.
        let string_mt: Table = lua
            .load("return getmetatable('')")
            .set_name("=lavik")
            .eval()?;
        string_mt.raw_set("__index", globals.raw_get::<Value>("string")?)?;
        let string_mt_view = proxy(Value::Table(string_mt.clone()))?;
        string_mt.raw_set("__metatable", string_mt_view)?;
        let env = proxy(Value::Table(globals.clone()))?;
        let missing = missing_global(&lua)?;
        let gmt = lua.create_table()?;
        gmt.raw_set("__index", missing)?;
        gmt.raw_set("__newindex", readonly.clone())?;
        globals.set_metatable(Some(gmt))?;

        let guarded_protected = protected.clone();
        let rawset = lua.create_function(move |_, args: MultiValue| {
            if let Some(Value::Table(t)) = args.front() {
                if guarded_protected
                    .raw_get::<bool>(t.clone())
                    .unwrap_or(false)
                {
                    return raise_message::<MultiValue>(
                        "Attempt to modify a readonly table".into(),
                    );
                }
            }
            raw_rawset.call::<MultiValue>(args)
        })?;
        let run_unwrap = run.clone();
        let unwrap = lua.create_function(move |lua, v: Value| -> mlua::Result<Value> {
            if run_unwrap.killed.get() {
                return raise_table(ERR_KILLED);
            }
            if run_unwrap.missed.get() {
                return raise_table(ERR_MISSED);
            }
            Ok(match &v {
                Value::Error(e) => match e.downcast_ref::<Raised>() {
                    Some(Raised::Table(t)) => Value::String(lua.create_string(t)?),
                    Some(Raised::Message(m)) => Value::String(lua.create_string(m)?),
                    None => Value::String(lua.create_string(e.to_string())?),
                },
                _ => v,
            })
        })?;
        let table_lib: Table = globals.raw_get("table")?;
        let concat: Function = table_lib.get("concat")?;
        let (pcall, loadstring, load): (Function, Function, Function) =
            lua.load(WRAPPERS).set_name("=lavik").call((
                raw_pcall,
                raw_loadstring,
                raw_setfenv,
                env.clone(),
                unwrap,
                concat,
            ))?;
        globals.raw_set("pcall", pcall)?;
        globals.raw_set("loadstring", loadstring)?;
        globals.raw_set("load", load)?;
        globals.raw_set("rawset", rawset)?;
        globals.raw_set("_G", env.clone())?;

        let handler = lua.create_function(|lua, err: Value| -> mlua::Result<Table> {
            let t = match err {
                Value::Table(t) => t,
                other => {
                    let t = lua.create_table()?;
                    t.raw_set("err", lua.create_string(error_value_text(lua, &other))?)?;
                    t
                }
            };
            let frame = |level: usize| {
                lua.inspect_stack(level, |d| {
                    let s = d.source();
                    (
                        s.what.to_string(),
                        s.source.map(|c| c.into_owned()).unwrap_or_default(),
                        d.current_line().map(|l| l as i64).unwrap_or(-1),
                    )
                })
            };
            let info = match frame(1) {
                Some((what, ..)) if what == "C" => frame(2),
                other => other,
            };
            if let Some((_, source, line)) = info {
                t.raw_set("source", source)?;
                t.raw_set("line", line)?;
            }
            Ok(t)
        })?;
        let (hook_run, hook_catalog, hook_redis) = (run.clone(), catalog.clone(), redis.clone());
        lua.set_hook(
            mlua::HookTriggers::new().every_nth_instruction(KILL_CHECK_INSTRUCTIONS),
            move |_, _| {
                if let Some(deadline) = hook_run.load_deadline.get() {
                    if Instant::now() > deadline {
                        return raise_table("ERR FUNCTION LOAD timeout");
                    }
                    return Ok(mlua::VmState::Continue);
                }
                if !hook_run.killed.get()
                    && !hook_run.missed.get()
                    && past_threshold(&hook_run, &hook_catalog)
                {
                    // Past busy-reply-threshold: the worker answers everybody else once
                    // (through this run's `redis.call`, which holds the run's `Ctx`).
                    if let Ok(Value::Function(call)) = hook_redis.raw_get::<Value>("call") {
                        let stop: bool = call.call(Value::LightUserData(busy_round_token()))?;
                        if stop {
                            return stop_for_shutdown(&hook_run);
                        }
                    }
                }
                if hook_run.killed.get()
                    || (!hook_run.wrote.get()
                        && hook_catalog.take_kill_request(hook_run.run_id.get()))
                {
                    hook_run.killed.set(true);
                    return raise_table(ERR_KILLED);
                }
                if hook_run.missed.get() {
                    return raise_table(ERR_MISSED);
                }
                Ok(mlua::VmState::Continue)
            },
        )?;
        let (fenv, fenv_mt, load_api) = function_env(&lua, &globals, &redis, &run, &readonly)?;
        let bind: Function = lua
            .load("return function(f, k, a) return function() return f(k, a) end end")
            .set_name("=lavik")
            .eval()?;
        Ok(Engine {
            fenv,
            fenv_mt,
            load_api,
            bind,
            fn_compiled: HashMap::new(),
            fn_generation: None,
            lua,
            generation: catalog.generation(),
            catalog,
            compiled: HashMap::new(),
            env,
            globals,
            redis,
            xpcall,
            handler,
            run,
        })
    }

    /// Compiles `body` as a script function, or returns Redis's compile error text.
    fn compile(&self, body: &[u8]) -> Result<Compiled, String> {
        let shebang = parse_shebang(body)?;
        // The shebang line is dropped but its line feed kept, so line numbers stay right.
        let function = self
            .lua
            .load(&body[shebang.skip_bytes..])
            .set_name(CHUNK_NAME)
            .set_mode(mlua::chunk::ChunkMode::Text)
            .set_environment(self.env.clone())
            .into_function()
            .map_err(|e| {
                let msg = match &e {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                format!("ERR Error compiling script (new function): {msg}")
            })?;
        Ok(Compiled {
            function,
            no_writes: shebang.no_writes,
        })
    }

    fn sync_generation(&mut self) {
        let g = self.catalog.generation();
        if g != self.generation {
            self.compiled.clear();
            self.generation = g;
        }
    }

    /// SCRIPT LOAD: checks that `body` compiles, adds it to the catalog, returns its id.
    pub fn load(&mut self, body: &[u8]) -> Result<Sha, String> {
        self.sync_generation();
        let sha = super::sha1_hex(body);
        if !self.compiled.contains_key(&sha) {
            let f = self.compile(body)?;
            self.compiled.insert(sha, f);
        }
        self.catalog.insert(sha, body);
        Ok(sha)
    }

    /// The compiled function of a script: from this worker's cache, compiled from `body`
    /// (EVAL), or from the catalog (EVALSHA).
    fn function(&mut self, sha: Sha, body: Option<&[u8]>) -> Result<Compiled, String> {
        self.sync_generation();
        if let Some(f) = self.compiled.get(&sha) {
            return Ok(f.clone());
        }
        let f = match body {
            Some(b) => {
                let f = self.compile(b)?;
                self.catalog.insert(sha, b);
                f
            }
            None => {
                let b = self
                    .catalog
                    .get(&sha)
                    .ok_or_else(|| ERR_NOSCRIPT.to_string())?;
                self.compile(&b)?
            }
        };
        self.compiled.insert(sha, f.clone());
        Ok(f)
    }

    /// Runs a script (`call`); the reply goes to `r`.
    pub fn eval(&mut self, ctx: &mut Ctx, call: &Invocation, r: &mut ReplyBuf) -> CmdResult {
        let Invocation {
            sha,
            body,
            keys,
            argv,
            mode,
        } = *call;
        let Compiled {
            function: f,
            no_writes,
        } = self.function(sha, body)?;
        let mode = if no_writes { EvalMode::ReadOnly } else { mode };
        let lua_err = |e: mlua::Error| format!("ERR Error running script: {e}");
        let (keys_t, argv_t) = self.arg_tables(keys, argv).map_err(lua_err)?;
        self.globals.raw_set("KEYS", keys_t).map_err(lua_err)?;
        self.globals.raw_set("ARGV", argv_t).map_err(lua_err)?;
        let out = self.run_protected(ctx, f, keys, mode, (&sha, None, Vec::new()), r);
        let _ = self.globals.raw_set("KEYS", Value::Nil);
        let _ = self.globals.raw_set("ARGV", Value::Nil);
        out
    }

    fn arg_tables(&self, keys: &[&[u8]], argv: &[&[u8]]) -> mlua::Result<(Table, Table)> {
        let keys_t = self.lua.create_table()?;
        for (i, k) in keys.iter().enumerate() {
            keys_t.raw_set(i + 1, self.lua.create_string(k)?)?;
        }
        let argv_t = self.lua.create_table()?;
        for (i, a) in argv.iter().enumerate() {
            argv_t.raw_set(i + 1, self.lua.create_string(a)?)?;
        }
        Ok((keys_t, argv_t))
    }

    /// Runs `f` (no arguments) as a script on `ctx`: `label` names it in error replies (the
    /// SHA, or the function name), `function` and `command` are what the catalog shows.
    fn run_protected(
        &mut self,
        ctx: &mut Ctx,
        f: Function,
        keys: &[&[u8]],
        mode: EvalMode,
        (label, function, command): (&[u8], Option<String>, Vec<Vec<u8>>),
        r: &mut ReplyBuf,
    ) -> CmdResult {
        let lua_err = |e: mlua::Error| format!("ERR Error running script: {e}");
        self.run.resp3.set(false);
        self.run.wrote.set(false);
        self.run.killed.set(false);
        self.run.missed.set(false);
        let (run_id, started) = self.catalog.script_started(function, command);
        self.run.run_id.set(run_id);
        self.run.started.set(Some(started));
        let ctx_cell = RefCell::new(ctx);
        let run = self.run.clone();
        let (xpcall, handler, redis) = (&self.xpcall, &self.handler, &self.redis);
        let catalog = &*self.catalog;
        let outcome = self.lua.scope(|scope| {
            let call = scope.create_function(|lua, args: MultiValue| {
                inner_call(lua, &ctx_cell, keys, mode, (&run, catalog), true, args)
            })?;
            let pcall = scope.create_function(|lua, args: MultiValue| {
                inner_call(lua, &ctx_cell, keys, mode, (&run, catalog), false, args)
            })?;
            redis.raw_set("call", call)?;
            redis.raw_set("pcall", pcall)?;
            let out = xpcall.call::<MultiValue>((f, handler.clone()));
            redis.raw_set("call", Value::Nil)?;
            redis.raw_set("pcall", Value::Nil)?;
            out
        });
        self.catalog.script_ended(self.run.run_id.get());
        self.run.started.set(None);
        let out = outcome.map_err(lua_err)?;
        let mut vals = out.into_iter();
        let ok = matches!(vals.next(), Some(Value::Boolean(true)));
        let v = vals.next().unwrap_or(Value::Nil);
        if ok {
            lua_to_reply(&v, r, self.run.resp3.get());
        } else {
            self.write_error(&v, label, r);
        }
        Ok(())
    }

    /// FCALL / FCALL_RO of function `name` (`command` is the whole call, for FUNCTION
    /// STATS). Redis's checks in Redis's order: the function, numkeys, the `_ro` rule.
    pub fn fcall(
        &mut self,
        ctx: &mut Ctx,
        command: &[&[u8]],
        read_only: bool,
        r: &mut ReplyBuf,
    ) -> CmdResult {
        let (lib, idx) = self
            .catalog
            .functions
            .find_function(command[1])
            .ok_or_else(|| "ERR Function not found".to_string())?;
        let info = lib.functions[idx].clone();
        let numkeys = crate::resp::parse::parse_i64(command[2])
            .ok_or_else(|| "ERR Bad number of keys provided".to_string())?;
        if numkeys > (command.len() - 3) as i64 {
            return Err("ERR Number of keys can't be greater than number of args".into());
        }
        if numkeys < 0 {
            return Err("ERR Number of keys can't be negative".into());
        }
        let no_writes = info.flags & FLAG_NO_WRITES != 0;
        if read_only && !no_writes {
            return Err(ERR_RO_WRITE_FLAG.into());
        }
        let (keys, argv) = command[3..].split_at(numkeys as usize);
        let key = info.name.to_ascii_lowercase();
        self.sync_functions();
        let f = match self.fn_compiled.get(&key) {
            Some(f) => f.clone(),
            None => return Err("ERR Function not found".into()),
        };
        let lua_err = |e: mlua::Error| format!("ERR Error running script: {e}");
        let (keys_t, argv_t) = self.arg_tables(keys, argv).map_err(lua_err)?;
        let bound: Function = self.bind.call((f, keys_t, argv_t)).map_err(lua_err)?;
        let mode = if no_writes || read_only {
            EvalMode::ReadOnly
        } else {
            EvalMode::ReadWrite
        };
        let cmd: Vec<Vec<u8>> = command.iter().map(|a| a.to_vec()).collect();
        let label = info.name.clone();
        self.run_protected(
            ctx,
            bound,
            keys,
            mode,
            (label.as_bytes(), Some(info.name), cmd),
            r,
        )
    }

    /// Recompiles every library of the catalog when it changed since the last look.
    fn sync_functions(&mut self) {
        let generation = self.catalog.functions.generation();
        if self.fn_generation == Some(generation) {
            return;
        }
        self.fn_compiled.clear();
        for lib in self.catalog.functions.snapshot() {
            let Ok(meta) = parse_metadata(&lib.code) else {
                continue;
            };
            match self.run_library(&lib.code[meta.body_at..]) {
                Ok(regs) => {
                    for reg in regs {
                        self.fn_compiled
                            .insert(reg.info.name.to_ascii_lowercase(), reg.function);
                    }
                }
                Err(e) => tracing::warn!("library {} does not load here: {e}", lib.name),
            }
        }
        self.fn_generation = Some(generation);
    }

    /// Compiles and runs library code in the load sandbox; returns what it registered, or
    /// Redis's error reply text.
    fn run_library(&mut self, body: &[u8]) -> Result<Vec<Registered>, String> {
        let f = self
            .lua
            .load(body)
            .set_name(FUNCTION_CHUNK_NAME)
            .set_mode(mlua::chunk::ChunkMode::Text)
            .set_environment(self.fenv.clone())
            .into_function()
            .map_err(|e| {
                let msg = match &e {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                format!("ERR Error compiling function: {msg}")
            })?;
        let lua_err = |e: mlua::Error| format!("ERR Error registering functions: {e}");
        self.fenv_mt
            .raw_set("__index", self.load_api.clone())
            .map_err(lua_err)?;
        *self.run.loading.borrow_mut() = Some(Vec::new());
        self.run
            .load_deadline
            .set(Some(Instant::now() + LOAD_TIMEOUT));
        let out = self.xpcall.call::<MultiValue>((f, self.handler.clone()));
        self.run.load_deadline.set(None);
        let regs = self.run.loading.borrow_mut().take().unwrap_or_default();
        self.fenv_mt
            .raw_set("__index", self.globals.clone())
            .map_err(lua_err)?;
        let mut vals = out.map_err(lua_err)?.into_iter();
        if matches!(vals.next(), Some(Value::Boolean(true))) {
            return Ok(regs);
        }
        let msg = match vals.next() {
            Some(Value::Table(t)) => match t.raw_get::<Value>("err") {
                Ok(Value::String(s)) => s.to_string_lossy(),
                _ => "ERR unknown error".into(),
            },
            _ => "ERR unknown error".into(),
        };
        Err(format!("ERR Error registering functions: {msg}"))
    }

    /// Evaluates one library's code: its metadata and functions (not installed).
    fn evaluate_library(&mut self, code: &[u8]) -> Result<Library, String> {
        let meta = parse_metadata(code)?;
        let regs = self.run_library(&code[meta.body_at..])?;
        if regs.is_empty() {
            return Err("ERR No functions registered".into());
        }
        Ok(Library {
            name: meta.name,
            code: code.to_vec(),
            functions: regs.into_iter().map(|r| r.info).collect(),
        })
    }

    /// FUNCTION LOAD: evaluates `code` and installs the library; returns its name.
    pub fn load_library(&mut self, code: &[u8], replace: bool) -> Result<String, String> {
        let meta = parse_metadata(code)?;
        if !replace && self.catalog.functions.exists(&meta.name) {
            return Err(format!("ERR Library '{}' already exists", meta.name));
        }
        let lib = self.evaluate_library(code)?;
        let name = lib.name.clone();
        self.catalog.functions.install(lib, replace)?;
        Ok(name)
    }

    /// Evaluates the libraries of a FUNCTION RESTORE payload (or of the durable file),
    /// checking them against each other as Redis loads them into one fresh context.
    pub fn evaluate_libraries(&mut self, codes: &[Vec<u8>]) -> Result<Vec<Library>, String> {
        let mut libs: Vec<Library> = Vec::new();
        for code in codes {
            let meta = parse_metadata(code)?;
            if libs.iter().any(|l| l.name == meta.name) {
                return Err(format!("ERR Library '{}' already exists", meta.name));
            }
            let lib = self.evaluate_library(code)?;
            for f in &lib.functions {
                let clash = libs.iter().any(|l| {
                    l.functions
                        .iter()
                        .any(|g| g.name.eq_ignore_ascii_case(&f.name))
                });
                if clash {
                    return Err(format!("ERR Function {} already exists", f.name));
                }
            }
            libs.push(lib);
        }
        Ok(libs)
    }

    /// The reply for a script that raised `err` (the table the error handler built).
    fn write_error(&self, err: &Value, label: &[u8], r: &mut ReplyBuf) {
        let mut line = b"-".to_vec();
        let Value::Table(t) = err else {
            line.extend_from_slice(b"ERR Error running script, execution failure");
            push_error(r, &line);
            return;
        };
        let text = |v: Value| -> Option<Vec<u8>> {
            match v {
                Value::String(s) => Some(s.as_bytes().to_vec()),
                Value::Number(n) => Some(super::fmt_g(n, 14).into_bytes()),
                Value::Integer(i) => Some(i.to_string().into_bytes()),
                _ => None,
            }
        };
        if let Some(msg) = text(t.get("err").unwrap_or(Value::Nil)) {
            line.extend_from_slice(&msg);
        }
        let source = text(t.get("source").unwrap_or(Value::Nil));
        let at = text(t.get("line").unwrap_or(Value::Nil));
        if let (Some(source), Some(at)) = (source, at) {
            line.extend_from_slice(b" script: ");
            line.extend_from_slice(label);
            line.extend_from_slice(b", on ");
            line.extend_from_slice(&source);
            line.push(b':');
            line.extend_from_slice(&at);
            line.push(b'.');
        }
        push_error(r, &line);
    }
}

/// `redis.call` (`raise`) and `redis.pcall`: runs one command on the script's `Ctx`.
fn inner_call(
    lua: &Lua,
    ctx: &RefCell<&mut Ctx>,
    declared: &[&[u8]],
    mode: EvalMode,
    (run, catalog): (&RunState, &Catalog),
    raise: bool,
    args: MultiValue,
) -> mlua::Result<Value> {
    let fail = |text: &str| -> mlua::Result<Value> {
        let t = error_table_text(text.as_bytes());
        if raise {
            raise_table(t)
        } else {
            let tbl = lua.create_table()?;
            tbl.raw_set("err", lua.create_string(&t)?)?;
            Ok(Value::Table(tbl))
        }
    };
    if let Some(Value::LightUserData(token)) = args.front() {
        if *token == busy_round_token() {
            // The instruction hook asks for a busy round (see `Ctx::busy_round`).
            let mut ctx = ctx
                .try_borrow_mut()
                .map_err(|_| mlua::Error::runtime("busy round inside redis.call"))?;
            let stop = ctx.busy_round.as_mut().is_some_and(|round| round());
            return Ok(Value::Boolean(stop));
        }
    }
    if run.missed.get() {
        return raise_table(ERR_MISSED);
    }
    let argv = match command_argv(&args) {
        Ok(argv) => argv,
        Err(e) => return fail(e),
    };
    let refs: Vec<&[u8]> = argv.iter().map(|a| a.as_slice()).collect();
    let Some(spec) = lookup(refs[0]) else {
        return fail("Unknown Redis command called from script");
    };
    if (spec.arity > 0 && refs.len() != spec.arity as usize)
        || (spec.arity < 0 && refs.len() < (-spec.arity) as usize)
    {
        return fail("Wrong number of args calling Redis command from script");
    }
    if spec.flags.contains(&"noscript") {
        return fail("This Redis command is not allowed from script");
    }
    // The caller's ACL rules, after the command checks and before the write checks, as
    // in Redis's `scriptCall`.
    if let Some(e) = crate::server::acl_cmd::script_denial(spec, &refs) {
        return fail(&e);
    }
    if matches!(spec.name, "publish" | "spublish") {
        // Redis counts may-replicate commands as writes in read-only scripts.
        if mode == EvalMode::ReadOnly {
            return fail("Write commands are not allowed from read-only scripts.");
        }
        let n = crate::server::script_publish(spec.name == "spublish", refs[1], refs[2]);
        return Ok(Value::Integer(n as i64));
    }
    if let Some(reply) = keyless_reply(spec.name, &refs) {
        if raise && reply.first() == Some(&b'-') {
            return raise_table(error_table_text(&reply[..reply.len() - 2]));
        }
        let mut pos = 0;
        return reply_to_lua(lua, &reply, &mut pos);
    }
    let Some(handler) = spec.handler.filter(|_| spec.kind == Kind::Keyed) else {
        return fail(ERR_NOT_FROM_SCRIPT_YET);
    };
    if mode == EvalMode::ReadOnly && spec.flags.contains(&"write") {
        return fail("Write commands are not allowed from read-only scripts.");
    }
    let mut ctx = ctx
        .try_borrow_mut()
        .map_err(|_| mlua::Error::runtime("redis.call re-entered"))?;
    for pos in key_positions(spec, &refs) {
        let key = refs[pos];
        let held = {
            let shards = &ctx.shards;
            let id = shards.shard_id(key) as usize;
            shards.slots.get(id).is_some_and(|s| s.is_some())
        };
        if !held || !declared.contains(&key) {
            return fail(ERR_UNDECLARED_KEY);
        }
    }
    let mut out = Vec::new();
    if spec.flags.contains(&"write") && !run.wrote.replace(true) {
        catalog.script_wrote(run.run_id.get());
    }
    let proto = if run.resp3.get() {
        Proto::Resp3
    } else {
        Proto::Resp2
    };
    let mut rb = ReplyBuf::new(&mut out, proto);
    crate::server::blocking::set_current(None);
    let waiter = crate::server::blocking::before_handler();
    // A script's calls count keyspace hits and misses as commands (`server::keystats`).
    let reads = crate::server::keystats::begin(spec, &refs);
    let res = handler(&mut ctx, &refs, &mut rb);
    let db = ctx.db;
    crate::server::keystats::settle(reads, spec, ctx.shards, &refs, db);
    if let Err(e) = res {
        out.clear();
        ReplyBuf::new(&mut out, proto).error(&e);
    }
    // Client-side caching: the keys this call read count for the script's caller.
    if crate::runtime::tracking::active() {
        crate::server::tracking::after_command(spec, &refs);
    }
    // Clients blocked on the keys this call wrote are served now (scripts never block).
    let (db, now_ms, max_bulk) = (ctx.db, ctx.now_ms, ctx.max_bulk);
    crate::server::blocking::after_handler(waiter, ctx.shards, spec, &refs, db, now_ms, max_bulk);
    drop(ctx);
    if crate::storage::prefetch::run_missed() {
        // Restartable run (`server::reads::restartable`): the call met a record that is not
        // in memory. Nothing was written after the miss (the shards refuse it), and the
        // worker discards the run; stop the script here rather than let it go on with an
        // error reply it would never have seen.
        run.missed.set(true);
        return raise_table(ERR_MISSED);
    }
    if raise && out.first() == Some(&b'-') {
        let end = out.len().saturating_sub(2);
        return raise_table(error_table_text(&out[..end]));
    }
    let mut pos = 0;
    reply_to_lua(lua, &out, &mut pos)
}

/// Whether the running script has run longer than `busy-reply-threshold` (read by the
/// hook every `KILL_CHECK_INSTRUCTIONS` instructions: one clock read).
fn past_threshold(run: &RunState, catalog: &Catalog) -> bool {
    run.started
        .get()
        .is_some_and(|t| t.elapsed() >= Duration::from_millis(catalog.busy_threshold_ms()))
}

/// The server is shutting down (SHUTDOWN NOSAVE in a busy round, or a signal) while the
/// script runs. One that has not written is stopped with an error, and the shutdown goes on
/// as usual. One that has written cannot be undone nor finished: the process exits now, as
/// Redis's SHUTDOWN NOSAVE does, before the script's write group is closed, so after the
/// restart none of its writes is there (`docs/atomic-writes.md`: an unclosed group is
/// discarded by recovery, as after a crash).
fn stop_for_shutdown(run: &RunState) -> mlua::Result<mlua::VmState> {
    if run.wrote.get() {
        tracing::warn!("SHUTDOWN NOSAVE while a script that wrote runs: exiting now");
        std::process::exit(0);
    }
    run.killed.set(true);
    raise_table(ERR_SHUTDOWN)
}

/// A `redis.call` / `redis.acl_check_cmd` argument list as Redis converts it: strings as
/// they are, numbers as `%.17g`, integers in decimal; the error text otherwise.
fn command_argv(args: &MultiValue) -> Result<Vec<Vec<u8>>, &'static str> {
    if args.is_empty() {
        return Err("Please specify at least one argument for this redis lib call");
    }
    let mut argv: Vec<Vec<u8>> = Vec::with_capacity(args.len());
    for a in args.iter() {
        match a {
            Value::String(s) => argv.push(s.as_bytes().to_vec()),
            Value::Number(n) => argv.push(fmt_g17(*n).into_bytes()),
            Value::Integer(i) => argv.push(i.to_string().into_bytes()),
            _ => return Err("Lua redis lib command arguments must be strings or integers"),
        }
    }
    Ok(argv)
}

/// The commands without keys a script may call (Redis allows them; they touch no shard):
/// TIME, PING and ECHO, answered here in RESP2 (the form `reply_to_lua` converts).
fn keyless_reply(name: &str, argv: &[&[u8]]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rb = ReplyBuf::new(&mut out, Proto::Resp2);
    match name {
        "time" => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            rb.array(2);
            rb.bulk(t.as_secs().to_string().as_bytes());
            rb.bulk(t.subsec_micros().to_string().as_bytes());
        }
        "ping" if argv.len() == 1 => rb.simple("PONG"),
        "ping" if argv.len() == 2 => rb.bulk(argv[1]),
        "ping" => rb.error("ERR wrong number of arguments for 'ping' command"),
        "echo" => rb.bulk(argv[1]),
        _ => return None,
    }
    Some(out)
}

fn arg_count_is(args: &MultiValue, n: usize) -> bool {
    args.len() == n
}

fn err_table(lua: &Lua, text: &str) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.raw_set("err", lua.create_string(error_table_text(text.as_bytes()))?)?;
    Ok(Value::Table(t))
}

/// Raises Redis's "nonexistent global variable" error (`__index` of guarded tables).
fn missing_global(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|lua, (_t, k): (Value, Value)| -> mlua::Result<()> {
        let name = lua
            .coerce_string(k)?
            .map(|s| s.to_string_lossy())
            .unwrap_or_default();
        raise_message(format!(
            "{}Script attempted to access nonexistent global variable '{name}'",
            caller_position(lua)
        ))
    })
}

/// The environment library code runs in, its switchable metatable, and what it sees while
/// loading: only a `redis` table with `register_function`, `log`, the log levels and the
/// version (Redis's load-time library API); any other name raises.
fn function_env(
    lua: &Lua,
    globals: &Table,
    redis: &Table,
    run: &Rc<RunState>,
    readonly: &Function,
) -> mlua::Result<(Table, Table, Table)> {
    let guarded = |t: &Table| -> mlua::Result<Table> {
        let p = lua.create_table()?;
        let mt = lua.create_table()?;
        mt.raw_set("__index", t.clone())?;
        mt.raw_set("__newindex", readonly.clone())?;
        mt.raw_set("__metatable", false)?;
        p.set_metatable(Some(mt))?;
        Ok(p)
    };
    let load_redis = lua.create_table()?;
    for name in [
        "log",
        "LOG_DEBUG",
        "LOG_VERBOSE",
        "LOG_NOTICE",
        "LOG_WARNING",
        "REDIS_VERSION",
        "REDIS_VERSION_NUM",
    ] {
        load_redis.raw_set(name, redis.raw_get::<Value>(name)?)?;
    }
    let run_reg = run.clone();
    load_redis.raw_set(
        "register_function",
        lua.create_function(move |lua, args: MultiValue| register_function(lua, &run_reg, args))?,
    )?;
    let strict = lua.create_table()?;
    strict.raw_set("__index", missing_global(lua)?)?;
    load_redis.set_metatable(Some(strict.clone()))?;
    let load_globals = lua.create_table()?;
    load_globals.raw_set("redis", guarded(&load_redis)?)?;
    load_globals.set_metatable(Some(strict))?;
    let fenv = lua.create_table()?;
    let fenv_mt = lua.create_table()?;
    fenv_mt.raw_set("__index", globals.clone())?;
    fenv_mt.raw_set("__newindex", readonly.clone())?;
    fenv_mt.raw_set("__metatable", false)?;
    fenv.set_metatable(Some(fenv_mt.clone()))?;
    Ok((fenv, fenv_mt, load_globals))
}

/// A Lua string or number as bytes (Redis's `luaGetStringSds`: `lua_isstring`).
fn string_like(lua: &Lua, v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::String(_) | Value::Integer(_) | Value::Number(_) => lua
            .coerce_string(v.clone())
            .ok()
            .flatten()
            .map(|s| s.as_bytes().to_vec()),
        _ => None,
    }
}

/// `redis.register_function(name, callback)` or `redis.register_function{...}`.
fn register_function(lua: &Lua, run: &RunState, args: MultiValue) -> mlua::Result<()> {
    if run.loading.borrow().is_none() {
        return raise_table(
            "ERR redis.register_function can only be called on FUNCTION LOAD command",
        );
    }
    let fail = |m: &str| raise_table::<()>(format!("ERR {m}"));
    let (name, desc, flags, function) = match args.len() {
        2 => {
            let Some(name) = string_like(lua, &args[0]) else {
                return fail("first argument to redis.register_function must be a string");
            };
            let Value::Function(f) = &args[1] else {
                return fail("second argument to redis.register_function must be a function");
            };
            (name, None, 0u8, f.clone())
        }
        1 => {
            let Value::Table(t) = &args[0] else {
                return fail("calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments).");
            };
            let (mut name, mut desc, mut flags, mut function) = (None, None, 0u8, None);
            for pair in t.clone().pairs::<Value, Value>() {
                let (k, v) = pair?;
                let Some(key) = string_like(lua, &k) else {
                    return fail(
                        "named argument key given to redis.register_function is not a string",
                    );
                };
                if key.eq_ignore_ascii_case(b"function_name") {
                    match string_like(lua, &v) {
                        Some(n) => name = Some(n),
                        None => return fail("function_name argument given to redis.register_function must be a string"),
                    }
                } else if key.eq_ignore_ascii_case(b"description") {
                    match string_like(lua, &v) {
                        Some(d) => desc = Some(d),
                        None => return fail("description argument given to redis.register_function must be a string"),
                    }
                } else if key.eq_ignore_ascii_case(b"callback") {
                    match v {
                        Value::Function(f) => function = Some(f),
                        _ => return fail(
                            "callback argument given to redis.register_function must be a function",
                        ),
                    }
                } else if key.eq_ignore_ascii_case(b"flags") {
                    let Value::Table(ft) = v else {
                        return fail("flags argument to redis.register_function must be a table representing function flags");
                    };
                    let mut i = 1;
                    loop {
                        let fv: Value = ft.raw_get(i)?;
                        if fv.is_nil() {
                            break;
                        }
                        match string_like(lua, &fv).and_then(|f| flag_bit(&f)) {
                            Some(bit) => flags |= bit,
                            None => return fail("unknown flag given"),
                        }
                        i += 1;
                    }
                } else {
                    return fail("unknown argument given to redis.register_function");
                }
            }
            let Some(name) = name else {
                return fail("redis.register_function must get a function name argument");
            };
            let Some(function) = function else {
                return fail("redis.register_function must get a callback argument");
            };
            (name, desc, flags, function)
        }
        _ => return fail("wrong number of arguments to redis.register_function"),
    };
    if !valid_name(&name) {
        return fail(ERR_BAD_NAME);
    }
    let name = String::from_utf8_lossy(&name).into_owned();
    let mut loading = run.loading.borrow_mut();
    let regs = loading.as_mut().expect("checked above");
    if regs.iter().any(|r| r.info.name == name) {
        return fail("Function already exists in the library");
    }
    regs.push(Registered {
        info: FunctionInfo { name, desc, flags },
        function,
    });
    Ok(())
}

/// The `redis` table (without `call`/`pcall`, which exist only while a script runs).
fn redis_api(lua: &Lua, run: &Rc<RunState>) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|lua, args: MultiValue| {
            if !arg_count_is(&args, 1) {
                return raise_table::<String>("ERR wrong number of arguments");
            }
            let bytes = lua
                .coerce_string(args[0].clone())?
                .map(|s| s.as_bytes().to_vec())
                .unwrap_or_default();
            Ok(String::from_utf8_lossy(&super::sha1_hex(&bytes)).into_owned())
        })?,
    )?;
    redis.raw_set(
        "error_reply",
        lua.create_function(|lua, args: MultiValue| match args.front() {
            Some(Value::String(s)) if args.len() == 1 => {
                let mut line = s.as_bytes().to_vec();
                if line.first() != Some(&b'-') {
                    line.insert(0, b'-');
                }
                let t = lua.create_table()?;
                t.raw_set("err", lua.create_string(error_table_text(&line))?)?;
                Ok(Value::Table(t))
            }
            _ => err_table(lua, "wrong number or type of arguments"),
        })?,
    )?;
    redis.raw_set(
        "status_reply",
        lua.create_function(|lua, args: MultiValue| match args.front() {
            Some(Value::String(s)) if args.len() == 1 => {
                let t = lua.create_table()?;
                t.raw_set("ok", s.clone())?;
                Ok(Value::Table(t))
            }
            _ => err_table(lua, "wrong number or type of arguments"),
        })?,
    )?;
    redis.raw_set(
        "log",
        lua.create_function(|lua, args: MultiValue| -> mlua::Result<()> {
            if args.len() < 2 {
                return raise_table("ERR redis.log() requires two arguments or more.");
            }
            let Some(level) = lua.coerce_number(args[0].clone())? else {
                return raise_table("ERR First argument must be a number (log level).");
            };
            if !(0.0..4.0).contains(&level) {
                return raise_table("ERR Invalid debug level.");
            }
            let mut parts = Vec::new();
            for a in args.iter().skip(1) {
                if let Some(s) = lua.coerce_string(a.clone())? {
                    parts.push(s.to_string_lossy());
                }
            }
            let text = parts.join(" ");
            match level as i64 {
                0 => tracing::debug!(target: "lavik::script", "{text}"),
                1 | 2 => tracing::info!(target: "lavik::script", "{text}"),
                _ => tracing::warn!(target: "lavik::script", "{text}"),
            }
            Ok(())
        })?,
    )?;
    let run_resp = run.clone();
    redis.raw_set(
        "setresp",
        lua.create_function(move |lua, args: MultiValue| -> mlua::Result<()> {
            if args.len() != 1 {
                return raise_table("ERR redis.setresp() requires one argument.");
            }
            let v = lua.coerce_number(args[0].clone())?.unwrap_or(0.0) as i64;
            if v != 2 && v != 3 {
                return raise_table("ERR RESP version must be 2 or 3.");
            }
            run_resp.resp3.set(v == 3);
            Ok(())
        })?,
    )?;
    redis.raw_set(
        "set_repl",
        lua.create_function(|lua, args: MultiValue| -> mlua::Result<()> {
            if args.len() != 1 {
                return raise_table("ERR redis.set_repl() requires two arguments.");
            }
            let flags = lua.coerce_number(args[0].clone())?.unwrap_or(0.0) as i64;
            if flags & !3 != 0 {
                return raise_table(
                    "ERR Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE.",
                );
            }
            Ok(())
        })?,
    )?;
    // Whether the script's caller may run a command with these arguments (Redis 7.2 checks
    // the command's and its keys' and channels' rules, not its arity).
    redis.raw_set(
        "acl_check_cmd",
        lua.create_function(|_, args: MultiValue| -> mlua::Result<bool> {
            let argv = match command_argv(&args) {
                Ok(argv) => argv,
                Err(e) => return raise_table(format!("ERR {e}")),
            };
            let refs: Vec<&[u8]> = argv.iter().map(|a| a.as_slice()).collect();
            match crate::server::acl_cmd::script_may_run(&refs) {
                Some(ok) => Ok(ok),
                None => raise_table("ERR Invalid command passed to redis.acl_check_cmd()"),
            }
        })?,
    )?;
    redis.raw_set(
        "replicate_commands",
        lua.create_function(|_, _: MultiValue| Ok(true))?,
    )?;
    redis.raw_set(
        "breakpoint",
        lua.create_function(|_, _: MultiValue| Ok(false))?,
    )?;
    redis.raw_set("debug", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    for (name, v) in [
        ("REPL_NONE", 0),
        ("REPL_AOF", 1),
        ("REPL_SLAVE", 2),
        ("REPL_REPLICA", 2),
        ("REPL_ALL", 3),
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
    ] {
        redis.raw_set(name, v as f64)?;
    }
    redis.raw_set("REDIS_VERSION", VERSION)?;
    redis.raw_set("REDIS_VERSION_NUM", version_num(VERSION) as f64)?;
    Ok(redis)
}

/// "7.2.4" → 0x070204, as Redis's `REDIS_VERSION_NUM`.
fn version_num(v: &str) -> u32 {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b, c) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    (a << 16) | (b << 8) | c
}

/// Redis's `redisLrand48`: the 48-bit linear congruential generator of `lrand48`.
pub struct Rand48 {
    x: u64,
}

impl Rand48 {
    const A: u64 = 0x5_DEEC_E66D;
    const C: u64 = 0xB;
    const MASK: u64 = (1 << 48) - 1;
    pub const MAX: i64 = i32::MAX as i64;

    /// The state before any `srand48` (what a fresh Redis starts with).
    pub fn unseeded() -> Rand48 {
        Rand48 {
            x: 0x1234_ABCD_330E,
        }
    }

    pub fn seeded(seed: i32) -> Rand48 {
        Rand48 {
            x: (((seed as u32 as u64) << 16) | 0x330E) & Self::MASK,
        }
    }

    pub fn next(&mut self) -> i64 {
        self.x = (Self::A.wrapping_mul(self.x).wrapping_add(Self::C)) & Self::MASK;
        (self.x >> 17) as i64
    }
}

/// `math.random` / `math.randomseed` on `Rand48`, as Redis replaces them.
fn install_random(lua: &Lua, math: &Table) -> mlua::Result<()> {
    let state = Rc::new(RefCell::new(Rand48::unseeded()));
    let s = state.clone();
    math.raw_set(
        "random",
        lua.create_function(move |lua, args: MultiValue| -> mlua::Result<f64> {
            let r = (s.borrow_mut().next() % Rand48::MAX) as f64 / Rand48::MAX as f64;
            let int_arg = |i: usize| -> mlua::Result<i64> {
                match lua.coerce_number(args[i].clone())? {
                    Some(n) => Ok(n as i64),
                    None => raise_message(format!(
                        "bad argument #{} to 'random' (number expected, got {})",
                        i + 1,
                        args[i].type_name()
                    )),
                }
            };
            match args.len() {
                0 => Ok(r),
                1 => {
                    let u = int_arg(0)?;
                    if u < 1 {
                        return raise_message(
                            "bad argument #1 to 'random' (interval is empty)".into(),
                        );
                    }
                    Ok((r * u as f64).floor() + 1.0)
                }
                2 => {
                    let (l, u) = (int_arg(0)?, int_arg(1)?);
                    if l > u {
                        return raise_message(
                            "bad argument #2 to 'random' (interval is empty)".into(),
                        );
                    }
                    Ok((r * (u - l + 1) as f64).floor() + l as f64)
                }
                _ => raise_message(format!("{}wrong number of arguments", caller_position(lua))),
            }
        })?,
    )?;
    math.raw_set(
        "randomseed",
        lua.create_function(move |lua, seed: Value| -> mlua::Result<()> {
            let n = lua.coerce_number(seed)?.unwrap_or(0.0) as i32;
            *state.borrow_mut() = Rand48::seeded(n);
            Ok(())
        })?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // A fresh Redis's math.random(100) gives 40, then 85: same generator, same start.
    #[test]
    fn rand48_matches_redis() {
        let mut r = Rand48::unseeded();
        let mut pick =
            |u: f64| ((r.next() % Rand48::MAX) as f64 / Rand48::MAX as f64 * u).floor() + 1.0;
        assert_eq!(pick(100.0), 40.0);
        assert_eq!(pick(100.0), 85.0);
    }

    // The version number packs major, minor and patch as Redis does.
    #[test]
    fn version_number() {
        assert_eq!(version_num("7.2.4"), 0x070204);
    }
}
