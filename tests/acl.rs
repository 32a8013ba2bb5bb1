//! ACL behaviour of the real binary that has no Redis counterpart to diff against in
//! this setup: config-file `user` lines, the ACL file (SAVE/LOAD, start-up errors),
//! and rule changes reaching connections that are already open, on any worker.
mod common;
use common::diff::RespConn;
use std::process::Command;

fn call(c: &mut RespConn, args: &[&str]) -> Vec<u8> {
    let a: Vec<&[u8]> = args.iter().map(|x| x.as_bytes()).collect();
    c.call(&a)
}

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

fn sha256_hex(p: &str) -> String {
    let out = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(p.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    text(&out.stdout)[..64].to_string()
}

// `user` lines of the config file define users (the default one included), with quoting.
#[test]
fn config_file_users() {
    let dir = common::temp_dir("acl-conf");
    std::fs::write(
        dir.join("acl.conf"),
        "requirepass ignored\nuser default on >rootpw ~* &* +@all\nuser alice on \">two words\" ~k* +get (+set ~s*)\n",
    )
    .unwrap();
    let s = common::Server::start_in(dir.clone(), &["acl.conf"]);
    let mut c = RespConn::connect(s.port);
    assert_eq!(
        call(&mut c, &["GET", "k"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert!(text(&call(&mut c, &["AUTH", "ignored"])).starts_with("-WRONGPASS"));
    assert_eq!(call(&mut c, &["AUTH", "rootpw"]), b"+OK\r\n");
    let list = text(&call(&mut c, &["ACL", "LIST"]));
    let alice = format!(
        "user alice on #{} ~k* resetchannels -@all +get (~s* resetchannels -@all +set)",
        sha256_hex("two words")
    );
    assert!(list.contains(&alice), "{list}");
    let mut a = RespConn::connect(s.port);
    assert_eq!(call(&mut a, &["AUTH", "alice", "two words"]), b"+OK\r\n");
    // The harness's readiness probe cannot AUTH: wait for recovery here.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while call(&mut a, &["SET", "s1", "v"]).starts_with(b"-LOADING") {
        assert!(std::time::Instant::now() < deadline, "still loading");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(call(&mut a, &["SET", "s1", "v"]), b"+OK\r\n");
    assert_eq!(call(&mut a, &["GET", "k"]), b"$-1\r\n");
    assert_eq!(
        call(&mut a, &["GET", "s1"]),
        b"-NOPERM No permissions to access a key\r\n"
    );
}

// ACL SAVE writes LIST's lines to the ACL file; ACL LOAD replaces the users all or nothing
// and closes the connections of users it removes.
#[test]
fn acl_file_save_and_load() {
    let dir = common::temp_dir("acl-file");
    let file = dir.join("users.acl");
    std::fs::write(&file, "user bob on >bobpw ~b* +@read\n\n").unwrap();
    let file_arg = format!("--aclfile={}", file.display());
    let s = common::Server::start_in(dir.clone(), &[&file_arg]);
    let mut c = RespConn::connect(s.port);
    assert_eq!(
        text(&call(&mut c, &["ACL", "USERS"])),
        "*2\r\n$3\r\nbob\r\n$7\r\ndefault\r\n"
    );
    assert_eq!(
        call(
            &mut c,
            &["ACL", "SETUSER", "carol", "on", "nopass", "+ping"]
        ),
        b"+OK\r\n"
    );
    assert_eq!(call(&mut c, &["ACL", "SAVE"]), b"+OK\r\n");
    let saved = std::fs::read_to_string(&file).unwrap();
    let expected = format!(
        "user bob on #{} ~b* resetchannels -@all +@read\nuser carol on nopass resetchannels -@all +ping\nuser default on nopass ~* &* +@all\n",
        sha256_hex("bobpw")
    );
    assert_eq!(saved, expected);
    let mut bob = RespConn::connect(s.port);
    assert_eq!(call(&mut bob, &["AUTH", "bob", "bobpw"]), b"+OK\r\n");
    // A broken file changes nothing.
    std::fs::write(&file, "user dave on +nocmd\nnot a user line\n").unwrap();
    let err = text(&call(&mut c, &["ACL", "LOAD"]));
    assert!(
        err.starts_with(&format!(
            "-ERR {}:1: Error in applying operation '+nocmd'",
            file.display()
        )) && err.contains("should start with user keyword")
            && err.ends_with("no change to the previously active ACL rules was performed\r\n"),
        "{err}"
    );
    assert_eq!(
        call(&mut bob, &["PING"]),
        b"-NOPERM User bob has no permissions to run the 'ping' command\r\n"
    );
    std::fs::write(&file, "user dave on nopass +@all ~*\n").unwrap();
    assert_eq!(call(&mut c, &["ACL", "LOAD"]), b"+OK\r\n");
    assert_eq!(
        text(&call(&mut c, &["ACL", "USERS"])),
        "*2\r\n$4\r\ndave\r\n$7\r\ndefault\r\n"
    );
    assert!(
        bob.closed(),
        "bob's connection closes when LOAD removes bob"
    );
    assert_eq!(call(&mut c, &["PING"]), b"+PONG\r\n");
}

// Start-up refuses an unreadable or invalid ACL file, and users in both places.
#[test]
fn acl_file_startup_errors() {
    let dir = common::temp_dir("acl-start");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_lavik"))
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let out = run(&["--aclfile", "missing.acl"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("Aborting Redis startup because of ACL errors: Error loading ACLs, opening file 'missing.acl': No such file or directory"),
        "{err}"
    );
    std::fs::write(dir.join("bad.acl"), "user x on bogus\n").unwrap();
    let out = run(&["--aclfile", "bad.acl"]);
    assert!(
        text(&out.stderr).contains("bad.acl:1: Syntax error."),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--aclfile", "bad.acl", "--user", "x on"]);
    assert!(text(&out.stderr).contains("please define either an ACL file or declare users"));
    let out = run(&["--user", "x on +nocmd"]);
    assert!(text(&out.stderr).contains(
        "Error loading ACL rule '+nocmd' for the user named 'x': Unknown command or category name in ACL"
    ));
}

// Rule changes reach open connections on their next command, whichever worker holds them;
// disabling a user closes its connections; RESET returns to the default user.
#[test]
fn changes_reach_open_connections() {
    let s = common::Server::start("acl-live", &["--threads", "2"]);
    let mut admin = RespConn::connect(s.port);
    call(
        &mut admin,
        &["ACL", "SETUSER", "eve", "on", ">pw", "+get", "~*"],
    );
    let mut conns: Vec<RespConn> = (0..4).map(|_| RespConn::connect(s.port)).collect();
    for c in &mut conns {
        assert_eq!(call(c, &["AUTH", "eve", "pw"]), b"+OK\r\n");
        assert_eq!(call(c, &["GET", "k"]), b"$-1\r\n");
    }
    call(&mut admin, &["ACL", "SETUSER", "eve", "-get", "+set"]);
    for c in &mut conns {
        assert_eq!(
            call(c, &["GET", "k"]),
            b"-NOPERM User eve has no permissions to run the 'get' command\r\n"
        );
        assert_eq!(call(c, &["SET", "k", "v"]), b"+OK\r\n");
    }
    assert_eq!(call(&mut conns[0], &["RESET"]), b"+RESET\r\n");
    assert_eq!(
        call(&mut conns[0], &["ACL", "WHOAMI"]),
        b"$7\r\ndefault\r\n"
    );
    assert_eq!(
        call(&mut admin, &["ACL", "SETUSER", "eve", "off"]),
        b"+OK\r\n"
    );
    for c in &mut conns[1..] {
        assert!(c.closed(), "a disabled user's connection is closed");
    }
    assert!(text(&call(&mut conns[0], &["AUTH", "eve", "pw"])).starts_with("-WRONGPASS"));
    assert_eq!(call(&mut conns[0], &["GET", "k"]), b"$1\r\nv\r\n");
}
