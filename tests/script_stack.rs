//! Feasibility of running a script's Lua on a stack of its own (a stackful coroutine,
//! `corosensei`), the design in `docs/scripting.md` ("Not done yet"): the `redis.call`
//! that misses a page would *suspend* the run, the worker would serve other connections,
//! and the run would resume at the call when the page is in memory.
//!
//! What must hold for that, checked here on the same vendored Lua 5.1 the server embeds
//! (through `mlua`, built the same way):
//! - a Rust callback called from Lua can suspend with Lua's C frames below it on the
//!   coroutine's stack — including C functions that call back into Lua (`table.sort`'s
//!   comparator, `string.gsub`'s replacement function, `pcall`) — and the run resumes
//!   where it was, with Lua's state intact;
//! - the host runs other Lua states (other work of the worker) between a suspension and
//!   its resume;
//! - Lua errors after a resume (`longjmp`) stay on the coroutine's stack: a callback's
//!   error is caught by the script's `pcall`, an uncaught one ends the run as a returned
//!   error, never unwinding across the switch;
//! - Lua's own C-depth limit (`LUAI_MAXCCALLS`) is reached as a Lua error, not a stack
//!   overflow, on the stack size the design names (`STACK_BYTES`);
//! - a stack is reusable after its run ends (pooled stacks on the fast path), and what a
//!   switch pair costs (printed, not asserted: timings are not deterministic).
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use mlua::{Lua, MultiValue, Value};
use std::time::Instant;

/// The stack a suspended script run would get (virtual size; only touched pages are
/// committed, and a pooled stack keeps its high-water mark).
const STACK_BYTES: usize = 1 << 20;

/// What the host hands a suspended call when it resumes it.
enum Resume {
    Start,
    /// The call's result (the "page" arrived).
    Value(String),
    /// The call fails (raised as a Lua error inside the script).
    Error(String),
}

type Run = Coroutine<Resume, String, Result<String, String>, DefaultStack>;

