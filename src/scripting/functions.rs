//! Redis 7 functions: the library catalog every worker shares, its durable file, and the
//! FUNCTION DUMP / RESTORE payload.
//!
//! A library is its code (with the `#!lua name=<lib>` first line) and the functions its
//! load registered (name, description, flags). The catalog holds only that metadata and
//! the code: each worker's Lua state compiles the libraries itself when it sees the
//! catalog's generation move (see `Engine::sync_functions`). Loading a library runs its code
//! once in the loading worker's state, which yields the metadata; the catalog then checks
//! name collisions under its lock and installs it.
//!
//! Durability: every change writes the whole catalog, as a FUNCTION DUMP payload (RDB
//! function opcode + library code per library, RDB version, CRC-64), to a file beside the
//! data file — temp file, fsync, rename, fsync of the directory — before the change is
//! made visible and before the reply. Startup loads that file. FLUSHALL does not touch it.
//!
//! Names: function names are unique across libraries without regard to case (FCALL finds
//! `F1` as `f1`), library names are case-sensitive, as in Redis.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The script flags Redis 7 knows, in `scripts_flags_def` order (FUNCTION LIST's order).
pub const FLAG_NAMES: [&str; 5] = [
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];
pub const FLAG_NO_WRITES: u8 = 1;

/// The flag bit of `name` (compared without regard to case, as Redis does).
pub fn flag_bit(name: &[u8]) -> Option<u8> {
    FLAG_NAMES
        .iter()
        .position(|f| f.as_bytes().eq_ignore_ascii_case(name))
        .map(|i| 1 << i)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionInfo {
    pub name: String,
    pub desc: Option<Vec<u8>>,
    pub flags: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    pub name: String,
    /// The whole code as loaded, shebang included (FUNCTION LIST WITHCODE, DUMP).
    pub code: Vec<u8>,
    pub functions: Vec<FunctionInfo>,
}

/// What a library's first line declares.
#[derive(Debug, PartialEq, Eq)]
pub struct LibMeta {
    pub name: String,
    /// Where the Lua source starts: the first line feed (kept, so line numbers stay right).
    pub body_at: usize,
}

/// Redis's `functionsVerifyName`: `[A-Za-z0-9_]+`.
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

pub const ERR_BAD_NAME: &str = "Library names can only contain letters, numbers, or underscores(_) and must be at least one character long";

/// Redis's `functionExtractLibMetaData` plus the name and engine checks of
/// `functionsCreateWithLibraryCtx`; errors are full reply texts.
pub fn parse_metadata(code: &[u8]) -> Result<LibMeta, String> {
    if !code.starts_with(b"#!") {
        return Err("ERR Missing library metadata".into());
    }
    let end = code
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| "ERR Invalid library metadata".to_string())?;
    let mut parts = code[..end]
        .split(|b| b.is_ascii_whitespace())
        .filter(|p| !p.is_empty());
    let engine = &parts.next().unwrap_or(b"#!")[2..];
    let mut name: Option<&[u8]> = None;
    for part in parts {
        if part.len() >= 5 && part[..5].eq_ignore_ascii_case(b"name=") {
            if name.is_some() {
                return Err(
                    "ERR Invalid metadata value, name argument was given multiple times".into(),
                );
            }
            name = Some(&part[5..]);
            continue;
        }
        return Err(format!(
            "ERR Invalid metadata value given: {}",
            String::from_utf8_lossy(part)
        ));
    }
    let name = name.ok_or_else(|| "ERR Library name was not given".to_string())?;
    if !valid_name(name) {
        return Err(format!("ERR {ERR_BAD_NAME}"));
    }
    if !engine.eq_ignore_ascii_case(b"lua") {
        return Err(format!(
            "ERR Engine '{}' not found",
            String::from_utf8_lossy(engine)
        ));
    }
    Ok(LibMeta {
        name: String::from_utf8_lossy(name).into_owned(),
        body_at: end,
    })
}

/// FUNCTION RESTORE's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestorePolicy {
    Flush,
    Append,
    Replace,
}

type LibMap = BTreeMap<String, Arc<Library>>;

#[derive(Default)]
struct State {
    libs: LibMap,
    /// The durable file; `None` keeps the catalog in memory only (unit tests, SPDK).
    path: Option<PathBuf>,
}

/// The server-wide library catalog (inside `scripting::Catalog`).
#[derive(Default)]
pub struct Libraries {
    state: Mutex<State>,
    /// Bumped by every change; engines recompile when theirs differs.
    generation: AtomicU64,
}

