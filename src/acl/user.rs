//! A user, its selectors, the rules that change them and the text that
//! describes them (`ACL LIST`, `ACL GETUSER`, the ACL file), as Redis 7.2.
//!
//! A selector keeps the command bitmap the checks read and, beside it, the
//! command rules in the order they were given (Redis 7.2's `command_rules`):
//! re-applying a rule for the same command or category moves it to the end,
//! `+@all`/`-@all` start over. The description is `+@all` or `-@all` (from a
//! reserved bit only `+@all` sets) followed by those rules, which replays to
//! the same bitmap.

use super::catalog::{catalog, category_bit, COMMAND_BITS, KEY_READ, KEY_WRITE};
use crate::commands::glob_match;
use std::collections::BTreeMap;

const WORDS: usize = COMMAND_BITS / 64;
const FUTURE_BIT: usize = COMMAND_BITS - 1;
const _: () = assert!(COMMAND_BITS.is_multiple_of(64));

/// Why a rule was refused; `text` is Redis's wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleError {
    Syntax,
    UnknownCommand,
    KeyAfterAll,
    ChannelAfterAll,
    NoSuchPassword,
    BadHash,
    SubcommandFirstArg,
}

impl RuleError {
    pub fn text(self) -> &'static str {
        match self {
            RuleError::Syntax => "Syntax error",
            RuleError::UnknownCommand => "Unknown command or category name in ACL",
            RuleError::KeyAfterAll => "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns",
            RuleError::ChannelAfterAll => "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels",
            RuleError::NoSuchPassword => "The password you are trying to remove from the user does not exist",
            RuleError::BadHash => "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters",
            RuleError::SubcommandFirstArg => "Allowing first-arg of a subcommand is not supported",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPattern {
    /// `KEY_READ | KEY_WRITE` for `~`, one of them for `%R~` / `%W~`.
    pub flags: u8,
    pub pattern: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct Selector {
    pub root: bool,
    pub allkeys: bool,
    pub allchannels: bool,
    pub allcommands: bool,
    allowed: [u64; WORDS],
    /// `+select|0`: first arguments allowed for a command whose bit is clear.
    firstargs: BTreeMap<usize, Vec<Vec<u8>>>,
    pub patterns: Vec<KeyPattern>,
    pub channels: Vec<Vec<u8>>,
    command_rules: String,
}

/// What a check refused: the command, or the argument at this index (a key or channel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    Command,
    Key(usize),
    Channel(usize),
}

impl Denied {
    /// Redis's order for picking one error among selectors (ACL_DENIED_*).
    fn rank(self) -> (u8, usize) {
        match self {
            Denied::Command => (1, 0),
            Denied::Key(i) => (2, i),
            Denied::Channel(i) => (4, i),
        }
    }
}

/// One key argument of a call: its index in the arguments and the access it needs.
#[derive(Clone, Copy, Debug)]
pub struct KeyRef {
    pub pos: usize,
    pub access: u8,
}

fn has_spaces(s: &[u8]) -> bool {
    s.iter()
        .any(|&c| c.is_ascii_whitespace() || c == 0 || c == 0x0b)
}

impl Selector {
    fn new(root: bool) -> Selector {
        Selector {
            root,
            allkeys: false,
            allchannels: false,
            allcommands: false,
            allowed: [0; WORDS],
            firstargs: BTreeMap::new(),
            patterns: Vec::new(),
            channels: Vec::new(),
            command_rules: String::new(),
        }
    }

    fn bit(&self, id: usize) -> bool {
        self.allowed[id / 64] & (1 << (id % 64)) != 0
    }

    fn set_bit(&mut self, id: usize, on: bool) {
        if on {
            self.allowed[id / 64] |= 1 << (id % 64);
        } else {
            self.allowed[id / 64] &= !(1 << (id % 64));
            self.allcommands = false;
        }
    }

    fn change_perm(&mut self, id: usize, allow: bool) {
        self.set_bit(id, allow);
        self.firstargs.remove(&id);
        for &sub in &catalog().commands[id].subcommands {
            self.set_bit(sub, allow);
        }
    }

    /// Drops earlier rules for the same command (or its subcommands) or category, then appends.
    fn update_rules(&mut self, rule: &str, allow: bool) {
        let rule = rule.to_ascii_lowercase();
        let kept: Vec<&str> = self
            .command_rules
            .split(' ')
            .filter(|r| !r.is_empty())
            .filter(|r| {
                let body = &r[1..];
                !(body == rule
                    || (body.len() > rule.len()
                        && body.starts_with(rule.as_str())
                        && body.as_bytes()[rule.len()] == b'|'))
            })
            .collect();
        let mut s = kept.join(" ");
        if !s.is_empty() {
            s.push(' ');
        }
        s.push(if allow { '+' } else { '-' });
        s.push_str(&rule);
        self.command_rules = s;
    }

    fn set_all_commands(&mut self, allow: bool) {
        self.allowed = if allow { [u64::MAX; WORDS] } else { [0; WORDS] };
        self.allcommands = allow;
        self.command_rules.clear();
        self.firstargs.clear();
    }

    /// Applies one selector rule (`~pat`, `+cmd`, `-@cat`, `allkeys`, ...).
    pub fn apply(&mut self, op: &[u8]) -> Result<(), RuleError> {
        let is = |s: &str| op.eq_ignore_ascii_case(s.as_bytes());
        if is("allkeys") || op == b"~*" {
            self.allkeys = true;
            self.patterns.clear();
        } else if is("resetkeys") {
            self.allkeys = false;
            self.patterns.clear();
        } else if is("allchannels") || op == b"&*" {
            self.allchannels = true;
            self.channels.clear();
        } else if is("resetchannels") {
            self.allchannels = false;
            self.channels.clear();
        } else if is("allcommands") || is("+@all") {
            self.set_all_commands(true);
        } else if is("nocommands") || is("-@all") {
            self.set_all_commands(false);
        } else if op.first() == Some(&b'~') || op.first() == Some(&b'%') {
            self.add_key_pattern(op)?;
        } else if op.first() == Some(&b'&') {
            if self.allchannels {
                return Err(RuleError::ChannelAfterAll);
            }
            if has_spaces(&op[1..]) {
                return Err(RuleError::Syntax);
            }
            if !self.channels.iter().any(|c| c[..] == op[1..]) {
                self.channels.push(op[1..].to_vec());
            }
            self.allchannels = false;
        } else if (op.first() == Some(&b'+') || op.first() == Some(&b'-'))
            && op.get(1) == Some(&b'@')
        {
            let bit = category_bit(&op[2..]).ok_or(RuleError::UnknownCommand)?;
            let allow = op[0] == b'+';
            self.update_rules(&String::from_utf8_lossy(&op[1..]), allow);
            for (id, c) in catalog().commands.iter().enumerate() {
                if c.categories & bit != 0 {
                    self.change_perm(id, allow);
                }
            }
        } else if op.first() == Some(&b'+') {
            self.allow_command(&op[1..])?;
        } else if op.first() == Some(&b'-') {
            let cat = catalog();
            let id = cat.lookup(&op[1..]).ok_or(RuleError::UnknownCommand)?;
            self.change_perm(id, false);
            let name = cat.commands[id].fullname.clone();
            self.update_rules(&name, false);
        } else {
            return Err(RuleError::Syntax);
        }
        Ok(())
    }

    fn add_key_pattern(&mut self, op: &[u8]) -> Result<(), RuleError> {
        if self.allkeys {
            return Err(RuleError::KeyAfterAll);
        }
        let (mut flags, mut offset) = (0u8, 1usize);
        if op[0] == b'%' {
            while offset < op.len() {
                let c = op[offset];
                if c.eq_ignore_ascii_case(&b'r') && flags & KEY_READ == 0 {
                    flags |= KEY_READ;
                } else if c.eq_ignore_ascii_case(&b'w') && flags & KEY_WRITE == 0 {
                    flags |= KEY_WRITE;
                } else if c == b'~' && flags != 0 {
                    offset += 1;
                    break;
                } else {
                    return Err(RuleError::Syntax);
                }
                offset += 1;
            }
            if flags == 0 {
                return Err(RuleError::Syntax); // a bare `%`
            }
        } else {
            flags = KEY_READ | KEY_WRITE;
        }
        let pat = &op[offset.min(op.len())..];
        if has_spaces(pat) {
            return Err(RuleError::Syntax);
        }
        match self.patterns.iter_mut().find(|p| p.pattern == pat) {
            Some(p) => p.flags |= flags,
            None => self.patterns.push(KeyPattern {
                flags,
                pattern: pat.to_vec(),
            }),
        }
        self.allkeys = false;
        Ok(())
    }

    fn allow_command(&mut self, name: &[u8]) -> Result<(), RuleError> {
        let cat = catalog();
        let Some(bar) = name.iter().rposition(|&c| c == b'|') else {
            let id = cat.lookup(name).ok_or(RuleError::UnknownCommand)?;
            self.change_perm(id, true);
            let full = cat.commands[id].fullname.clone();
            self.update_rules(&full, true);
            return Ok(());
        };
        let (base, sub) = (&name[..bar], &name[bar + 1..]);
        let id = cat.lookup(base).ok_or(RuleError::UnknownCommand)?;
        if cat.commands[id].parent.is_some() {
            return Err(RuleError::SubcommandFirstArg);
        }
        if sub.is_empty() {
            return Err(RuleError::Syntax);
        }
        if cat.commands[id].subcommands.is_empty() {
            let args = self.firstargs.entry(id).or_default();
            if !args.iter().any(|a| a.eq_ignore_ascii_case(sub)) {
                args.push(sub.to_vec());
            }
        } else {
            let sub_id = cat.lookup(name).ok_or(RuleError::UnknownCommand)?;
            self.change_perm(sub_id, true);
        }
        self.update_rules(&String::from_utf8_lossy(name), true);
        Ok(())
    }

    fn key_allowed(&self, key: &[u8], access: u8) -> bool {
        self.allkeys
            || self
                .patterns
                .iter()
                .any(|p| p.flags & access == access && glob_match(&p.pattern, key))
    }

    /// A channel name (or, for PSUBSCRIBE, a pattern compared literally).
    fn channel_allowed(&self, channel: &[u8], is_pattern: bool) -> bool {
        self.allchannels
            || self.channels.iter().any(|p| {
                if is_pattern {
                    p[..] == *channel
                } else {
                    glob_match(p, channel)
                }
            })
    }

    fn check(
        &self,
        id: usize,
        args: &[&[u8]],
        keys: &[KeyRef],
        channels: &[(usize, bool)],
    ) -> Result<(), Denied> {
        let cmd = &catalog().commands[id];
        if !self.allcommands && !cmd.no_auth && !self.bit(id) {
            let idx = if cmd.parent.is_some() { 2 } else { 1 };
            let ok = args.len() >= 2
                && args.get(idx).is_some_and(|a| {
                    self.firstargs
                        .get(&id)
                        .is_some_and(|v| v.iter().any(|f| f.eq_ignore_ascii_case(a)))
                });
            if !ok {
                return Err(Denied::Command);
            }
        }
        if !self.allkeys {
            for k in keys {
                if !self.key_allowed(args[k.pos], k.access) {
                    return Err(Denied::Key(k.pos));
                }
            }
        }
        if !self.allchannels {
            for &(pos, is_pattern) in channels {
                if !self.channel_allowed(args[pos], is_pattern) {
                    return Err(Denied::Channel(pos));
                }
            }
        }
        Ok(())
    }

    fn describe_commands(&self) -> String {
        let mut s = String::from(if self.bit(FUTURE_BIT) {
            "+@all"
        } else {
            "-@all"
        });
        if !self.command_rules.is_empty() {
            s.push(' ');
            s.push_str(&self.command_rules);
        }
        s
    }

    fn describe_keys_into(&self, out: &mut Vec<u8>, sep_after: bool) {
        for (i, p) in self.patterns.iter().enumerate() {
            if i > 0 && !sep_after {
                out.push(b' ');
            }
            out.extend_from_slice(match p.flags {
                f if f == KEY_READ | KEY_WRITE => b"~".as_slice(),
                KEY_READ => b"%R~",
                _ => b"%W~",
            });
            out.extend_from_slice(&p.pattern);
            if sep_after {
                out.push(b' ');
            }
        }
    }

    /// The selector in rule form: keys, channels, command rules.
    pub fn describe(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.allkeys {
            out.extend_from_slice(b"~* ");
        } else {
            self.describe_keys_into(&mut out, true);
        }
        if self.allchannels {
            out.extend_from_slice(b"&* ");
        } else {
            out.extend_from_slice(b"resetchannels ");
            for c in &self.channels {
                out.push(b'&');
                out.extend_from_slice(c);
                out.push(b' ');
            }
        }
        out.extend_from_slice(self.describe_commands().as_bytes());
        out
    }

    /// `ACL GETUSER`'s commands, keys and channels fields.
    pub fn getuser_fields(&self) -> [(&'static str, Vec<u8>); 3] {
        let keys = if self.allkeys {
            b"~*".to_vec()
        } else {
            let mut v = Vec::new();
            self.describe_keys_into(&mut v, false);
            v
        };
        let channels = if self.allchannels {
            b"&*".to_vec()
        } else {
            let mut v = Vec::new();
            for (i, c) in self.channels.iter().enumerate() {
                if i > 0 {
                    v.push(b' ');
                }
                v.push(b'&');
                v.extend_from_slice(c);
            }
            v
        };
        [
            ("commands", self.describe_commands().into_bytes()),
            ("keys", keys),
            ("channels", channels),
        ]
    }
}

/// A user as Redis keeps it: flags, password hashes, root selector first.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub enabled: bool,
    /// `on`/`off` shows only once one was given; a new user is `off`.
    pub nopass: bool,
    /// `None` until `sanitize-payload` or `skip-sanitize-payload` (or `reset`) is applied.
    pub sanitize_payload: Option<bool>,
    /// Lowercase hex SHA-256 of each password, in the order added.
    pub passwords: Vec<String>,
    pub selectors: Vec<Selector>,
}

pub fn hash_password(p: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(p);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn valid_hash(h: &[u8]) -> bool {
    h.len() == 64 && h.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Compares without an early exit, so timing does not tell how much matched.
fn same_hash(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl User {
    /// A new user: off, no passwords, no permissions (Redis's `ACLCreateUser`).
    pub fn new(name: &str) -> User {
        User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            sanitize_payload: None,
            passwords: Vec::new(),
            selectors: vec![Selector::new(true)],
        }
    }

    /// The default user of a fresh server: on, nopass, all keys, channels and commands.
    pub fn new_default() -> User {
        let mut u = User::new("default");
        for op in ["+@all", "~*", "&*", "on", "nopass"] {
            u.apply(op.as_bytes()).expect("default rules are valid");
        }
        u
    }

    pub fn root(&self) -> &Selector {
        &self.selectors[0]
    }

    /// Applies one user rule (or a selector rule to the root selector).
    pub fn apply(&mut self, op: &[u8]) -> Result<(), RuleError> {
        if op.is_empty() {
            return Ok(());
        }
        let is = |s: &str| op.eq_ignore_ascii_case(s.as_bytes());
        if is("on") {
            self.enabled = true;
        } else if is("off") {
            self.enabled = false;
        } else if is("skip-sanitize-payload") {
            self.sanitize_payload = Some(false);
        } else if is("sanitize-payload") {
            self.sanitize_payload = Some(true);
        } else if is("nopass") {
            self.nopass = true;
            self.passwords.clear();
        } else if is("resetpass") {
            self.nopass = false;
            self.passwords.clear();
        } else if op[0] == b'>' || op[0] == b'#' {
            let hash = if op[0] == b'>' {
                hash_password(&op[1..])
            } else if valid_hash(&op[1..]) {
                String::from_utf8_lossy(&op[1..]).into_owned()
            } else {
                return Err(RuleError::BadHash);
            };
            if !self.passwords.contains(&hash) {
                self.passwords.push(hash);
            }
            self.nopass = false;
        } else if op[0] == b'<' || op[0] == b'!' {
            let hash = if op[0] == b'<' {
                hash_password(&op[1..])
            } else if valid_hash(&op[1..]) {
                String::from_utf8_lossy(&op[1..]).into_owned()
            } else {
                return Err(RuleError::BadHash);
            };
            let at = self
                .passwords
                .iter()
                .position(|p| *p == hash)
                .ok_or(RuleError::NoSuchPassword)?;
            self.passwords.remove(at);
        } else if op[0] == b'(' && op[op.len() - 1] == b')' {
            let mut s = Selector::new(false);
            let inner = &op[1..op.len() - 1];
            for part in crate::resp::parse::split_args(inner).ok_or(RuleError::Syntax)? {
                s.apply(&part)?;
            }
            self.selectors.push(s);
        } else if is("clearselectors") {
            self.selectors.truncate(1);
        } else if is("reset") {
            for r in [
                "resetpass",
                "resetkeys",
                "resetchannels",
                "off",
                "sanitize-payload",
                "clearselectors",
                "-@all",
            ] {
                self.apply(r.as_bytes())?;
            }
        } else {
            self.selectors[0].apply(op)?;
        }
        Ok(())
    }

    /// Applies `ops` all or nothing, as `ACL SETUSER`: the error names the failing rule.
    pub fn apply_all(&mut self, ops: &[Vec<u8>]) -> Result<(), String> {
        let merged = merge_selector_args(ops).map_err(|start| {
            format!(
                "ERR Unmatched parenthesis in acl selector starting at '{}'.",
                String::from_utf8_lossy(start)
            )
        })?;
        let mut staged = self.clone();
        for op in &merged {
            staged.apply(op).map_err(|e| {
                format!(
                    "ERR Error in ACL SETUSER modifier '{}': {}",
                    String::from_utf8_lossy(op),
                    e.text()
                )
            })?;
        }
        *self = staged;
        Ok(())
    }

    /// The password check of AUTH (a disabled user never passes).
    pub fn password_ok(&self, pass: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let h = hash_password(pass);
        self.passwords.iter().any(|p| same_hash(p, &h))
    }

    /// Whether the user may run command `id` with `args`: allowed if any selector allows it;
    /// otherwise the error Redis would pick (the command, else the last key or channel).
    pub fn check(
        &self,
        id: usize,
        args: &[&[u8]],
        keys: &[KeyRef],
        channels: &[(usize, bool)],
    ) -> Result<(), Denied> {
        let mut worst = Denied::Command;
        for s in &self.selectors {
            match s.check(id, args, keys, channels) {
                Ok(()) => return Ok(()),
                Err(d) if d.rank() > worst.rank() => worst = d,
                Err(_) => {}
            }
        }
        Err(worst)
    }

    /// Whether some selector lets this user use `channel` (a PSUBSCRIBE pattern, compared
    /// literally, when `is_pattern`).
    pub fn channel_permitted(&self, channel: &[u8], is_pattern: bool) -> bool {
        self.selectors
            .iter()
            .any(|s| s.channel_allowed(channel, is_pattern))
    }

    /// Redis's `ACLUserCheckCmdWithUnrestrictedKeyAccess` (SORT's BY/GET): some selector
    /// allows this call and reads every key (`~*`, or a `*` pattern with read access).
    pub fn full_key_read(&self, id: usize, args: &[&[u8]], keys: &[KeyRef]) -> bool {
        self.selectors.iter().any(|s| {
            s.check(id, args, keys, &[]).is_ok()
                && (s.allkeys
                    || s.patterns
                        .iter()
                        .any(|p| p.pattern == b"*" && p.flags & KEY_READ != 0))
        })
    }

    /// The fast path: everything allowed, nothing to look at per call.
    pub fn unrestricted(&self) -> bool {
        let r = self.root();
        r.allcommands && r.allkeys && r.allchannels
    }

    /// The rules that recreate this user (`ACL LIST` after `user NAME `).
    pub fn describe(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut flag = |name: &str| {
            out.extend_from_slice(name.as_bytes());
            out.push(b' ');
        };
        flag(if self.enabled { "on" } else { "off" });
        if self.nopass {
            flag("nopass");
        }
        match self.sanitize_payload {
            Some(false) => flag("skip-sanitize-payload"),
            Some(true) => flag("sanitize-payload"),
            None => {}
        }
        for p in &self.passwords {
            out.push(b'#');
            out.extend_from_slice(p.as_bytes());
            out.push(b' ');
        }
        for s in &self.selectors {
            if s.root {
                out.extend_from_slice(&s.describe());
            } else {
                out.extend_from_slice(b" (");
                out.extend_from_slice(&s.describe());
                out.push(b')');
            }
        }
        out
    }

    /// `ACL GETUSER`'s flags field.
    pub fn flag_names(&self) -> Vec<&'static str> {
        let mut v = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            v.push("nopass");
        }
        match self.sanitize_payload {
            Some(false) => v.push("skip-sanitize-payload"),
            Some(true) => v.push("sanitize-payload"),
            None => {}
        }
        v
    }
}

/// Joins a selector spread over several arguments (`(+get` `~k)`) into one,
/// as Redis's `ACLMergeSelectorArguments`; `Err` holds where an unclosed one starts.
pub fn merge_selector_args(ops: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, &[u8]> {
    let mut out = Vec::new();
    let mut open: Option<(usize, Vec<u8>)> = None;
    for (i, op) in ops.iter().enumerate() {
        if let Some((_, sel)) = open.as_mut() {
            sel.push(b' ');
            sel.extend_from_slice(op);
            if op.last() == Some(&b')') {
                out.push(open.take().expect("open selector").1);
            }
            continue;
        }
        if op.first() == Some(&b'(') && op.last() != Some(&b')') {
            open = Some((i, op.clone()));
            continue;
        }
        out.push(op.clone());
    }
    match open {
        Some((i, _)) => Err(&ops[i]),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(rules: &[&str]) -> User {
        let mut u = User::new("u");
        let ops: Vec<Vec<u8>> = rules.iter().map(|r| r.as_bytes().to_vec()).collect();
        u.apply_all(&ops).unwrap();
        u
    }

    fn text(u: &User) -> String {
        String::from_utf8(u.describe()).unwrap()
    }

    fn id(name: &str) -> usize {
        catalog().lookup(name.as_bytes()).unwrap()
    }

    // A new user is off with nothing allowed; the default user has everything.
    #[test]
    fn fresh_users() {
        assert_eq!(text(&User::new("x")), "off resetchannels -@all");
        assert_eq!(text(&User::new_default()), "on nopass ~* &* +@all");
    }

    // Rules are described in the order given (7.2), later rules for a command replacing older ones.
    #[test]
    fn command_rules_keep_order() {
        let u = user(&[
            "+get",
            "-@all",
            "+@string",
            "-set",
            "+config|get",
            "+select|0",
        ]);
        assert_eq!(
            text(&u),
            "off resetchannels -@all +@string -set +config|get +select|0"
        );
        let u = user(&[
            "+@all",
            "-@dangerous",
            "+config|get",
            "+config",
            "-config|set",
        ]);
        assert_eq!(
            text(&u),
            "off resetchannels +@all -@dangerous +config -config|set"
        );
        let u = user(&["+get", "+set", "+GET"]);
        assert_eq!(text(&u), "off resetchannels -@all +set +get");
    }

    // Key patterns keep their read/write qualifiers and merge repeated patterns.
    #[test]
    fn key_patterns() {
        let u = user(&["~a*", "%R~b*", "%W~c*", "%W~b*", "%RW"]);
        assert_eq!(text(&u), "off ~a* ~b* %W~c* ~ resetchannels -@all");
        let mut u = User::new("x");
        assert_eq!(u.apply(b"%X~a"), Err(RuleError::Syntax));
        assert_eq!(u.apply(b"%"), Err(RuleError::Syntax));
        assert_eq!(u.apply(b"%~x"), Err(RuleError::Syntax));
        assert_eq!(u.apply(b"%RR~x"), Err(RuleError::Syntax));
        u.apply(b"allkeys").unwrap();
        assert_eq!(u.apply(b"~a"), Err(RuleError::KeyAfterAll));
        assert_eq!(u.apply(b"~a b"), Err(RuleError::KeyAfterAll));
        u.apply(b"resetkeys").unwrap();
        assert_eq!(u.apply(b"~a b"), Err(RuleError::Syntax));
    }

    // Errors of malformed rules are Redis's, and a failing SETUSER changes nothing.
    #[test]
    fn rule_errors() {
        let mut u = User::new("x");
        assert_eq!(u.apply(b"bogus"), Err(RuleError::Syntax));
        assert_eq!(u.apply(b"+nocmd"), Err(RuleError::UnknownCommand));
        assert_eq!(u.apply(b"+@nocat"), Err(RuleError::UnknownCommand));
        assert_eq!(
            u.apply(b"+config|get|x"),
            Err(RuleError::SubcommandFirstArg)
        );
        assert_eq!(u.apply(b"+config|"), Err(RuleError::Syntax));
        assert_eq!(u.apply(b"+config|nope"), Err(RuleError::UnknownCommand));
        assert_eq!(u.apply(b"#abc"), Err(RuleError::BadHash));
        assert_eq!(u.apply(b"<nope"), Err(RuleError::NoSuchPassword));
        let ops = vec![b"on".to_vec(), b"+get".to_vec(), b"bad".to_vec()];
        assert_eq!(
            u.apply_all(&ops),
            Err("ERR Error in ACL SETUSER modifier 'bad': Syntax error".into())
        );
        assert_eq!(text(&u), "off resetchannels -@all");
        let ops = vec![b"(+get".to_vec(), b"~x)".to_vec()];
        assert_eq!(u.apply_all(&ops), Ok(()));
        let ops = vec![b"(+get".to_vec()];
        assert_eq!(
            u.apply_all(&ops),
            Err("ERR Unmatched parenthesis in acl selector starting at '(+get'.".into())
        );
    }

    // Passwords are stored as SHA-256 hex, checked, removed; nopass and off behave as Redis.
    #[test]
    fn passwords() {
        let mut u = user(&["on", ">secret"]);
        assert_eq!(
            u.passwords,
            ["2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"]
        );
        assert!(u.password_ok(b"secret"));
        assert!(!u.password_ok(b"other"));
        u.apply(b"off").unwrap();
        assert!(!u.password_ok(b"secret"));
        u.apply(b"on").unwrap();
        u.apply(b"<secret").unwrap();
        assert!(!u.password_ok(b"secret"));
        u.apply(b"nopass").unwrap();
        assert!(u.password_ok(b"anything"));
        u.apply(b"resetpass").unwrap();
        assert!(!u.password_ok(b"anything"));
    }

    // Command, subcommand, category, first-arg and key checks, over several selectors.
    #[test]
    fn checks() {
        let u = user(&[
            "+@read",
            "-mget",
            "+config|get",
            "+select|0",
            "%R~r*",
            "%W~w*",
            "(+set ~s*)",
        ]);
        let k = |pos, access| KeyRef { pos, access };
        let get: [&[u8]; 2] = [b"get", b"r1"];
        assert_eq!(u.check(id("get"), &get, &[k(1, KEY_READ)], &[]), Ok(()));
        let get_w: [&[u8]; 2] = [b"get", b"w1"];
        assert_eq!(
            u.check(id("get"), &get_w, &[k(1, KEY_READ)], &[]),
            Err(Denied::Key(1))
        );
        let mget: [&[u8]; 2] = [b"mget", b"r1"];
        assert_eq!(
            u.check(id("mget"), &mget, &[k(1, KEY_READ)], &[]),
            Err(Denied::Command)
        );
        let cfg: [&[u8]; 3] = [b"config", b"get", b"x"];
        assert_eq!(u.check(id("config|get"), &cfg, &[], &[]), Ok(()));
        let cfg: [&[u8]; 4] = [b"config", b"set", b"x", b"y"];
        assert_eq!(
            u.check(id("config|set"), &cfg, &[], &[]),
            Err(Denied::Command)
        );
        let sel0: [&[u8]; 2] = [b"select", b"0"];
        let sel1: [&[u8]; 2] = [b"select", b"1"];
        assert_eq!(u.check(id("select"), &sel0, &[], &[]), Ok(()));
        assert_eq!(u.check(id("select"), &sel1, &[], &[]), Err(Denied::Command));
        let set_s: [&[u8]; 3] = [b"set", b"s1", b"v"];
        assert_eq!(u.check(id("set"), &set_s, &[k(1, KEY_WRITE)], &[]), Ok(()));
        let set_w: [&[u8]; 3] = [b"set", b"w1", b"v"];
        // The root selector lacks SET and the other lacks the key: the key is reported.
        assert_eq!(
            u.check(id("set"), &set_w, &[k(1, KEY_WRITE)], &[]),
            Err(Denied::Key(1))
        );
        let auth: [&[u8]; 2] = [b"auth", b"p"];
        assert_eq!(u.check(id("auth"), &auth, &[], &[]), Ok(()));
    }

    // Channel patterns match channel names by glob and PSUBSCRIBE patterns literally.
    #[test]
    fn channels() {
        let u = user(&["+@all", "&news.*"]);
        assert_eq!(text(&u), "off resetchannels &news.* +@all");
        let s = u.root();
        assert!(s.channel_allowed(b"news.today", false));
        assert!(!s.channel_allowed(b"sport", false));
        assert!(s.channel_allowed(b"news.*", true));
        assert!(!s.channel_allowed(b"news.t*", true));
        let mut u = u;
        u.apply(b"allchannels").unwrap();
        assert_eq!(u.apply(b"&x"), Err(RuleError::ChannelAfterAll));
    }

    // Selectors are described in parentheses after the root; reset returns to a new user's state.
    #[test]
    fn selectors_and_reset() {
        let mut u = user(&["on", "nopass", "~a", "(+get ~z*)", "(", "+set", "~q", ")"]);
        assert_eq!(
            text(&u),
            "on nopass ~a resetchannels -@all (~z* resetchannels -@all +get) (~q resetchannels -@all +set)"
        );
        u.apply(b"clearselectors").unwrap();
        assert_eq!(text(&u), "on nopass ~a resetchannels -@all");
        u.apply(b"reset").unwrap();
        assert_eq!(text(&u), "off sanitize-payload resetchannels -@all");
    }
}