/// A coroutine running `code` on a fresh Lua state, with `susp(x)` suspending the run
/// and returning what the host resumes it with.
fn script_run(stack: DefaultStack, code: &'static str) -> Run {
    Coroutine::with_stack(
        stack,
        move |y: &Yielder<Resume, String>, _start: Resume| -> Result<String, String> {
            let lua = Lua::new();
            let out = lua.scope(|scope| {
                let susp = scope.create_function(|_, arg: String| match y.suspend(arg) {
                    Resume::Value(v) => Ok(v),
                    Resume::Error(e) => Err(mlua::Error::runtime(e)),
                    Resume::Start => unreachable!("started twice"),
                })?;
                lua.globals().set("susp", susp)?;
                let r = lua.load(code).call::<MultiValue>(());
                lua.globals().set("susp", Value::Nil)?;
                r
            });
            match out {
                Ok(v) => Ok(v
                    .iter()
                    .map(|x| x.to_string().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(",")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
}

/// Drives `run` to its end, answering each suspension with `answer`, and running an
/// unrelated Lua script on the host's stack between every suspension and its resume.
fn drive(
    mut run: Run,
    answer: impl Fn(&str) -> Resume,
) -> (Result<String, String>, Vec<String>, DefaultStack) {
    let other = Lua::new();
    let mut asked = Vec::new();
    let mut input = Resume::Start;
    loop {
        match run.resume(input) {
            CoroutineResult::Yield(q) => {
                // The worker serving someone else meanwhile.
                let n: i64 = other
                    .load("local s = 0 for i = 1, 100 do s = s + i end return s")
                    .eval()
                    .unwrap();
                assert_eq!(n, 5050);
                input = answer(&q);
                asked.push(q);
            }
            CoroutineResult::Return(r) => return (r, asked, run.into_stack()),
        }
    }
}

#[test]
fn suspends_under_lua_c_frames_and_resumes_where_it_was() {
    let code = r#"
        local t = {3, 1, 2}
        -- suspends inside table.sort's comparator (a C function calling Lua)
        table.sort(t, function(a, b) susp("cmp") return a < b end)
        -- inside string.gsub's replacement function
        local g = string.gsub("ab", "%w", function(c) return susp(c) end)
        -- inside pcall, inside a coroutine.wrap'ed Lua coroutine
        local ok, p = pcall(function()
            local co = coroutine.wrap(function() return susp("in-lua-coroutine") end)
            return co()
        end)
        local n = 0
        for i = 1, 3 do n = n + tonumber(susp("n" .. i)) end
        return table.concat(t, ""), g, tostring(ok), p, n
    "#;
    let stack = DefaultStack::new(STACK_BYTES).unwrap();
    let (out, asked, _stack) = drive(script_run(stack, code), |q| match q {
        "cmp" => Resume::Value(String::new()),
        q if q.starts_with('n') => Resume::Value(q[1..].to_string()),
        q => Resume::Value(q.to_uppercase()),
    });
    assert_eq!(out.unwrap(), "123,AB,true,IN-LUA-COROUTINE,6");
    assert!(asked.iter().filter(|q| *q == "cmp").count() >= 2);
    assert_eq!(
        &asked[asked.len() - 6..],
        ["a", "b", "in-lua-coroutine", "n1", "n2", "n3"]
    );
}

#[test]
fn lua_errors_after_a_resume_stay_on_the_run_stack() {
    let code = r#"
        -- a call that fails after the resume: caught by the script's pcall
        local ok, e = pcall(susp, "fail-me")
        local caught = tostring(ok) .. ":" .. tostring(e):match("boom")
        -- an error() raised after a resume, caught by pcall (longjmp inside the run)
        local ok2 = pcall(function() susp("x") error("inner") end)
        -- an uncaught error after a resume ends the run as a returned error
        susp("last")
        error("uncaught after resume: " .. caught .. ":" .. tostring(ok2))
    "#;
    let stack = DefaultStack::new(STACK_BYTES).unwrap();
    let (out, asked, stack) = drive(script_run(stack, code), |q| {
        if q == "fail-me" {
            Resume::Error("boom".into())
        } else {
            Resume::Value(q.into())
        }
    });
    let e = out.unwrap_err();
    assert!(e.contains("uncaught after resume: false:boom:false"), "{e}");
    assert_eq!(asked, ["fail-me", "x", "last"]);
    // The stack is whole after a run that ended in an error: run another on it.
    let (out, _, _) = drive(script_run(stack, "return susp('again')"), |q| {
        Resume::Value(q.into())
    });
    assert_eq!(out.unwrap(), "again");
}

#[test]
fn lua_c_depth_limit_is_an_error_not_a_stack_overflow() {
    // Each level nests a pcall (a C frame calling Lua) and suspends at the bottom; Lua
    // 5.1 stops at LUAI_MAXCCALLS (200) with an error long before STACK_BYTES is used.
    let code = r#"
        local function down(n)
            if n == 0 then return susp("bottom") end
            local ok, v = pcall(down, n - 1)
            if not ok then error(v, 0) end
            return v
        end
        local ok, e = pcall(down, 150)
        local deep_ok, deep_e = pcall(down, 100000)
        return tostring(ok) .. ":" .. tostring(e), tostring(deep_ok), tostring(deep_e)
    "#;
    let stack = DefaultStack::new(STACK_BYTES).unwrap();
    let (out, _, _) = drive(script_run(stack, code), |q| Resume::Value(q.into()));
    let out = out.unwrap();
    assert!(out.starts_with("true:bottom,false,"), "{out}");
    assert!(out.contains("stack overflow"), "{out}");
}

#[test]
fn interleaved_runs_on_pooled_stacks() {
    // Two runs suspended at once (on different Lua states), resumed alternately, then
    // their stacks reused for more runs: the pool the fast path would keep.
    let code = "local a = susp('1') local b = susp('2') return a .. b";
    let mut pool: Vec<DefaultStack> = (0..2)
        .map(|_| DefaultStack::new(STACK_BYTES).unwrap())
        .collect();
    for _ in 0..50 {
        let mut a = script_run(pool.pop().unwrap(), code);
        let mut b = script_run(pool.pop().unwrap(), code);
        let (mut ia, mut ib) = (Resume::Start, Resume::Start);
        let (mut ra, mut rb) = (None, None);
        while ra.is_none() || rb.is_none() {
            if ra.is_none() {
                match a.resume(ia) {
                    CoroutineResult::Yield(q) => ia = Resume::Value(format!("a{q}")),
                    CoroutineResult::Return(r) => {
                        ra = Some(r);
                        ia = Resume::Start;
                    }
                }
            }
            if rb.is_none() {
                match b.resume(ib) {
                    CoroutineResult::Yield(q) => ib = Resume::Value(format!("b{q}")),
                    CoroutineResult::Return(r) => {
                        rb = Some(r);
                        ib = Resume::Start;
                    }
                }
            }
        }
        assert_eq!(ra.unwrap().unwrap(), "a1a2");
        assert_eq!(rb.unwrap().unwrap(), "b1b2");
        pool.push(a.into_stack());
        pool.push(b.into_stack());
    }
    assert_eq!(pool.len(), 2);
}

#[test]
fn switch_cost_is_printed() {
    // What the fast path would add per script: one coroutine on a pooled stack, started
    // and finished (one switch pair), plus one more pair per suspension.
    let n = 100_000u32;
    let mut stack = Some(DefaultStack::new(STACK_BYTES).unwrap());
    let t = Instant::now();
    for i in 0..n {
        let mut co: Coroutine<u32, u32, u32, DefaultStack> =
            Coroutine::with_stack(stack.take().unwrap(), |_y: &Yielder<u32, u32>, x| x + 1);
        match co.resume(i) {
            CoroutineResult::Return(r) => assert_eq!(r, i + 1),
            CoroutineResult::Yield(_) => unreachable!(),
        }
        stack = Some(co.into_stack());
    }
    let start_finish = t.elapsed().as_nanos() as f64 / f64::from(n);
    let mut co: Coroutine<u32, u32, (), DefaultStack> =
        Coroutine::with_stack(stack.take().unwrap(), |y: &Yielder<u32, u32>, mut x| loop {
            x = y.suspend(x + 1);
            if x == u32::MAX {
                return;
            }
        });
    let t = Instant::now();
    for i in 0..n {
        match co.resume(i) {
            CoroutineResult::Yield(r) => assert_eq!(r, i + 1),
            CoroutineResult::Return(()) => unreachable!(),
        }
    }
    let pair = t.elapsed().as_nanos() as f64 / f64::from(n);
    assert!(matches!(co.resume(u32::MAX), CoroutineResult::Return(())));
    println!("coroutine on a pooled stack, start to finish: {start_finish:.0} ns; suspend+resume pair: {pair:.0} ns");
}