/// The catalog file beside a data file: `<data file>.functions`.
pub fn file_beside(data_file: &Path) -> PathBuf {
    let mut s = data_file.as_os_str().to_owned();
    s.push(".functions");
    PathBuf::from(s)
}

/// Function `name` among `libs` other than `except`, without regard to case.
fn function_owner<'a>(libs: &'a LibMap, name: &str, except: Option<&str>) -> Option<&'a str> {
    libs.values()
        .filter(|l| Some(l.name.as_str()) != except)
        .find(|l| {
            l.functions
                .iter()
                .any(|f| f.name.eq_ignore_ascii_case(name))
        })
        .map(|l| l.name.as_str())
}

impl Libraries {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("function catalog lock")
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every library, by name.
    pub fn snapshot(&self) -> Vec<Arc<Library>> {
        self.lock().libs.values().cloned().collect()
    }

    pub fn exists(&self, name: &str) -> bool {
        self.lock().libs.contains_key(name)
    }

    /// The library and index of function `name` (any case).
    pub fn find_function(&self, name: &[u8]) -> Option<(Arc<Library>, usize)> {
        let st = self.lock();
        st.libs.values().find_map(|l| {
            l.functions
                .iter()
                .position(|f| f.name.as_bytes().eq_ignore_ascii_case(name))
                .map(|i| (l.clone(), i))
        })
    }

