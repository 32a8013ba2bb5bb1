//! EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FCALL, FCALL_RO and FUNCTION (Redis 7
//! semantics; the engine is in `crate::scripting`, the library catalog in
//! `crate::scripting::functions`).
//!
//! EVAL and friends are keyed commands with movable keys (`numkeys`): the router gathers
//! the shards of the declared keys, so a script is atomic and runs where its keys live; a
//! script without keys runs on the connection's worker. SCRIPT has no keys: it works on the
//! server-wide catalog from whichever worker the connection is on. FCALL and FCALL_RO are
//! routed like EVAL (numkeys at position 2); FUNCTION, like SCRIPT, has no keys.

use super::{eq_ic, parse_int, wrong_args, CmdResult, Ctx};
use crate::resp::ReplyBuf;
use crate::scripting::functions::{RestorePolicy, FLAG_NAMES};
use crate::scripting::{self, EvalMode, Invocation, KillOutcome, Sha};

const ERR_UNKILLABLE: &str = "UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.";

fn eval_common(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    by_sha: bool,
    mode: EvalMode,
) -> CmdResult {
    let numkeys = parse_int(a[2])?;
    if numkeys > (a.len() - 3) as i64 {
        return Err("ERR Number of keys can't be greater than number of args".into());
    }
    if numkeys < 0 {
        return Err("ERR Number of keys can't be negative".into());
    }
    let (keys, argv) = a[3..].split_at(numkeys as usize);
    let (sha, body): (Sha, Option<&[u8]>) = if by_sha {
        let sha = scripting::parse_sha(a[1])
            .ok_or_else(|| scripting::engine_errors::NOSCRIPT.to_string())?;
        (sha, None)
    } else {
        (scripting::sha1_hex(a[1]), Some(a[1]))
    };
    let call = Invocation {
        sha,
        body,
        keys,
        argv,
        mode,
    };
    scripting::with_engine(|e| e.eval(ctx, &call, r))?
}

pub fn eval(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    eval_common(ctx, a, r, false, EvalMode::ReadWrite)
}

pub fn evalsha(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    eval_common(ctx, a, r, true, EvalMode::ReadWrite)
}

pub fn eval_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    eval_common(ctx, a, r, false, EvalMode::ReadOnly)
}

pub fn evalsha_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    eval_common(ctx, a, r, true, EvalMode::ReadOnly)
}

/// SCRIPT LOAD / EXISTS / FLUSH / KILL. KILL reaches a script on any worker (on the
/// script's own worker it runs in a busy round, `docs/scripting.md`); DEBUG is not
/// implemented.
pub fn script(_ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let sub = a[1];
    if eq_ic(sub, "load") {
        if a.len() != 3 {
            return Err(wrong_args("script|load"));
        }
        let sha = scripting::with_engine(|e| e.load(a[2]))??;
        r.bulk(&sha);
    } else if eq_ic(sub, "exists") {
        if a.len() < 3 {
            return Err(wrong_args("script|exists"));
        }
        let catalog = scripting::catalog();
        r.array(a.len() - 2);
        for s in &a[2..] {
            let known = scripting::parse_sha(s).is_some_and(|sha| catalog.contains(&sha));
            r.int(known as i64);
        }
    } else if eq_ic(sub, "flush") {
        if a.len() > 3 {
            return Err(wrong_args("script|flush"));
        }
        if a.len() == 3 && !eq_ic(a[2], "sync") && !eq_ic(a[2], "async") {
            return Err("ERR SCRIPT FLUSH only support SYNC|ASYNC option".into());
        }
        scripting::catalog().flush();
        r.ok();
    } else if eq_ic(sub, "kill") {
        if a.len() != 2 {
            return Err(wrong_args("script|kill"));
        }
        kill_reply(false, r)?;
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&sub[..sub.len().min(128)])
        ));
    }
    Ok(())
}

