//! The default data file grows with the data (issue 16), through the real binary: no
//! `--data-file-size`, an empty directory, small first size and step (hidden flags) so the
//! test writes tens of MiB instead of the gigabytes the defaults are sized for.
mod common;

const MIB: u64 = 1 << 20;

fn info_field(c: &mut redis::Connection, name: &str) -> String {
    let info: String = redis::cmd("INFO").arg("storage").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO: {info}"))
        .trim()
        .to_string()
}

fn info_u64(c: &mut redis::Connection, name: &str) -> u64 {
    info_field(c, name).parse().unwrap()
}

/// Writes `keys` values of `value_len` bytes in pipelines; returns the first error, if any.
fn fill(c: &mut redis::Connection, keys: usize, value_len: usize) -> Option<String> {
    for batch in (0..keys).collect::<Vec<_>>().chunks(64) {
        let mut p = redis::pipe();
        for &i in batch {
            let value = vec![b'a' + (i % 26) as u8; value_len];
            p.cmd("SET").arg(format!("grow:{i}")).arg(value).ignore();
        }
        if let Err(e) = p.query::<()>(c) {
            return Some(e.to_string());
        }
    }
    None
}

fn file_len(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join("lavik.data")).unwrap().len()
}

// With no size flag the data file starts at its first size and grows in steps as data
// arrives (no -OOM), INFO and the log say so, and a restart recovers every key from the
// grown file.
#[test]
fn default_data_file_grows_with_the_data_and_recovers() {
    let mut s = common::Server::start(
        "grow",
        &[
            "--data-file-initial-size",
            "32mb",
            "--data-file-grow-step",
            "16mb",
            "--threads",
            "1",
        ],
    );
    assert_eq!(file_len(&s.dir), 32 * MIB, "first size");
    let mut c = s.client();
    assert_eq!(info_field(&mut c, "lavik_data_file_growable"), "1");
    assert_eq!(
        info_u64(&mut c, "lavik_data_file_grow_step_bytes"),
        16 * MIB
    );
    // 6000 x 16 KiB = 94 MiB of values: three times the first size.
    const KEYS: usize = 6000;
    const VALUE: usize = 16 << 10;
    assert_eq!(fill(&mut c, KEYS, VALUE), None);
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, KEYS as u64);
    let size = info_u64(&mut c, "lavik_data_file_bytes");
    assert!(size >= 94 * MIB, "only {size} bytes");
    assert_eq!(size, file_len(&s.dir));
    assert!(info_u64(&mut c, "lavik_data_file_grows") >= 4);
    let room = info_u64(&mut c, "lavik_data_file_room_bytes");
    assert_eq!(room, info_u64(&mut c, "lavik_data_file_max_bytes") - size);
    assert_eq!(info_field(&mut c, "lavik_data_file_grow_error"), "");
    assert!(s.stderr().contains("the data file grew"), "{}", s.stderr());
    drop(c);
    s.restart();
    let mut c = s.client();
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, KEYS as u64);
    for i in [0, 1, KEYS / 2, KEYS - 1] {
        let v: Vec<u8> = redis::cmd("GET")
            .arg(format!("grow:{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(v, vec![b'a' + (i % 26) as u8; VALUE], "key {i}");
    }
    assert_eq!(info_u64(&mut c, "lavik_data_file_bytes"), size);
}

// --data-file-max-size stops the growth: the file ends at the limit, writes then answer
// -OOM as on a full fixed-size file, INFO shows no room left and the log says why.
#[test]
fn growth_stops_at_the_limit() {
    let s = common::Server::start(
        "grow-limit",
        &[
            "--data-file-initial-size",
            "32mb",
            "--data-file-grow-step",
            "16mb",
            "--data-file-max-size",
            "48mb",
            "--threads",
            "1",
        ],
    );
    let mut c = s.client();
    assert_eq!(info_u64(&mut c, "lavik_data_file_max_bytes"), 48 * MIB);
    let err = fill(&mut c, 6000, 16 << 10).expect("writes past the limit fail");
    assert!(err.contains("data device is full"), "{err}");
    assert_eq!(file_len(&s.dir), 48 * MIB);
    assert_eq!(info_u64(&mut c, "lavik_data_file_bytes"), 48 * MIB);
    assert_eq!(info_u64(&mut c, "lavik_data_file_room_bytes"), 0);
    assert!(
        s.stderr().contains("reached its size limit"),
        "{}",
        s.stderr()
    );
    // Reads go on working.
    let v: Vec<u8> = redis::cmd("GET").arg("grow:0").query(&mut c).unwrap();
    assert_eq!(v.len(), 16 << 10);
}

// An explicit --data-file-size keeps today's fixed size: no growth, INFO says so.
#[test]
fn explicit_size_stays_fixed() {
    let s = common::Server::start("grow-fixed", &["--threads", "1"]);
    let mut c = s.client();
    assert_eq!(info_field(&mut c, "lavik_data_file_growable"), "0");
    assert_eq!(file_len(&s.dir), 256 * MIB);
}