    /// (libraries, functions) counts for FUNCTION STATS.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        let f = st.libs.values().map(|l| l.functions.len()).sum();
        (st.libs.len(), f)
    }

    /// Makes `next` the catalog: persisted first, then visible.
    fn commit(&self, st: &mut State, next: LibMap) -> Result<(), String> {
        if let Some(path) = &st.path {
            write_durably(
                path,
                &dump_payload(next.values().map(|l| l.code.as_slice())),
            )
            .map_err(|e| format!("ERR cannot persist the function catalog: {e}"))?;
        }
        st.libs = next;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// FUNCTION LOAD's final step: adds `lib`, replacing a library of the same name only
    /// with `replace`.
    pub fn install(&self, lib: Library, replace: bool) -> Result<(), String> {
        let mut st = self.lock();
        if st.libs.contains_key(&lib.name) && !replace {
            return Err(format!("ERR Library '{}' already exists", lib.name));
        }
        for f in &lib.functions {
            if function_owner(&st.libs, &f.name, Some(&lib.name)).is_some() {
                return Err(format!("ERR Function {} already exists", f.name));
            }
        }
        let mut next = st.libs.clone();
        next.insert(lib.name.clone(), Arc::new(lib));
        self.commit(&mut st, next)
    }

    pub fn delete(&self, name: &str) -> Result<(), String> {
        let mut st = self.lock();
        if !st.libs.contains_key(name) {
            return Err("ERR Library not found".into());
        }
        let mut next = st.libs.clone();
        next.remove(name);
        self.commit(&mut st, next)
    }

    pub fn flush(&self) -> Result<(), String> {
        let mut st = self.lock();
        self.commit(&mut st, LibMap::new())
    }

    /// FUNCTION RESTORE's join (Redis's `libraryJoin`): `libs` were checked against each
    /// other already.
    pub fn restore(&self, libs: Vec<Library>, policy: RestorePolicy) -> Result<(), String> {
        let mut st = self.lock();
        let mut next = if policy == RestorePolicy::Flush {
            LibMap::new()
        } else {
            st.libs.clone()
        };
        if policy != RestorePolicy::Flush {
            for l in &libs {
                if next.contains_key(&l.name) {
                    if policy == RestorePolicy::Append {
                        return Err(format!("ERR Library {} already exists", l.name));
                    }
                    next.remove(&l.name);
                }
            }
            for l in &libs {
                for f in &l.functions {
                    if function_owner(&next, &f.name, None).is_some() {
                        return Err(format!("ERR Function {} already exists", f.name));
                    }
                }
            }
        }
        for l in libs {
            next.insert(l.name.clone(), Arc::new(l));
        }
        self.commit(&mut st, next)
    }

    /// Startup: makes `path` the durable file and returns the library codes it holds
    /// (empty when it does not exist yet). The caller evaluates them and calls `recovered`.
    pub fn open(&self, path: PathBuf) -> std::io::Result<Vec<Vec<u8>>> {
        let codes = match std::fs::read(&path) {
            Ok(bytes) => parse_payload(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        self.lock().path = Some(path);
        Ok(codes)
    }

    /// Startup: the libraries read back from the file (not written again).
    pub fn recovered(&self, libs: Vec<Library>) {
        let mut st = self.lock();
        for l in libs {
            st.libs.insert(l.name.clone(), Arc::new(l));
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// RDB's `RDB_OPCODE_FUNCTION2` and the pre-GA opcode Redis refuses.
const OPCODE_FUNCTION2: u8 = 245;
const OPCODE_FUNCTION_PRE_GA: u8 = 246;

/// FUNCTION DUMP: one `FUNCTION2` opcode and code string per library, then the footer.
pub fn dump_payload<'a>(codes: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for code in codes {
        out.push(OPCODE_FUNCTION2);
        crate::rdb::put_rdb_string(&mut out, code);
    }
    crate::rdb::append_footer(&mut out);
    out
}

/// FUNCTION RESTORE's parse: the library codes of a payload, or the error reply text.
pub fn parse_payload(payload: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let body = crate::rdb::verify(payload)
        .map_err(|_| "ERR DUMP payload version or checksum are wrong".to_string())?;
    let mut codes = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let opcode = body[at];
        at += 1;
        if opcode == OPCODE_FUNCTION_PRE_GA {
            return Err("ERR Pre-GA function format not supported".into());
        }
        if opcode != OPCODE_FUNCTION2 {
            return Err("ERR given type is not a function".into());
        }
        let (code, used) = crate::rdb::read_rdb_string(&body[at..])
            .map_err(|_| "ERR failed loading the given functions payload".to_string())?;
        at += used;
        codes.push(code);
    }
    Ok(codes)
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a temp file
/// beside it, fsync, rename over `path`, fsync of the directory.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shebang rules and their error texts, as Redis's functionExtractLibMetaData.
    #[test]
    fn metadata() {
        let m = parse_metadata(b"#!lua name=mylib\nreturn").unwrap();
        assert_eq!(m.name, "mylib");
        assert_eq!(m.body_at, 16);
        assert_eq!(parse_metadata(b"#!LUA NAME=x\n").unwrap().name, "x");
        let e = |c: &[u8]| parse_metadata(c).unwrap_err();
        assert_eq!(e(b"lua"), "ERR Missing library metadata");
        assert_eq!(e(b"#!lua name=a"), "ERR Invalid library metadata");
        assert_eq!(e(b"#!lua\n"), "ERR Library name was not given");
        assert_eq!(e(b"#!lua x=1\n"), "ERR Invalid metadata value given: x=1");
        assert_eq!(e(b"#!js name=a\n"), "ERR Engine 'js' not found");
        assert_eq!(e(b"#!lua name=a-b\n"), format!("ERR {ERR_BAD_NAME}"));
    }

    // A dump payload parses back to the same codes; a flipped byte fails the checksum.
    #[test]
    fn payload_round_trip() {
        let codes: Vec<&[u8]> = vec![b"#!lua name=a\nx", &[b'y'; 100]];
        let p = dump_payload(codes.iter().copied());
        assert_eq!(p[0], OPCODE_FUNCTION2);
        assert_eq!(parse_payload(&p).unwrap(), codes);
        let mut bad = p.clone();
        bad[3] ^= 1;
        assert!(parse_payload(&bad).is_err());
        assert_eq!(
            parse_payload(&dump_payload(std::iter::empty()))
                .unwrap()
                .len(),
            0
        );
    }

    // Function names collide without regard to case; REPLACE may reuse its own names.
    #[test]
    fn collisions() {
        let libs = Libraries::default();
        let lib = |name: &str, f: &str| Library {
            name: name.into(),
            code: Vec::new(),
            functions: vec![FunctionInfo {
                name: f.into(),
                desc: None,
                flags: 0,
            }],
        };
        libs.install(lib("a", "f"), false).unwrap();
        assert_eq!(
            libs.install(lib("b", "F"), false).unwrap_err(),
            "ERR Function F already exists"
        );
        assert_eq!(
            libs.install(lib("a", "g"), false).unwrap_err(),
            "ERR Library 'a' already exists"
        );
        libs.install(lib("a", "F"), true).unwrap();
        assert!(libs.find_function(b"f").is_some());
        libs.delete("a").unwrap();
        assert_eq!(libs.delete("a").unwrap_err(), "ERR Library not found");
    }
}
