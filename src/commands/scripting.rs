//! EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT (Redis 7 semantics; the engine is in
//! `crate::scripting`).
//!
//! EVAL and friends are keyed commands with movable keys (`numkeys`): the router gathers
//! the shards of the declared keys, so a script is atomic and runs where its keys live; a
//! script without keys runs on the connection's worker. SCRIPT has no keys: it works on the
//! server-wide catalog from whichever worker the connection is on.

use super::{eq_ic, parse_int, wrong_args, CmdResult, Ctx};
use crate::resp::ReplyBuf;
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

/// SCRIPT LOAD / EXISTS / FLUSH / KILL. KILL reaches a script running on another worker
/// (the script's own worker is busy running it); DEBUG is not implemented.
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
        match scripting::catalog().request_kill() {
            KillOutcome::Requested => r.ok(),
            KillOutcome::NotBusy => return Err("NOTBUSY No scripts in execution right now.".into()),
            KillOutcome::Unkillable => return Err(ERR_UNKILLABLE.into()),
        }
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&sub[..sub.len().min(128)])
        ));
    }
    Ok(())
}