/// SCRIPT KILL (`function == false`) and FUNCTION KILL.
fn kill_reply(function: bool, r: &mut ReplyBuf) -> CmdResult {
    match scripting::catalog().request_kill(function) {
        KillOutcome::Requested => r.ok(),
        KillOutcome::NotBusy => return Err("NOTBUSY No scripts in execution right now.".into()),
        KillOutcome::Unkillable => return Err(ERR_UNKILLABLE.into()),
        KillOutcome::WrongKind { function_running } => {
            return Err(if function_running {
                scripting::ERR_BUSY_FUNCTION
            } else {
                scripting::ERR_BUSY_EVAL
            }
            .into())
        }
    }
    Ok(())
}

pub fn fcall(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    scripting::with_engine(|e| e.fcall(ctx, a, false, r))?
}

pub fn fcall_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    scripting::with_engine(|e| e.fcall(ctx, a, true, r))?
}

const FUNCTION_HELP: &[&str] = &[
    "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LOAD [REPLACE] <FUNCTION CODE>",
    "    Create a new library with the given library name and code.",
    "DELETE <LIBRARY NAME>",
    "    Delete the given library.",
    "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
    "    Return general information on all the libraries:",
    "    * Library name",
    "    * The engine used to run the Library",
    "    * Library description",
    "    * Functions list",
    "    * Library code (if WITHCODE is given)",
    "    It also possible to get only function that matches a pattern using LIBRARYNAME argument.",
    "STATS",
    "    Return information about the current function running:",
    "    * Function name",
    "    * Command used to run the function",
    "    * Duration in MS that the function is running",
    "    If no function is running, return nil",
    "    In addition, returns a list of available engines.",
    "KILL",
    "    Kill the current running function.",
    "FLUSH [ASYNC|SYNC]",
    "    Delete all the libraries.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the libraries.",
    "    * SYNC: Synchronously flush the libraries.",
    "DUMP",
    "    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command",
    "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
    "    Restore the libraries represented by the given payload, it is possible to give a restore policy to",
    "    control how to handle existing libraries (default APPEND):",
    "    * FLUSH: delete all existing libraries.",
    "    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.",
    "    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old",
    "      libraries with the new libraries (notice that even on this option there is a chance of failure",
    "      in case of functions name collision with another library).",
    "HELP",
    "    Prints this help.",
];

/// Redis's arity of each FUNCTION subcommand (counting FUNCTION and the subcommand).
fn function_sub_arity(sub: &str) -> Option<i32> {
    Some(match sub {
        "load" | "restore" => -3,
        "delete" => 3,
        "list" | "flush" => -2,
        "dump" | "stats" | "kill" | "help" => 2,
        _ => return None,
    })
}

