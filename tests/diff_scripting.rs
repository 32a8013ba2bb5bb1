//! Differential tests of Lua scripting: a corpus of scripts (every conversion, error path
//! and library) sent to Debian's `redis-server` and to lavik, replies compared byte for
//! byte in RESP2 and RESP3. lavik runs 2 workers and the keys carry no hash tags, so
//! scripts with several keys gather shards from both workers.
//!
//! Deliberate differences, tested against lavik alone with the expected text written out:
//! - a key the script did not declare fails (Redis Cluster's rule; Redis standalone allows
//!   it), see `undeclared_keys`;
//! - doubles are formatted shortest round-trip as Redis 7.2 does (7.0.15 prints `%.17g`,
//!   e.g. `3.1400000000000001`), see `doubles_as_7_2`.
mod common;
use common::diff::{Pair, RespConn};

/// (script, numkeys, keys and args). Each runs as EVAL on both servers.
const CORPUS: &[(&str, &[&str])] = &[
    // Lua -> reply conversions.
    ("return 1", &["0"]),
    ("return -3.99", &["0"]),
    ("return 3.99", &["0"]),
    ("return 'str'", &["0"]),
    ("return ''", &["0"]),
    ("return true", &["0"]),
    ("return false", &["0"]),
    ("return nil", &["0"]),
    ("return {}", &["0"]),
    ("return {1, 2, 3.7, 'x', nil, 5}", &["0"]),
    ("return {1, {2, {3, 'deep'}}, false, true}", &["0"]),
    ("return {err = 'MYERR custom failure'}", &["0"]),
    ("return {err = 'multi\\nline'}", &["0"]),
    ("return {ok = 'FINE'}", &["0"]),
    ("return {ok = 'a\\r\\nb'}", &["0"]),
    ("return {1, {err = 'nested'}, {ok = 'inner'}}", &["0"]),
    // Keyless commands a script may call (TIME's value differs run to run: only its shape).
    ("return {redis.call('ping'), redis.call('ping', 'x'), redis.call('echo', 'e')}", &["0"]),
    ("return redis.pcall('ping', 'a', 'b')", &["0"]),
    ("local t = redis.call('time') return {#t, type(t[1]), type(t[2])}", &["0"]),
    ("return redis.error_reply('X y')", &["0"]),
    ("return redis.error_reply('-CODE with dash')", &["0"]),
    ("return redis.error_reply('nocode')", &["0"]),
    ("return redis.error_reply(1)", &["0"]),
    ("return redis.status_reply('PONG')", &["0"]),
    ("return redis.status_reply()", &["0"]),
    ("return function() end", &["0"]),
    ("return {double = 3.5}", &["0"]),
    ("return {big_number = '123456789012345678901234567890'}", &["0"]),
    ("return {map = {only = 'one'}}", &["0"]),
    ("return {map = {a = 1, b = {2, 3}, c = 'x', [4] = 'four'}}", &["0"]),
    ("return {set = {a = true, b = true, c = true, [7] = true}}", &["0"]),
    ("redis.setresp(3) return {map = {k = true, j = false}}", &["0"]),
    ("local t = {} for i = 1, 20 do t['k' .. i] = i end return {map = t}", &["0"]),
    ("return {set = {only = true}}", &["0"]),
    ("return {verbatim_string = {format = 'txt', string = 'hello'}}", &["0"]),
    ("return 1, 2", &["0"]),
    ("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], #KEYS, #ARGV}", &["2", "ka", "kb", "a1", "a2"]),
    // Reply -> Lua conversions through redis.call.
    ("redis.call('set', KEYS[1], 'v1') return redis.call('get', KEYS[1])", &["1", "ka"]),
    ("return redis.call('set', KEYS[1], 'v1')", &["1", "ka"]),
    ("local r = redis.call('set', KEYS[1], 'v1') return type(r) .. ':' .. r.ok", &["1", "ka"]),
    ("return redis.call('get', KEYS[1])", &["1", "missing"]),
    ("return type(redis.call('get', KEYS[1]))", &["1", "missing"]),
    ("return redis.call('incr', KEYS[1])", &["1", "counter"]),
    ("return type(redis.call('incr', KEYS[1]))", &["1", "counter"]),
    ("return redis.call('mget', KEYS[1], KEYS[2], KEYS[3])", &["3", "ka", "missing", "counter"]),
    ("return redis.call('exists', KEYS[1], KEYS[2])", &["2", "ka", "missing"]),
    ("local r = redis.pcall('incr', KEYS[1]) return r", &["1", "ka"]),
    ("local r = redis.pcall('incr', KEYS[1]) return type(r) .. ':' .. r.err", &["1", "ka"]),
    ("return redis.call('set', KEYS[1], 1.5)", &["1", "num"]),
    ("redis.call('set', KEYS[1], 1e20) return redis.call('get', KEYS[1])", &["1", "num"]),
    ("redis.call('set', KEYS[1], 0.1) return redis.call('get', KEYS[1])", &["1", "num"]),
    ("redis.call('set', KEYS[1], -7) return redis.call('get', KEYS[1])", &["1", "num"]),
    ("return redis.call('incrbyfloat', KEYS[1], '1.5')", &["1", "fl"]),
    ("return redis.call('ttl', KEYS[1])", &["1", "ka"]),
    ("return redis.call('type', KEYS[1])", &["1", "ka"]),
    ("return redis.call('del', KEYS[1], KEYS[2])", &["2", "num", "fl"]),
    // Atomic multi-key work across both workers' shards.
    (
        "for i, k in ipairs(KEYS) do redis.call('set', k, ARGV[i]) end \
         return redis.call('mget', unpack(KEYS))",
        &["4", "k1", "k2", "k3", "k4", "v1", "v2", "v3", "v4"],
    ),
    (
        "local a = tonumber(redis.call('get', KEYS[1]) or '0') \
         redis.call('set', KEYS[1], a - 5) redis.call('incrby', KEYS[2], 5) \
         return {redis.call('get', KEYS[1]), redis.call('get', KEYS[2])}",
        &["2", "acct1", "acct2"],
    ),
    // redis.call errors and script errors.
    ("return redis.call('incr', KEYS[1])", &["1", "ka"]),
    ("return redis.call()", &["0"]),
    ("return redis.pcall()", &["0"]),
    ("return redis.call({})", &["0"]),
    ("return redis.pcall('get', {})", &["0"]),
    ("return redis.call('nosuchcommand')", &["0"]),
    ("return redis.pcall('nosuchcommand')", &["0"]),
    ("return redis.call('get')", &["0"]),
    ("return redis.call('eval', 'return 1', '0')", &["0"]),
    ("return redis.call('script', 'flush')", &["0"]),
    ("return redis.call('set', KEYS[1])", &["1", "ka"]),
    ("return redis.call('set', KEYS[1], 'v', 'BOGUS')", &["1", "ka"]),
    ("error('boom')", &["0"]),
    ("error('boom', 0)", &["0"]),
    ("error({err = 'TABLE boom'})", &["0"]),
    ("error()", &["0"]),
    ("error('two\\nlines')", &["0"]),
    ("error(42)", &["0"]),
    ("local function f() f() end f()", &["0"]),
    ("local function f(n) if n == 0 then error('deep') end return 1 + f(n - 1) end return f(100)", &["0"]),
    ("return redis.call('incr', KEYS[1]) + 1", &["1", "ka"]),
    ("local t = setmetatable({}, {__index = function() error('meta') end}) return t.x", &["0"]),
    ("local x = nil + 1", &["0"]),
    ("local t = nil return t.x", &["0"]),
    ("\n\nreturn redis.call('incr', KEYS[1])", &["1", "ka"]),
    ("local function f() return redis.call('incr', KEYS[1]) end\nlocal y = 1\nreturn f()", &["1", "ka"]),
    ("local function f()\n error('in f')\nend\nf()", &["0"]),
    ("syntax error here", &["0"]),
    ("return (", &["0"]),
    ("local ok, e = pcall(redis.call, 'incr', KEYS[1]) return {tostring(ok), e}", &["1", "ka"]),
    ("local ok, e = pcall(error, {err = 'X tab'}) return {tostring(ok), e}", &["0"]),
    ("local ok, e = pcall(error, 'plain') return {tostring(ok), e}", &["0"]),
    ("local ok, e = pcall(function() local t = nil return t.x end) return e", &["0"]),
    // The sandbox.
    ("x = 1", &["0"]),
    ("return undefined_global", &["0"]),
    ("string.foo = 1", &["0"]),
    ("redis.call = nil", &["0"]),
    ("cjson.x = 1", &["0"]),
    ("return string.foo", &["0"]),
    ("rawset(_G, 'x', 1)", &["0"]),
    ("getmetatable('').__index.upper = nil", &["0"]),
    ("getmetatable('').__index = {}", &["0"]),
    ("return ('abc'):upper() .. ('x'):rep(2)", &["0"]),
    ("return os", &["0"]),
    ("return io", &["0"]),
    ("return print", &["0"]),
    ("return dofile", &["0"]),
    ("return loadfile", &["0"]),
    ("return debug", &["0"]),
    ("return require", &["0"]),
    ("return getfenv", &["0"]),
    ("return type(loadstring)", &["0"]),
    ("return loadstring('return 1 + 1')()", &["0"]),
    ("return type(_G)", &["0"]),
    ("return _VERSION", &["0"]),
    ("return {type(pcall), type(xpcall), type(unpack), type(select), type(tonumber)}", &["0"]),
    ("local t = {} t.x = 1 return t.x", &["0"]),
    ("local s = 'abc' return s:upper() .. string.rep('x', 3)", &["0"]),
    ("return table.concat({'a', 'b'}, '-')", &["0"]),
    ("return math.floor(3.7) + math.max(1, 2)", &["0"]),
    ("return string.format('%d %s %5.2f', 42, 'x', 3.14159)", &["0"]),
    ("return tostring(1e20)", &["0"]),
    ("return tonumber('0x10')", &["0"]),
    ("return #ARGV", &["0", "a", "b", "c"]),
    // The redis API.
    ("return redis.sha1hex('')", &["0"]),
    ("return redis.sha1hex('abc')", &["0"]),
    ("return redis.sha1hex(42)", &["0"]),
    ("return redis.sha1hex()", &["0"]),
    ("return redis.setresp(4)", &["0"]),
    ("return redis.setresp()", &["0"]),
    ("redis.setresp(2) return 1", &["0"]),
    ("return redis.log(redis.LOG_WARNING, 'a log line')", &["0"]),
    ("return redis.log(redis.LOG_NOTICE)", &["0"]),
    ("return redis.log('x', 'y')", &["0"]),
    ("return redis.log(9, 'y')", &["0"]),
    ("return {redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING}", &["0"]),
    ("return {redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL}", &["0"]),
    ("redis.set_repl(redis.REPL_ALL) return 1", &["0"]),
    ("return redis.set_repl(77)", &["0"]),
    ("return redis.set_repl()", &["0"]),
    ("return redis.replicate_commands()", &["0"]),
    // RESP3 inside the script.
    ("redis.setresp(3) return redis.call('get', KEYS[1])", &["1", "missing"]),
    ("redis.setresp(3) return type(redis.call('get', KEYS[1]))", &["1", "missing"]),
    ("redis.setresp(3) return true", &["0"]),
    ("redis.setresp(3) return false", &["0"]),
    ("redis.setresp(3) return {double = 2.5}", &["0"]),
    ("redis.setresp(3) return redis.call('incrbyfloat', KEYS[1], '2.5')", &["1", "fl3"]),
    ("redis.setresp(3) return redis.call('set', KEYS[1], 'x')", &["1", "ka"]),
    // cjson.
    ("return cjson.encode({1, 2, 3})", &["0"]),
    ("return cjson.encode({a = 1})", &["0"]),
    ("return cjson.encode({})", &["0"]),
    ("return cjson.encode('a/b\"c\\n\\1')", &["0"]),
    ("return cjson.encode(0.1)", &["0"]),
    ("return cjson.encode(1/3)", &["0"]),
    ("return cjson.encode(123456789012)", &["0"]),
    ("return cjson.encode({[1] = 1, [3] = 3})", &["0"]),
    ("return cjson.encode({[1] = 1, [20] = 2})", &["0"]),
    ("return cjson.encode({true, false, cjson.null})", &["0"]),
    ("return cjson.encode(function() end)", &["0"]),
    ("return cjson.encode(1/0)", &["0"]),
    ("return cjson.encode()", &["0"]),
    ("return cjson.encode({{{{'deep'}}}})", &["0"]),
    ("return cjson.decode('[1,2,3]')", &["0"]),
    ("return cjson.decode('{\"a\":{\"b\":[1,\"x\"]}}').a.b", &["0"]),
    ("return cjson.decode('\"\\\\u00e9\"')", &["0"]),
    ("return cjson.decode('  42.5  ')", &["0"]),
    ("return tostring(cjson.decode('null') == cjson.null)", &["0"]),
    ("return cjson.decode('[1,null,3]')[3]", &["0"]),
    ("return cjson.decode('{')", &["0"]),
    ("return cjson.decode('')", &["0"]),
    ("return cjson.decode('[1 2]')", &["0"]),
    ("return cjson.decode('{\"a\" 1}')", &["0"]),
    ("return cjson.decode('1 x')", &["0"]),
    ("return cjson.decode('{1:2}')", &["0"]),
    ("return cjson.decode('[\"unterminated')", &["0"]),
    ("return cjson.decode(cjson.encode({x = {1, 2, {y = 'z'}}})).x[3].y", &["0"]),
    // bit.
    ("return bit.band(0xff, 0x0f0)", &["0"]),
    ("return bit.bor(1, 2, 4)", &["0"]),
    ("return bit.bxor(5, 3)", &["0"]),
    ("return bit.bnot(0)", &["0"]),
    ("return bit.lshift(1, 31)", &["0"]),
    ("return bit.rshift(-1, 28)", &["0"]),
    ("return bit.arshift(-256, 4)", &["0"]),
    ("return bit.rol(0x12345678, 8)", &["0"]),
    ("return bit.ror(0x12345678, 8)", &["0"]),
    ("return bit.bswap(0x12345678)", &["0"]),
    ("return bit.tohex(255)", &["0"]),
    ("return bit.tohex(-1, -4)", &["0"]),
    ("return bit.tobit(0xffffffff + 1)", &["0"]),
    ("return bit.band()", &["0"]),
    ("return bit.band('x')", &["0"]),
    // struct.
    ("return struct.pack('>I2', 1)", &["0"]),
    ("return struct.pack('<i4 b', -2, 3)", &["0"]),
    ("return {struct.unpack('>I2 b', struct.pack('>I2 b', 513, -1))}", &["0"]),
    ("return {struct.unpack('<h H l', struct.pack('<h H l', -300, 65000, -5))}", &["0"]),
    ("return struct.size('!8 b d')", &["0"]),
    ("return struct.size('>I2 d i8')", &["0"]),
    ("return struct.pack('s', 'ab')", &["0"]),
    ("return struct.pack('c3', 'abcdef')", &["0"]),
    ("return {struct.unpack('s c2', 'hi\0xyz')}", &["0"]),
    ("return struct.pack('>d <f', 1.5, 2.25)", &["0"]),
    ("return struct.pack('z', 1)", &["0"]),
    ("return struct.pack('i40', 1)", &["0"]),
    ("return struct.pack('!3 i', 1)", &["0"]),
    ("return struct.unpack('>I4', 'ab')", &["0"]),
    ("return struct.pack('i')", &["0"]),
    // cmsgpack.
    ("return cmsgpack.pack({1, 2, 3})", &["0"]),
    ("return cmsgpack.pack(-1, 200, -200, 70000, -70000, 5000000000, -5000000000)", &["0"]),
    ("return cmsgpack.pack(1.5, 0.1)", &["0"]),
    ("return cmsgpack.pack({a = true}, false, nil)", &["0"]),
    ("return cmsgpack.pack(string.rep('x', 40), string.rep('y', 300))", &["0"]),
    ("return cmsgpack.pack({})", &["0"]),
    ("return cmsgpack.pack({[1] = 1, [3] = 3})", &["0"]),
    ("return cmsgpack.unpack(cmsgpack.pack({1, {2, 'x'}}))", &["0"]),
    ("return {cmsgpack.unpack(cmsgpack.pack(1, 'two', 3))}", &["0"]),
    ("return {cmsgpack.unpack_one(cmsgpack.pack(7, 8))}", &["0"]),
    ("return {cmsgpack.unpack_one(cmsgpack.pack(7, 8), 1)}", &["0"]),
    ("return {cmsgpack.unpack_limit(cmsgpack.pack(1, 2, 3), 2)}", &["0"]),
    ("return cmsgpack.unpack(cmsgpack.pack({x = 'y'})).x", &["0"]),
    ("return cmsgpack.unpack('\\193')", &["0"]),
    ("return cmsgpack.unpack('\\205')", &["0"]),
    ("return cmsgpack.pack()", &["0"]),
    // Shebang flags.
    ("#!lua", &["0"]),
    ("#!python\nreturn 1", &["0"]),
    ("#! lua\nreturn 1", &["0"]),
    ("#!lua foo\nreturn 1", &["0"]),
    ("#!lua name=x\nreturn 1", &["0"]),
    ("#!lua flags=bad\nreturn 1", &["0"]),
    ("#!lua flags=\nreturn 1", &["0"]),
    ("#!lua\nerror('line2')", &["0"]),
    ("#!lua flags=no-writes\nreturn redis.call('set', KEYS[1], 'x')", &["1", "ka"]),
    ("#!lua flags=no-writes,allow-oom\nreturn redis.call('get', KEYS[1])", &["1", "ka"]),
    ("#!lua flags=allow-stale,no-cluster,allow-cross-slot-keys\nreturn 7", &["0"]),
    ("#!lua\nreturn redis.call('set', KEYS[1], 'shebang')", &["1", "ka"]),
    // Nesting limits.
    ("local t = {} t[1] = t return cjson.encode(t)", &["0"]),
    ("return cjson.decode(string.rep('[', 1001))", &["0"]),
    ("local t = {} t[1] = t return #cmsgpack.pack(t)", &["0"]),
    // cjson settings (keyless: they stay on the connection's worker, see docs).
    ("return {cjson.encode_sparse_array()}", &["0"]),
    ("return {cjson.encode_max_depth(), cjson.decode_max_depth(), cjson.encode_number_precision()}", &["0"]),
    ("return {cjson.encode_keep_buffer(), cjson.encode_invalid_numbers(), cjson.decode_invalid_numbers()}", &["0"]),
    ("cjson.encode_number_precision(3) return cjson.encode(1/3)", &["0"]),
    ("return cjson.encode_number_precision(14)", &["0"]),
    ("cjson.encode_sparse_array(true) return cjson.encode({[1] = 1, [20] = 2})", &["0"]),
    ("return {cjson.encode_sparse_array(false, 3, 5)}", &["0"]),
    ("return cjson.encode({[1] = 1, [6] = 2})", &["0"]),
    ("return {cjson.encode_sparse_array('off', 2, 10)}", &["0"]),
    ("return cjson.encode_invalid_numbers('null')", &["0"]),
    ("return cjson.encode({1/0, 2})", &["0"]),
    ("return cjson.encode_invalid_numbers(true)", &["0"]),
    ("return cjson.encode({1/0, -1/0})", &["0"]),
    ("return cjson.encode_invalid_numbers(false)", &["0"]),
    ("return cjson.decode_invalid_numbers(false)", &["0"]),
    ("return cjson.decode('0x10')", &["0"]),
    ("return cjson.decode('[01]')", &["0"]),
    ("return cjson.decode('-5')", &["0"]),
    ("return cjson.decode_invalid_numbers('on')", &["0"]),
    ("return cjson.encode_max_depth(2)", &["0"]),
    ("return cjson.encode({{{1}}})", &["0"]),
    ("return cjson.encode_max_depth(1000)", &["0"]),
    ("return cjson.decode_max_depth(2)", &["0"]),
    ("return cjson.decode('[[[1]]]')", &["0"]),
    ("return cjson.decode_max_depth(1000)", &["0"]),
    ("return cjson.encode_max_depth(0)", &["0"]),
    ("return cjson.encode_keep_buffer('x')", &["0"]),
    ("return cjson.encode_number_precision(1, 2)", &["0"]),
    ("return cjson.encode_number_precision(15)", &["0"]),
    ("return cjson.new().encode({1, 'a'})", &["0"]),
];

