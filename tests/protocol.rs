//! Black-box protocol tests: raw RESP bytes in, exact bytes out.
mod common;
use common::Server;

// Inline and multibulk requests both work, and pipelined replies keep order.
#[test]
fn inline_multibulk_and_pipelining() {
    let s = Server::start("proto-basic", &[]);
    let mut c = s.raw();
    c.send(b"PING\r\n");
    assert_eq!(c.read_exact(7), b"+PONG\r\n");
    c.send(b"set k1 \"hello world\"\r\nGET k1\r\n");
    assert_eq!(c.read_exact(5 + 18), b"+OK\r\n$11\r\nhello world\r\n");
    // 200 pipelined commands across keys on both workers, replies in order.
    let mut req = Vec::new();
    let mut want = Vec::new();
    for i in 0..100 {
        let k = format!("key:{i}");
        let v = format!("v{i}");
        req.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
                k.len(),
                v.len()
            )
            .as_bytes(),
        );
        req.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n{k}\r\n", k.len()).as_bytes());
        want.extend_from_slice(format!("+OK\r\n${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    c.send(&req);
    assert_eq!(
        String::from_utf8_lossy(&c.read_exact(want.len())),
        String::from_utf8_lossy(&want)
    );
    // Empty lines and *0 frames are ignored without a reply.
    c.send(b"\r\n*0\r\nPING\r\n");
    assert_eq!(c.read_exact(7), b"+PONG\r\n");
}

// A request split into single bytes still parses (incomplete is not an error).
#[test]
fn byte_at_a_time() {
    let s = Server::start("proto-split", &[]);
    let mut c = s.raw();
    for b in b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$3\r\nxyz\r\n" {
        c.send(&[*b]);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(c.read_exact(5), b"+OK\r\n");
    c.expect(&[b"GET", b"a"], b"$3\r\nxyz\r\n");
}

// Malformed frames get Redis's protocol error and the connection is closed.
#[test]
fn protocol_errors_close_connection() {
    let s = Server::start("proto-errors", &[]);
    let cases: &[(&[u8], &str)] = &[
        (
            b"*1\r\n+foo\r\n",
            "-ERR Protocol error: expected '$', got '+'\r\n",
        ),
        (
            b"*x\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$-3\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$600000000\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*9999999\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"SET \"unbalanced\r\n",
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ];
    for (req, reply) in cases {
        let mut c = s.raw();
        c.send(b"PING\r\n");
        assert_eq!(c.read_exact(7), b"+PONG\r\n");
        c.send(req);
        assert_eq!(String::from_utf8_lossy(&c.read_exact(reply.len())), *reply);
        assert!(
            c.is_closed(),
            "connection stays open after {:?}",
            String::from_utf8_lossy(req)
        );
    }
    // An inline request over 64 KiB without a newline.
    let mut c = s.raw();
    c.send(&vec![b'a'; 70 * 1024]);
    let want = "-ERR Protocol error: too big inline request\r\n";
    assert_eq!(String::from_utf8_lossy(&c.read_exact(want.len())), want);
    assert!(c.is_closed());
    // The server is still fine for others.
    let mut c = s.raw();
    c.expect(&[b"PING"], b"+PONG\r\n");
}

// Unknown commands and wrong arity give Redis's exact error strings.
#[test]
fn command_errors() {
    let s = Server::start("proto-cmderr", &[]);
    let mut c = s.raw();
    c.expect(
        &[b"FOO", b"a", b"b"],
        b"-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n",
    );
    c.expect(
        &[b"GET"],
        b"-ERR wrong number of arguments for 'get' command\r\n",
    );
    c.expect(
        &[b"SET", b"k"],
        b"-ERR wrong number of arguments for 'set' command\r\n",
    );
    c.expect(&[b"SET", b"k", b"v", b"BOGUS"], b"-ERR syntax error\r\n");
    c.expect(
        &[b"SET", b"k", b"v", b"EX", b"0"],
        b"-ERR invalid expire time in 'set' command\r\n",
    );
    c.expect(
        &[b"SET", b"k", b"v", b"EX", b"x"],
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.expect(
        &[b"SET", b"k", b"v", b"NX", b"XX"],
        b"-ERR syntax error\r\n",
    );
    c.expect(&[b"SET", b"n", b"abc"], b"+OK\r\n");
    c.expect(
        &[b"INCR", b"n"],
        b"-ERR value is not an integer or out of range\r\n",
    );
    c.expect(&[b"SET", b"n", b"9223372036854775807"], b"+OK\r\n");
    c.expect(
        &[b"INCR", b"n"],
        b"-ERR increment or decrement would overflow\r\n",
    );
    c.expect(
        &[b"MSET", b"a", b"1", b"b"],
        b"-ERR wrong number of arguments for 'mset' command\r\n",
    );
    c.expect(&[b"SELECT", b"16"], b"-ERR DB index is out of range\r\n");
    c.expect(&[b"RENAME", b"nosuch", b"x"], b"-ERR no such key\r\n");
    c.expect(
        &[b"EXPIRE", b"k", b"10", b"NX", b"XX"],
        b"-ERR NX and XX, GT or LT options at the same time are not compatible\r\n",
    );
    c.expect(
        &[b"HELLO", b"4"],
        b"-NOPROTO unsupported protocol version\r\n",
    );
    c.expect(&[b"AUTH", b"x"], b"-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n");
    c.expect(
        &[b"CLIENT", b"FOO"],
        b"-ERR unknown subcommand 'FOO'. Try CLIENT HELP.\r\n",
    );
    c.expect(
        &[b"INCRBYFLOAT", b"n", b"abc"],
        b"-ERR value is not a valid float\r\n",
    );
    c.expect(
        &[b"SETRANGE", b"k", b"-1", b"x"],
        b"-ERR offset is out of range\r\n",
    );
}

// RESP3 after HELLO 3: nulls, maps and doubles use the RESP3 types.
#[test]
fn resp3_types() {
    let s = Server::start("proto-resp3", &[]);
    let mut c = s.raw();
    c.expect(&[b"GET", b"missing"], b"$-1\r\n");
    c.cmd(&[b"HELLO", b"3"]);
    let head = c.read_exact(3);
    assert_eq!(head, b"%7\r");
    // Drain the rest of the HELLO map: read until the modules entry.
    let mut rest = Vec::new();
    while !rest.ends_with(b"$7\r\nmodules\r\n*0\r\n") {
        rest.extend(c.read_exact(1));
    }
    c.expect(&[b"GET", b"missing"], b"_\r\n");
    c.expect(&[b"SET", b"f", b"1.5"], b"+OK\r\n");
    c.expect(&[b"INCRBYFLOAT", b"f", b"1"], b"$3\r\n2.5\r\n");
    c.expect(
        &[b"CONFIG", b"GET", b"maxclients"],
        b"%1\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n",
    );
    c.expect(&[b"HELLO", b"2"], b"*14\r\n");
}

// Authentication: NOAUTH before AUTH, WRONGPASS on a bad password.
#[test]
fn requirepass() {
    let s = Server::start("proto-auth", &["--requirepass", "s3cret"]);
    let mut c = s.raw();
    c.expect(&[b"GET", b"k"], b"-NOAUTH Authentication required.\r\n");
    c.expect(
        &[b"AUTH", b"nope"],
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    c.expect(&[b"AUTH", b"s3cret"], b"+OK\r\n");
    c.expect(&[b"GET", b"k"], b"$-1\r\n");
    let mut c2 = s.raw();
    c2.expect(&[b"AUTH", b"default", b"s3cret"], b"+OK\r\n");
}

// maxclients is enforced with Redis's error, and the slot frees on disconnect.
#[test]
fn maxclients() {
    let s = Server::start("proto-maxclients", &["--maxclients", "2"]);
    let mut a = s.raw();
    a.expect(&[b"PING"], b"+PONG\r\n");
    // The start-up probe's connection may not be counted out yet.
    a.wait_connected_clients(1);
    let mut b = s.raw();
    b.expect(&[b"PING"], b"+PONG\r\n");
    let mut c = s.raw();
    let want = b"-ERR max number of clients reached\r\n";
    assert_eq!(c.read_exact(want.len()), want);
    assert!(c.is_closed());
    drop(a);
    b.wait_connected_clients(1);
    let mut d = s.raw();
    d.expect(&[b"PING"], b"+PONG\r\n");
}

// QUIT replies OK and closes; a huge declared bulk is buffered, not fatal.
#[test]
fn quit_and_large_values() {
    let s = Server::start("proto-quit", &[]);
    let mut c = s.raw();
    let big = vec![b'x'; 3 * 1024 * 1024];
    c.cmd(&[b"SET", b"big", &big]);
    assert_eq!(c.read_exact(5), b"+OK\r\n");
    c.expect(&[b"STRLEN", b"big"], b":3145728\r\n");
    c.cmd(&[b"GET", b"big"]);
    let got = c.read_exact(big.len() + 12);
    assert_eq!(&got[..11], b"$3145728\r\nx");
    c.expect(&[b"QUIT"], b"+OK\r\n");
    assert!(c.is_closed());
}