/// FUNCTION LOAD / DELETE / LIST / DUMP / RESTORE / FLUSH / STATS / KILL / HELP.
pub fn function(_ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_lowercase();
    let Some(arity) = function_sub_arity(&sub) else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try FUNCTION HELP.",
            String::from_utf8_lossy(&a[1][..a[1].len().min(128)])
        ));
    };
    if (arity > 0 && a.len() != arity as usize) || (arity < 0 && a.len() < (-arity) as usize) {
        return Err(wrong_args(&format!("function|{sub}")));
    }
    let catalog = scripting::catalog();
    match sub.as_str() {
        "load" => {
            let mut replace = false;
            for opt in &a[2..a.len() - 1] {
                if eq_ic(opt, "replace") {
                    replace = true;
                } else {
                    return Err(format!(
                        "ERR Unknown option given: {}",
                        String::from_utf8_lossy(opt)
                    ));
                }
            }
            let code = a[a.len() - 1];
            let name = scripting::with_engine(|e| e.load_library(code, replace))??;
            r.bulk(name.as_bytes());
        }
        "delete" => {
            catalog.functions.delete(&String::from_utf8_lossy(a[2]))?;
            r.ok();
        }
        "list" => function_list(a, r)?,
        "dump" => {
            let libs = catalog.functions.snapshot();
            let payload =
                scripting::functions::dump_payload(libs.iter().map(|l| l.code.as_slice()));
            r.bulk(&payload);
        }
        "restore" => {
            if a.len() > 4 {
                return Err(subcommand_syntax(a[1]));
            }
            let policy = match a.get(3) {
                None => RestorePolicy::Append,
                Some(p) if eq_ic(p, "append") => RestorePolicy::Append,
                Some(p) if eq_ic(p, "replace") => RestorePolicy::Replace,
                Some(p) if eq_ic(p, "flush") => RestorePolicy::Flush,
                Some(_) => {
                    return Err("ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE.".into())
                }
            };
            let codes = scripting::functions::parse_payload(a[2])?;
            let libs = scripting::with_engine(|e| e.evaluate_libraries(&codes))??;
            catalog.functions.restore(libs, policy)?;
            r.ok();
        }
        "flush" => {
            if a.len() > 3 {
                return Err(subcommand_syntax(a[1]));
            }
            if a.len() == 3 && !eq_ic(a[2], "sync") && !eq_ic(a[2], "async") {
                return Err("ERR FUNCTION FLUSH only supports SYNC|ASYNC option".into());
            }
            catalog.functions.flush()?;
            r.ok();
        }
        "stats" => {
            if catalog.eval_running() {
                return Err(scripting::ERR_BUSY_EVAL.into());
            }
            r.map(2);
            r.bulk_str("running_script");
            match catalog.running_function() {
                None => r.null(),
                Some(f) => {
                    r.map(3);
                    r.bulk_str("name");
                    r.bulk_str(&f.name);
                    r.bulk_str("command");
                    r.array(f.command.len());
                    for arg in &f.command {
                        r.bulk(arg);
                    }
                    r.bulk_str("duration_ms");
                    r.int(f.duration_ms as i64);
                }
            }
            let (libraries, functions) = catalog.functions.counts();
            r.bulk_str("engines");
            r.map(1);
            r.bulk_str("LUA");
            r.map(2);
            r.bulk_str("libraries_count");
            r.int(libraries as i64);
            r.bulk_str("functions_count");
            r.int(functions as i64);
        }
        "kill" => kill_reply(true, r)?,
        _ => {
            r.array(FUNCTION_HELP.len());
            for line in FUNCTION_HELP {
                r.simple(line);
            }
        }
    }
    Ok(())
}

/// FUNCTION LIST [LIBRARYNAME pattern] [WITHCODE] (libraries in name order; Redis's order
/// is its dictionary's).
fn function_list(a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut with_code, mut pattern): (bool, Option<&[u8]>) = (false, None);
    let mut i = 2;
    while i < a.len() {
        if !with_code && eq_ic(a[i], "withcode") {
            with_code = true;
        } else if pattern.is_none() && eq_ic(a[i], "libraryname") {
            if i + 1 >= a.len() {
                return Err("ERR library name argument was not given".into());
            }
            i += 1;
            pattern = Some(a[i]);
        } else {
            return Err(format!(
                "ERR Unknown argument {}",
                String::from_utf8_lossy(a[i])
            ));
        }
        i += 1;
    }
    let libs: Vec<_> = scripting::catalog()
        .functions
        .snapshot()
        .into_iter()
        .filter(|l| pattern.is_none_or(|p| super::glob_match_nocase(p, l.name.as_bytes())))
        .collect();
    r.array(libs.len());
    for lib in libs {
        r.map(if with_code { 4 } else { 3 });
        r.bulk_str("library_name");
        r.bulk_str(&lib.name);
        r.bulk_str("engine");
        r.bulk_str("LUA");
        r.bulk_str("functions");
        r.array(lib.functions.len());
        for f in &lib.functions {
            r.map(3);
            r.bulk_str("name");
            r.bulk_str(&f.name);
            r.bulk_str("description");
            match &f.desc {
                Some(d) => r.bulk(d),
                None => r.null(),
            }
            r.bulk_str("flags");
            let names: Vec<&str> = FLAG_NAMES
                .iter()
                .enumerate()
                .filter(|(i, _)| f.flags & (1 << i) != 0)
                .map(|(_, n)| *n)
                .collect();
            r.set(names.len());
            for n in names {
                r.simple(n);
            }
        }
        if with_code {
            r.bulk_str("library_code");
            r.bulk(&lib.code);
        }
    }
    Ok(())
}

/// Redis's `addReplySubcommandSyntaxError` for FUNCTION.
fn subcommand_syntax(sub: &[u8]) -> String {
    format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try FUNCTION HELP.",
        String::from_utf8_lossy(&sub[..sub.len().min(128)])
    )
}