fn eval_args<'a>(script: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["EVAL", script];
    a.extend_from_slice(rest);
    a
}

fn run_corpus(proto: u8) {
    let mut p = Pair::start(&format!("diff-lua-{proto}"), &[]);
    if proto == 3 {
        p.hello(3);
    }
    p.check(&["SET", "acct1", "100"]);
    p.check(&["SET", "acct2", "50"]);
    for (script, rest) in CORPUS {
        p.check(&eval_args(script, rest));
    }
    // The writes scripts made are visible to plain commands, on both workers.
    for k in [
        "ka", "counter", "k1", "k2", "k3", "k4", "acct1", "acct2", "fl", "fl3", "num",
    ] {
        p.check(&["GET", k]);
    }
}

// Every script of the corpus gives Redis's exact reply bytes in RESP2.
#[test]
fn corpus_resp2() {
    run_corpus(2);
}

// The same corpus over a RESP3 connection (nulls, booleans, doubles, maps, sets).
#[test]
fn corpus_resp3() {
    run_corpus(3);
}

// EVALSHA, SCRIPT LOAD/EXISTS/FLUSH and numkeys errors match Redis, across connections on
// different workers (connections are spread over the workers by the kernel).
#[test]
fn script_cache() {
    let mut p = Pair::start("diff-lua-cache", &[]);
    let body = "return {KEYS[1], ARGV[1]}";
    let sha = "5b4ba0dd8d0dd3f6e3ee4bb0d1bb1b9e6f0ad2a6";
    p.check(&["EVALSHA", sha, "0"]);
    p.check(&["SCRIPT", "EXISTS", sha, "nope"]);
    let loaded = p.check(&["SCRIPT", "LOAD", body]);
    let loaded_sha = String::from_utf8(loaded[5..45].to_vec()).unwrap();
    p.check(&["SCRIPT", "EXISTS", &loaded_sha, "nope"]);
    p.check(&["SCRIPT", "EXISTS", &loaded_sha.to_uppercase()]);
    p.check(&["EVALSHA", &loaded_sha, "1", "key", "arg"]);
    p.check(&["EVALSHA", &loaded_sha.to_uppercase(), "1", "key", "arg"]);
    p.check(&["EVALSHA_RO", &loaded_sha, "1", "key", "arg"]);
    p.check(&["EVALSHA", "short", "0"]);
    // EVAL puts its script in the cache too.
    p.check(&["EVAL", "return 'cached by eval'", "0"]);
    p.check(&["EVALSHA", "f4b8fe8a1ee6d3a35ae8dc4e5f9c5e1d3ee7b0b0", "0"]);
    let sha_of_eval = sha1_hex("return 'cached by eval'");
    p.check(&["EVALSHA", &sha_of_eval, "0"]);
    // Other connections (possibly on the other worker) see the same catalog.
    let mut others: Vec<(RespConn, RespConn)> = (0..6)
        .map(|_| {
            (
                RespConn::connect(p.lavik.port),
                RespConn::connect(p.redis.port),
            )
        })
        .collect();
    for (l, r) in others.iter_mut() {
        let args: [&[u8]; 5] = [b"EVALSHA", loaded_sha.as_bytes(), b"1", b"k", b"a"];
        assert_eq!(l.call(&args), r.call(&args));
    }
    p.check(&["SCRIPT", "LOAD", "syntax error"]);
    p.check(&["SCRIPT", "LOAD", "#!lua flags=zz\nreturn 1"]);
    p.check(&[
        "SCRIPT",
        "LOAD",
        "#!lua flags=no-writes\nreturn redis.call('del', KEYS[1])",
    ]);
    let ro_sha = sha1_hex("#!lua flags=no-writes\nreturn redis.call('del', KEYS[1])");
    p.check(&["EVALSHA", &ro_sha, "1", "k"]);
    p.check(&["SCRIPT", "LOAD"]);
    p.check(&["SCRIPT", "EXISTS"]);
    p.check(&["SCRIPT", "FLUSH", "BOGUS"]);
    p.check(&["SCRIPT", "NOSUCH"]);
    p.check(&["SCRIPT", "FLUSH"]);
    p.check(&["SCRIPT", "EXISTS", &loaded_sha]);
    for (l, r) in others.iter_mut() {
        let args: [&[u8]; 3] = [b"EVALSHA", loaded_sha.as_bytes(), b"0"];
        assert_eq!(l.call(&args), r.call(&args));
    }
    p.check(&["SCRIPT", "LOAD", body]);
    p.check(&["SCRIPT", "FLUSH", "ASYNC"]);
    p.check(&["EVALSHA", &loaded_sha, "0"]);
    // numkeys.
    p.check(&["EVAL", "return 1", "-1"]);
    p.check(&["EVAL", "return 1", "3", "a"]);
    p.check(&["EVAL", "return 1", "x"]);
    p.check(&["EVAL", "return 1"]);
    p.check(&["EVAL_RO", "return redis.call('get', KEYS[1])", "1", "k"]);
    p.check(&[
        "EVAL_RO",
        "return redis.call('set', KEYS[1], 'x')",
        "1",
        "k",
    ]);
    p.check(&["EVAL_RO", "return redis.pcall('del', KEYS[1])", "1", "k"]);
}

