//! Access control as Redis 7.2's ACL: users, the rules that shape them,
//! the permission check every command goes through, and the ACL log.
//!
//! Sans-IO: this module owns no sockets and reads no files. The server
//! keeps one `AclState` for the whole process (users are server-wide) and
//! bumps a generation counter on every change; a connection caches an
//! `Arc<User>` with the generation it was read at, so the command path takes
//! no lock unless the ACLs changed since its last command.
//!
//! What a check needs is the command's id (`catalog`), its arguments and the
//! key arguments with the access each needs (read/write, from Redis's key
//! specs). Channels are checked the same way once lavik has pub/sub.
//!
//! Scripts check the commands they call against the caller's user
//! (`ScriptCaller`, set by the worker around a script command; logged with
//! context `lua`). Deliberately missing: the `multi` context in the log
//! (EXEC re-checks its queued commands without logging), `acllog-max-len` as a
//! setting (fixed at Redis's default), module-based authentication.

pub mod catalog;
pub mod log;
pub mod user;

pub use catalog::{catalog, category_bit, key_access, CATEGORIES, KEY_READ, KEY_WRITE};
pub use log::{AclLog, Reason};
pub use user::{hash_password, merge_selector_args, Denied, KeyRef, RuleError, User};

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Who runs the script on this thread, when that user is restricted: the commands the
/// script calls are checked against `user` (Redis's `scriptVerifyACL`), and a denial is
/// logged with the caller's `client_info`. `None` (the default user, or any user with
/// every permission): nothing to check.
#[derive(Debug)]
pub struct ScriptCaller {
    pub user: Arc<User>,
    pub client_info: String,
}

thread_local! {
    static SCRIPT_CALLER: RefCell<Option<Arc<ScriptCaller>>> = const { RefCell::new(None) };
}

/// Sets the restricted user whose script runs on this thread; returns the previous one
/// (to restore).
pub fn set_script_caller(caller: Option<Arc<ScriptCaller>>) -> Option<Arc<ScriptCaller>> {
    SCRIPT_CALLER.with(|c| c.replace(caller))
}

/// Sets the script caller for a scope and puts the previous one back when dropped. Setting
/// `None` over `None` (every unrestricted caller) touches nothing.
pub struct ScriptCallerScope(Option<Option<Arc<ScriptCaller>>>);

impl ScriptCallerScope {
    pub fn set(caller: Option<Arc<ScriptCaller>>) -> ScriptCallerScope {
        if caller.is_none() && SCRIPT_CALLER.with(|c| c.borrow().is_none()) {
            return ScriptCallerScope(None);
        }
        ScriptCallerScope(Some(set_script_caller(caller)))
    }
}

impl Drop for ScriptCallerScope {
    fn drop(&mut self) {
        if let Some(prev) = self.0.take() {
            set_script_caller(prev);
        }
    }
}

/// The restricted user whose script runs on this thread, if any.
pub fn script_caller() -> Option<Arc<ScriptCaller>> {
    SCRIPT_CALLER.with(|c| c.borrow().clone())
}

/// Every user (by name, in byte order as Redis's radix tree lists them) and the log.
#[derive(Debug)]
pub struct AclState {
    pub users: BTreeMap<String, Arc<User>>,
    pub log: AclLog,
}

impl Default for AclState {
    fn default() -> Self {
        let mut users = BTreeMap::new();
        users.insert("default".to_string(), Arc::new(User::new_default()));
        AclState {
            users,
            log: AclLog::default(),
        }
    }
}

pub const ERR_USERNAME_SPACES: &str = "ERR Usernames can't contain spaces or null characters";

fn has_spaces(s: &[u8]) -> bool {
    s.iter()
        .any(|&c| c.is_ascii_whitespace() || c == 0 || c == 0x0b)
}

impl AclState {
    pub fn user(&self, name: &str) -> Option<&Arc<User>> {
        self.users.get(name)
    }

    pub fn default_user(&self) -> &Arc<User> {
        self.users.get("default").expect("the default user exists")
    }

    /// `ACL SETUSER name ops...`: creates the user if needed; all or nothing.
    pub fn set_user(&mut self, name: &[u8], ops: &[Vec<u8>]) -> Result<(), String> {
        if has_spaces(name) {
            return Err(ERR_USERNAME_SPACES.into());
        }
        let name = String::from_utf8_lossy(name).into_owned();
        let mut u = match self.users.get(&name) {
            Some(u) => User::clone(u),
            None => User::new(&name),
        };
        u.apply_all(ops)?;
        self.users.insert(name, Arc::new(u));
        Ok(())
    }

