//! The function library catalog is durable: every FUNCTION LOAD / DELETE / RESTORE / FLUSH
//! is on disk (`<data file>.functions`) before its reply, so libraries survive a clean
//! restart and a SIGKILL; FLUSHALL does not clear them.
mod common;
use common::diff::RespConn;
use common::Server;

const LIB_A: &str = "#!lua name=liba\nredis.register_function{function_name='fa', callback=function(keys, args) return 'a:' .. args[1] end, flags={'no-writes'}, description='first'}";
const LIB_B: &str = "#!lua name=libb\nredis.register_function('fb', function(keys) return redis.call('incr', keys[1]) end)";
const LIB_C: &str = "#!lua name=libc\nredis.register_function('fc', function() return 3 end)";

fn call(c: &mut RespConn, args: &[&str]) -> Vec<u8> {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    c.call(&a)
}

fn conn(s: &Server) -> RespConn {
    RespConn::connect(s.port)
}

/// The catalog as FUNCTION LIST WITHCODE shows it, and what the functions answer.
fn observe(s: &Server) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut c = conn(s);
    let list = call(&mut c, &["FUNCTION", "LIST", "WITHCODE"]);
    let calls = vec![
        call(&mut c, &["FCALL_RO", "fa", "0", "x"]),
        call(&mut c, &["FCALL", "fc", "0"]),
        call(&mut c, &["FCALL", "FB", "1", "counter"]),
    ];
    (list, calls)
}

// Libraries loaded, replaced, deleted and restored are all back after a clean restart and
// after SIGKILL, FLUSHALL keeps them, FUNCTION FLUSH's emptiness is durable too, and
// FCALL's acknowledged writes survive SIGKILL with appendfsync always.
#[test]
fn catalog_survives_restart_and_sigkill() {
    let mut s = Server::start("dur-func", &["--threads", "2", "--appendfsync", "always"]);
    let mut c = conn(&s);
    assert_eq!(
        call(&mut c, &["FUNCTION", "LOAD", LIB_A]),
        b"$4\r\nliba\r\n"
    );
    assert_eq!(
        call(&mut c, &["FUNCTION", "LOAD", LIB_B]),
        b"$4\r\nlibb\r\n"
    );
    assert_eq!(
        call(&mut c, &["FUNCTION", "LOAD", LIB_C]),
        b"$4\r\nlibc\r\n"
    );
    let dump = call(&mut c, &["FUNCTION", "DUMP"]);
    assert_eq!(call(&mut c, &["FUNCTION", "DELETE", "libc"]), b"+OK\r\n");
    assert_eq!(
        call(&mut c, &["FUNCTION", "LOAD", "REPLACE", LIB_C]),
        b"$4\r\nlibc\r\n"
    );
    assert_eq!(call(&mut c, &["FLUSHALL"]), b"+OK\r\n");
    let before = observe(&s);
    assert!(before.1[0].starts_with(b"$3\r\na:x"), "{:?}", before.1);
    drop(c);

    s.restart();
    let after_clean = observe(&s);
    assert_eq!(after_clean.0, before.0);
    assert_eq!(after_clean.1[..2], before.1[..2]);

    // SIGKILL right after a reply: the change it acknowledged is on disk.
    let mut c = conn(&s);
    assert_eq!(call(&mut c, &["FUNCTION", "DELETE", "liba"]), b"+OK\r\n");
    s.restart_after_kill();
    let mut c2 = conn(&s);
    assert_eq!(
        call(&mut c2, &["FCALL_RO", "fa", "0", "x"]),
        b"-ERR Function not found\r\n"
    );
    assert_eq!(call(&mut c2, &["FCALL", "fc", "0"]), b":3\r\n");
    // The writes FCALL acknowledged (two INCRs through `fb`) are durable too.
    assert_eq!(call(&mut c2, &["GET", "counter"]), b"$1\r\n2\r\n");
    let dumped: Vec<u8> =
        dump[dump.iter().position(|&b| b == b'\n').unwrap() + 1..dump.len() - 2].to_vec();
    assert_eq!(
        c2.call(&[b"FUNCTION", b"RESTORE", &dumped, b"REPLACE"]),
        b"+OK\r\n"
    );
    drop(c);
    s.restart_after_kill();
    let restored = observe(&s);
    assert_eq!(restored.0, before.0);

    let mut c = conn(&s);
    assert_eq!(call(&mut c, &["FUNCTION", "FLUSH"]), b"+OK\r\n");
    s.restart_after_kill();
    let mut c = conn(&s);
    assert_eq!(call(&mut c, &["FUNCTION", "LIST"]), b"*0\r\n");
    assert!(has_functions_file(&s));
}

fn has_functions_file(s: &Server) -> bool {
    std::fs::read_dir(&s.dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".functions")
    })
}