fn sha1_hex(s: &str) -> String {
    String::from_utf8(lavik::scripting::sha1_hex(s.as_bytes()).to_vec()).unwrap()
}

// A key the script did not declare fails with Redis Cluster's error, also when its shard is
// held (lavik's rule: a command touches only its declared keys).
#[test]
fn undeclared_keys() {
    let lavik = common::Server::start("lua-undeclared", &[]);
    let mut c = RespConn::connect(lavik.port);
    let script = "return redis.call('get', 'not_declared')";
    let sha = sha1_hex(script);
    let expect = format!(
        "-ERR Script attempted to access a non local key in a cluster node script: {sha}, on @user_script:1.\r\n"
    );
    assert_eq!(
        c.call(&[b"EVAL", script.as_bytes(), b"0"]),
        expect.as_bytes()
    );
    let script = "return redis.call('get', 'other')";
    let sha = sha1_hex(script);
    let expect = format!(
        "-ERR Script attempted to access a non local key in a cluster node script: {sha}, on @user_script:1.\r\n"
    );
    // Declared "other" is a different key than "x": still refused.
    assert_eq!(
        c.call(&[b"EVAL", script.as_bytes(), b"1", b"x"]),
        expect.as_bytes()
    );
    let pscript = "return redis.pcall('set', 'nope', 1)";
    assert_eq!(
        c.call(&[b"EVAL", pscript.as_bytes(), b"0"]),
        b"-ERR Script attempted to access a non local key in a cluster node\r\n"
    );
    // Commands lavik does not run from scripts say so instead of panicking.
    let r = c.call(&[b"EVAL", b"return redis.pcall('dbsize')", b"0"]);
    assert!(
        r.starts_with(b"-ERR lavik runs only commands on declared keys"),
        "{r:?}"
    );
    assert_eq!(c.call(&[b"PING"]), b"+PONG\r\n");
}