    /// `requirepass`: the default user gets exactly this password, or `nopass`.
    pub fn set_default_password(&mut self, pass: Option<&[u8]>) {
        let mut u = User::clone(self.default_user());
        u.apply(b"resetpass").expect("resetpass is valid");
        match pass {
            Some(p) => {
                let mut op = b">".to_vec();
                op.extend_from_slice(p);
                u.apply(&op).expect("a password rule is valid");
            }
            None => u.apply(b"nopass").expect("nopass is valid"),
        }
        self.users.insert("default".into(), Arc::new(u));
    }

    /// `ACL LIST` lines (also the ACL file's content).
    pub fn list_lines(&self) -> Vec<Vec<u8>> {
        self.users
            .values()
            .map(|u| {
                let mut line = format!("user {} ", u.name).into_bytes();
                line.extend_from_slice(&u.describe());
                line
            })
            .collect()
    }

    /// The ACL file's text for `ACL SAVE`.
    pub fn file_text(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for l in self.list_lines() {
            out.extend_from_slice(&l);
            out.push(b'\n');
        }
        out
    }
}

/// Users from `user NAME rules...` lines of the config file (each line's words after
/// `user`), applied over the default state: a `default` line resets the default user
/// first. Errors name the rule and user as Redis's startup log does.
pub fn users_from_config(lines: &[Vec<Vec<u8>>]) -> Result<AclState, String> {
    let mut st = AclState::default();
    let mut seen: Vec<&[u8]> = Vec::new();
    for words in lines {
        let Some((name, ops)) = words.split_first() else {
            return Err("'user' needs a username".into());
        };
        if seen.contains(&name.as_slice()) {
            return Err(format!(
                "Duplicate user '{}': a user can only be defined once in config files",
                String::from_utf8_lossy(name)
            ));
        }
        seen.push(name);
        if has_spaces(name) {
            return Err("Spaces not allowed in ACL usernames".into());
        }
        let merged = merge_selector_args(ops).map_err(|start| {
            format!(
                "Unmatched parenthesis in acl selector starting at '{}'",
                String::from_utf8_lossy(start)
            )
        })?;
        let uname = String::from_utf8_lossy(name).into_owned();
        let mut u = if uname == "default" {
            let mut u = User::new_default();
            u.apply(b"reset").expect("reset is valid");
            u
        } else {
            User::new(&uname)
        };
        for op in &merged {
            u.apply(op).map_err(|e| {
                format!(
                    "Error loading ACL rule '{}' for the user named '{}': {}",
                    String::from_utf8_lossy(op),
                    uname,
                    e.text()
                )
            })?;
        }
        st.users.insert(uname, Arc::new(u));
    }
    Ok(st)
}

/// Parses an ACL file (`ACL LOAD`, `aclfile` at start) into the users it defines;
/// `Err` is Redis's one-line error list. `file` names the file in the messages.
pub fn users_from_file(text: &[u8], file: &str) -> Result<BTreeMap<String, Arc<User>>, String> {
    let mut users: BTreeMap<String, Arc<User>> = BTreeMap::new();
    let mut errors = String::new();
    for (i, raw) in text.split(|&c| c == b'\n').enumerate() {
        let line_no = i + 1;
        let line = trim(raw);
        if line.is_empty() {
            continue;
        }
        let words: Vec<Vec<u8>> = line
            .split(|&c| c == b' ')
            .filter(|w| !w.is_empty())
            .map(|w| w.to_vec())
            .collect();
        if words.is_empty() {
            continue;
        }
        if words[0] != b"user" || words.len() < 2 {
            errors.push_str(&format!(
                "{file}:{line_no} should start with user keyword followed by the username. "
            ));
            continue;
        }
        let name = String::from_utf8_lossy(&words[1]).into_owned();
        if has_spaces(&words[1]) {
            errors.push_str(&format!(
                "'{file}:{line_no}: username '{name}' contains invalid characters. "
            ));
            continue;
        }
        if users.contains_key(&name) {
            errors.push_str(&format!(
                "WARNING: Duplicate user '{name}' found on line {line_no}. "
            ));
            continue;
        }
        let mut u = User::new(&name);
        let Ok(merged) = merge_selector_args(&words[2..]) else {
            errors.push_str(&format!(
                "{file}:{line_no}: Unmatched parenthesis in selector definition."
            ));
            continue;
        };
        let mut syntax_error = false;
        for op in &merged {
            let op = trim(op);
            if let Err(e) = u.apply(op) {
                if e == RuleError::UnknownCommand {
                    errors.push_str(&format!(
                        "{file}:{line_no}: Error in applying operation '{}': {}. ",
                        String::from_utf8_lossy(op),
                        e.text()
                    ));
                } else if !syntax_error {
                    errors.push_str(&format!("{file}:{line_no}: {}. ", e.text()));
                    syntax_error = true;
                }
            }
        }
        users.insert(name, Arc::new(u));
    }
    if !errors.is_empty() {
        errors.push_str(
            "WARNING: ACL errors detected, no change to the previously active ACL rules was performed",
        );
        return Err(errors);
    }
    users
        .entry("default".into())
        .or_insert_with(|| Arc::new(User::new_default()));
    Ok(users)
}

