//! The offline tools of the `lavik` binary that start no server: `plan` and
//! `--command-reference`.
use std::process::Command;

fn lavik(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lavik"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Proves `lavik --command-reference` prints exactly the committed docs/commands.md.
#[test]
fn command_reference_is_the_committed_file() {
    let (code, text, _) = lavik(&["--command-reference"]);
    assert_eq!(code, 0);
    let file =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md")).unwrap();
    assert!(
        text == file,
        "docs/commands.md differs from the binary's output"
    );
}

// Proves `lavik plan` prints RAM, device and Redis figures for 10M x 1 KiB and refuses bad arguments with exit 2.
#[test]
fn plan_prints_and_validates() {
    let (code, text, err) = lavik(&[
        "plan",
        "--keys",
        "10000000",
        "--value-bytes",
        "1024",
        "--ttl-share",
        "0.5",
        "--threads",
        "1",
        "--cache-size",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    // 10M x 11.31 B/key index; 5M volatile keys x 2 B; 1072-byte records.
    assert!(
        text.contains("index (11.31 B/key, at least 2621440 per shard) 113100000 bytes"),
        "{text}"
    );
    assert!(text.contains("10000000 bytes"), "{text}");
    assert!(text.contains("record size            1072 bytes"), "{text}");
    assert!(text.contains("Redis 7 RAM for the same data"), "{text}");
    let (code, _, err) = lavik(&["plan", "--keys", "10"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--keys and --value-bytes are required"),
        "{err}"
    );
}