// Doubles are formatted as Redis 7.2 does (shortest round trip; 7.0.15 prints %.17g).
#[test]
fn doubles_as_7_2() {
    let lavik = common::Server::start("lua-doubles", &[]);
    let mut c = RespConn::connect(lavik.port);
    let r = c.call(&[b"EVAL", b"return {double = 3.14}", b"0"]);
    assert_eq!(r, b"$4\r\n3.14\r\n");
    c.call(&[b"HELLO", b"3"]);
    let r = c.call(&[b"EVAL", b"return {double = 3.14}", b"0"]);
    assert_eq!(r, b",3.14\r\n");
}

// Many clients move amounts between keys on both workers with EVAL while a reader sums
// them with EVAL: the total never changes (scripts are atomic across workers).
#[test]
fn transfers_keep_total() {
    let lavik = common::Server::start("lua-transfers", &[]);
    let keys: Vec<String> = (0..8).map(|i| format!("acct:{i}")).collect();
    let mut c = RespConn::connect(lavik.port);
    for k in &keys {
        assert_eq!(c.call(&[b"SET", k.as_bytes(), b"1000"]), b"+OK\r\n");
    }
    let transfer = "local a = tonumber(redis.call('get', KEYS[1])) \
                    local n = tonumber(ARGV[1]) \
                    redis.call('set', KEYS[1], a - n) \
                    redis.call('incrby', KEYS[2], n) return 1";
    let total = "local s = 0 for _, k in ipairs(KEYS) do s = s + tonumber(redis.call('get', k)) end return s";
    let port = lavik.port;
    let movers: Vec<_> = (0..4u64)
        .map(|t| {
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut c = RespConn::connect(port);
                let mut rng = common::diff::Rng::new(t + 1);
                for _ in 0..150 {
                    let a = rng.below(keys.len() as u64) as usize;
                    let b = (a + 1 + rng.below(keys.len() as u64 - 1) as usize) % keys.len();
                    let n = (rng.below(50) + 1).to_string();
                    let args: [&[u8]; 6] = [
                        b"EVAL",
                        transfer.as_bytes(),
                        b"2",
                        keys[a].as_bytes(),
                        keys[b].as_bytes(),
                        n.as_bytes(),
                    ];
                    assert_eq!(c.call(&args), b":1\r\n");
                }
            })
        })
        .collect();
    let mut reads = 0;
    let mut args: Vec<&[u8]> = vec![b"EVAL", total.as_bytes(), b"8"];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    while movers.iter().any(|m| !m.is_finished()) {
        assert_eq!(c.call(&args), b":8000\r\n");
        reads += 1;
    }
    for m in movers {
        m.join().unwrap();
    }
    assert_eq!(c.call(&args), b":8000\r\n");
    assert!(reads > 0);
}