fn trim(s: &[u8]) -> &[u8] {
    let is_ws = |c: &u8| matches!(c, b' ' | b'\t' | b'\r' | b'\n');
    let start = s.iter().position(|c| !is_ws(c)).unwrap_or(s.len());
    let end = s.iter().rposition(|c| !is_ws(c)).map_or(start, |e| e + 1);
    &s[start..end]
}

/// The NOPERM error line (without `-`) for a denial, as Redis 7.2 words it.
pub fn noperm_message(denied: Denied, user: &str, command: &str) -> String {
    match denied {
        Denied::Command => {
            format!("NOPERM User {user} has no permissions to run the '{command}' command")
        }
        Denied::Key(_) => "NOPERM No permissions to access a key".into(),
        Denied::Channel(_) => "NOPERM No permissions to access a channel".into(),
    }
}

/// `ACL DRYRUN`'s verbose wording (a bulk string, not an error).
pub fn dryrun_message(denied: Denied, user: &str, command: &str, arg: &[u8]) -> String {
    let arg = String::from_utf8_lossy(arg);
    match denied {
        Denied::Command => {
            format!("User {user} has no permissions to run the '{command}' command")
        }
        Denied::Key(_) => format!("User {user} has no permissions to access the '{arg}' key"),
        Denied::Channel(_) => {
            format!("User {user} has no permissions to access the '{arg}' channel")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
    }

    // SETUSER creates, updates all-or-nothing and rejects usernames with spaces.
    #[test]
    fn set_user() {
        let mut st = AclState::default();
        st.set_user(b"alice", &words("on >p ~k* +get")).unwrap();
        assert!(st.set_user(b"alice", &words("off bogus")).is_err());
        assert!(st.user("alice").unwrap().enabled);
        assert_eq!(
            st.set_user(b"a b", &[]),
            Err(ERR_USERNAME_SPACES.to_string())
        );
        let lines: Vec<String> = st
            .list_lines()
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                format!(
                    "user alice on #{} ~k* resetchannels -@all +get",
                    hash_password(b"p")
                ),
                "user default on nopass ~* &* +@all".to_string()
            ]
        );
    }

    // requirepass replaces the default user's passwords, and clearing it restores nopass.
    #[test]
    fn default_password() {
        let mut st = AclState::default();
        st.set_default_password(Some(b"pw"));
        let d = st.default_user();
        assert!(!d.nopass && d.password_ok(b"pw") && !d.password_ok(b"x"));
        st.set_default_password(None);
        assert!(st.default_user().nopass);
    }

    // An ACL file round-trips through SAVE's text; a bad line rejects the whole file.
    #[test]
    fn file_round_trip() {
        let mut st = AclState::default();
        st.set_user(b"bob", &words("on nopass %R~r* (+get ~x)"))
            .unwrap();
        let text = st.file_text();
        let users = users_from_file(&text, "users.acl").unwrap();
        assert_eq!(users.len(), 2);
        assert_eq!(users["bob"].describe(), st.user("bob").unwrap().describe());
        let err = users_from_file(b"user a on\nnope\nuser b +nocmd\n", "f.acl").unwrap_err();
        assert_eq!(
            err,
            "f.acl:2 should start with user keyword followed by the username. f.acl:3: Error in applying operation '+nocmd': Unknown command or category name in ACL. WARNING: ACL errors detected, no change to the previously active ACL rules was performed"
        );
        let users = users_from_file(b"user a on\n", "f.acl").unwrap();
        assert!(users.contains_key("default"));
    }

    // Config `user` lines reset the default user when they name it and refuse duplicates.
    #[test]
    fn config_users() {
        let st =
            users_from_config(&[words("default on >pw ~* +@all"), words("x on nopass")]).unwrap();
        let d = st.default_user();
        assert!(d.password_ok(b"pw") && !d.nopass);
        assert_eq!(
            String::from_utf8(d.describe()).unwrap(),
            format!(
                "on sanitize-payload #{} ~* resetchannels +@all",
                hash_password(b"pw")
            )
        );
        assert!(users_from_config(&[words("x on"), words("x off")]).is_err());
        assert!(users_from_config(&[words("x bogus")]).is_err());
    }
}