/// Sends SCRIPT KILL on fresh connections until one reaches a worker other than the busy
/// one (a connection that lands on the worker running the script waits for it: given up
/// after 100 ms) and the script is seen running (NOTBUSY before it starts: tried again);
/// returns that reply. Bounded at 60 s.
fn script_kill_from_another_worker(port: u16) -> Vec<u8> {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        s.write_all(b"*2\r\n$6\r\nSCRIPT\r\n$4\r\nKILL\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        if let Ok(n) = s.read(&mut buf) {
            if n > 0 && !buf[..n].starts_with(b"-NOTBUSY") {
                return buf[..n].to_vec();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    panic!("no SCRIPT KILL reached a worker other than the busy one while the script ran");
}

// SCRIPT KILL from another worker stops a looping script with Redis's error; a script that
// wrote is UNKILLABLE; with nothing running the reply is NOTBUSY (Redis's texts).
#[test]
fn script_kill() {
    let lavik = common::Server::start("lua-kill", &[]);
    let mut c = RespConn::connect(lavik.port);
    assert_eq!(
        c.call(&[b"SCRIPT", b"KILL"]),
        b"-NOTBUSY No scripts in execution right now.\r\n"
    );
    let looping = "while true do end";
    c.send(&[b"EVAL", looping.as_bytes(), b"0"]);
    assert_eq!(script_kill_from_another_worker(lavik.port), b"+OK\r\n");
    let expect = format!(
        "-ERR Script killed by user with SCRIPT KILL... script: {}, on @user_script:1.\r\n",
        sha1_hex(looping)
    );
    assert_eq!(c.reply(), expect.as_bytes());
    // pcall cannot swallow the kill.
    let swallow = "while true do pcall(function() while true do end end) end";
    c.send(&[b"EVAL", swallow.as_bytes(), b"0"]);
    assert_eq!(script_kill_from_another_worker(lavik.port), b"+OK\r\n");
    assert!(c
        .reply()
        .starts_with(b"-ERR Script killed by user with SCRIPT KILL..."));
    // A script that wrote runs on (bounded here so the test ends).
    // A script that wrote runs on: here for 4 s of wall time (TIME), whatever the load, so
    // the kill attempts (100 ms each at most) see it running.
    let wrote = "redis.call('set', KEYS[1], '1') \
        local t0 = tonumber(redis.call('time')[1]) \
        while tonumber(redis.call('time')[1]) < t0 + 4 do end return 7";
    c.send(&[b"EVAL", wrote.as_bytes(), b"1", b"w"]);
    let r = script_kill_from_another_worker(lavik.port);
    assert!(
        r.starts_with(b"-UNKILLABLE Sorry the script already executed write commands"),
        "{r:?}"
    );
    assert_eq!(c.reply(), b":7\r\n");
    assert_eq!(c.call(&[b"PING"]), b"+PONG\r\n");
}

// With appendfsync always, a script's reply leaves only after its writes are durable (the
// sync is held 300 ms here), for scripts on one worker and across both; and what a script
// acknowledged survives SIGKILL.
#[test]
fn script_writes_are_durable_before_the_reply() {
    use std::time::{Duration, Instant};
    let mut s = common::Server::start(
        "lua-durable",
        &[
            "--appendfsync",
            "always",
            "--debug-sync-delay-ms",
            "300",
            // No background flush window that would hide a reply not waiting for its sync.
            "--flush-max-ms",
            "60000",
        ],
    );
    let mut c = RespConn::connect(s.port);
    let write = "for i, k in ipairs(KEYS) do redis.call('set', k, ARGV[1]) end return #KEYS";
    for keys in [&["d1"][..], &["d1", "d2", "d3", "d4", "d5", "d6"]] {
        let n = keys.len().to_string();
        let mut args: Vec<&[u8]> = vec![b"EVAL", write.as_bytes(), n.as_bytes()];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        args.push(b"durable");
        let t0 = Instant::now();
        assert_eq!(c.call(&args), format!(":{n}\r\n").as_bytes());
        let took = t0.elapsed();
        // A script over several shards is a write group: it is made durable (one synchronous
        // sync, `docs/atomic-writes.md` section 5) before its reply is even produced, and
        // `--debug-sync-delay-ms` only delays the epochs' asynchronous syncs, so only the
        // one-shard script shows the held reply; both are checked after SIGKILL below.
        if keys.len() == 1 {
            assert!(
                took >= Duration::from_millis(290),
                "{n} keys: reply after {took:?}"
            );
        }
    }
    // A script that only reads durable data does not wait for a sync: one of five tries
    // answers in under 250 ms (a reply held for the 300 ms sync never does; a loaded
    // machine may be slow once).
    let read: [&[u8]; 4] = [b"EVAL", b"return redis.call('get', KEYS[1])", b"1", b"d1"];
    let mut quickest = Duration::MAX;
    for _ in 0..5 {
        let t1 = Instant::now();
        assert_eq!(c.call(&read), b"$7\r\ndurable\r\n");
        quickest = quickest.min(t1.elapsed());
    }
    assert!(
        quickest < Duration::from_millis(250),
        "read took {quickest:?}"
    );
    s.kill9();
    s.restart_after_kill();
    let mut c = RespConn::connect(s.port);
    for k in ["d1", "d2", "d3", "d4", "d5", "d6"] {
        assert_eq!(c.call(&[b"GET", k.as_bytes()]), b"$7\r\ndurable\r\n", "{k}");
    }
}

/// A random command on declared keys, run through `redis.pcall` (and `redis.call`), with
/// the inner protocol chosen by the script.
fn random_inner(rng: &mut common::diff::Rng) -> (String, Vec<String>) {
    const KEYS: &[&str] = &["a", "b", "c", "n1", "n2", "f", "s1", "s2"];
    const VALS: &[&str] = &["", "0", "1", "-7", "42", "hello", "3.5", "1e3", "abc def"];
    let k = |rng: &mut common::diff::Rng| rng.pick(KEYS).to_string();
    let v = |rng: &mut common::diff::Rng| rng.pick(VALS).to_string();
    let n = |rng: &mut common::diff::Rng| (rng.below(21) as i64 - 10).to_string();
    let (cmd, keys, args): (&str, Vec<String>, Vec<String>) = match rng.below(16) {
        0 => ("set", vec![k(rng)], vec![v(rng)]),
        1 => ("get", vec![k(rng)], vec![]),
        2 => ("incr", vec![k(rng)], vec![]),
        3 => ("incrby", vec![k(rng)], vec![n(rng)]),
        4 => (
            "incrbyfloat",
            vec![k(rng)],
            vec![rng.pick(&["1.5", "-2", "abc"]).to_string()],
        ),
        5 => ("append", vec![k(rng)], vec![v(rng)]),
        6 => ("mget", vec![k(rng), k(rng), k(rng)], vec![]),
        7 => ("del", vec![k(rng), k(rng)], vec![]),
        8 => ("exists", vec![k(rng), k(rng)], vec![]),
        9 => ("getdel", vec![k(rng)], vec![]),
        10 => ("strlen", vec![k(rng)], vec![]),
        11 => ("getrange", vec![k(rng)], vec![n(rng), n(rng)]),
        12 => ("type", vec![k(rng)], vec![]),
        13 => ("setnx", vec![k(rng)], vec![v(rng)]),
        14 => ("set", vec![k(rng)], vec![v(rng), "GET".into()]),
        _ => ("getset", vec![k(rng)], vec![v(rng)]),
    };
    let mut keys = keys;
    keys.sort();
    keys.dedup();
    let call = if rng.chance(30) { "call" } else { "pcall" };
    let resp = if rng.chance(50) {
        "redis.setresp(3) "
    } else {
        ""
    };
    // Inner arguments: the keys in order, then the rest (MGET/DEL/EXISTS take keys only).
    let script = format!(
        "{resp}local a = {{}} for i, k in ipairs(KEYS) do a[#a + 1] = k end \
         for i = 2, #ARGV do a[#a + 1] = ARGV[i] end \
         return redis.{call}(ARGV[1], unpack(a))"
    );
    let mut eval = vec![keys.len().to_string()];
    eval.extend(keys);
    eval.push(cmd.to_string());
    eval.extend(args);
    (script, eval)
}

fn random_inner_run(proto: u8, seed: u64) {
    let mut p = Pair::start(&format!("diff-lua-rand-{proto}"), &[]);
    if proto == 3 {
        p.hello(3);
    }
    let mut rng = common::diff::Rng::new(seed);
    for _ in 0..400 {
        let (script, rest) = random_inner(&mut rng);
        let refs: Vec<&str> = rest.iter().map(|s| s.as_str()).collect();
        p.check(&eval_args(&script, &refs));
    }
}

// Random commands on declared keys through redis.call/pcall, in both inner protocols,
// convert and come back exactly as in Redis (RESP2 client).
#[test]
fn random_inner_commands_resp2() {
    random_inner_run(2, 0x5c41_0001);
}

// The same with a RESP3 client.
#[test]
fn random_inner_commands_resp3() {
    random_inner_run(3, 0x5c41_0002);
}
