//! The ACL log (`ACL LOG`): denied commands, keys, channels and failed
//! AUTHs, newest first. A denial like one of the last ten entries (same
//! reason, context, object and user, within a minute) updates that entry
//! instead of adding one, as Redis does.

use std::collections::VecDeque;

/// Redis's `acllog-max-len` default.
pub const ACL_LOG_MAX_ENTRIES: usize = 128;
/// Entries this close in time (ms) may be grouped.
const GROUPING_MAX_DELTA_MS: u64 = 60_000;
/// Only this many recent entries are searched for a group.
const GROUPING_SCAN_ENTRIES: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Command,
    Key,
    Channel,
    Auth,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Command => "command",
            Reason::Key => "key",
            Reason::Channel => "channel",
            Reason::Auth => "auth",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub count: u64,
    pub reason: Reason,
    /// `toplevel`, or `lua` for a command a script called.
    pub context: &'static str,
    pub object: Vec<u8>,
    pub username: Vec<u8>,
    pub updated_ms: u64,
    pub client_info: String,
    pub entry_id: u64,
    pub created_ms: u64,
}

#[derive(Debug, Default)]
pub struct AclLog {
    pub entries: VecDeque<Entry>,
    next_id: u64,
    /// Denials per reason since start or CONFIG RESETSTAT (INFO's `acl_access_denied_*`),
    /// indexed by `Reason as usize`.
    pub denied: [u64; 4],
}

impl AclLog {
    pub fn add(
        &mut self,
        reason: Reason,
        object: &[u8],
        username: &[u8],
        client_info: String,
        now_ms: u64,
    ) {
        self.add_in("toplevel", reason, object, username, client_info, now_ms)
    }

    /// As `add`, for a denial in `context` (`toplevel` or `lua`).
    pub fn add_in(
        &mut self,
        context: &'static str,
        reason: Reason,
        object: &[u8],
        username: &[u8],
        client_info: String,
        now_ms: u64,
    ) {
        self.denied[reason as usize] += 1;
        let found = self
            .entries
            .iter()
            .take(GROUPING_SCAN_ENTRIES)
            .position(|e| {
                e.reason == reason
                    && e.context == context
                    && e.updated_ms.abs_diff(now_ms) <= GROUPING_MAX_DELTA_MS
                    && e.object == object
                    && e.username == username
            });
        if let Some(i) = found {
            let mut e = self.entries.remove(i).expect("found entry");
            e.count += 1;
            e.client_info = client_info;
            e.updated_ms = now_ms;
            self.entries.push_front(e);
            return;
        }
        self.entries.push_front(Entry {
            count: 1,
            reason,
            context,
            object: object.to_vec(),
            username: username.to_vec(),
            updated_ms: now_ms,
            client_info,
            entry_id: self.next_id,
            created_ms: now_ms,
        });
        self.next_id += 1;
        self.entries.truncate(ACL_LOG_MAX_ENTRIES);
    }

    /// INFO's lines: `acl_access_denied_auth:N` ... in Redis's order.
    pub fn info_lines(&self) -> String {
        let d = |r: Reason| self.denied[r as usize];
        format!(
            "acl_access_denied_auth:{}\r\nacl_access_denied_cmd:{}\r\nacl_access_denied_key:{}\r\nacl_access_denied_channel:{}\r\n",
            d(Reason::Auth),
            d(Reason::Command),
            d(Reason::Key),
            d(Reason::Channel)
        )
    }

    /// `ACL LOG RESET`: the entry ids keep counting, as in Redis.
    pub fn reset(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Repeats within a minute group into one entry moved to the front; others add entries.
    #[test]
    fn grouping() {
        let mut log = AclLog::default();
        log.add(Reason::Command, b"get", b"u", "a".into(), 1000);
        log.add(Reason::Key, b"k", b"u", "b".into(), 2000);
        log.add(Reason::Command, b"get", b"u", "c".into(), 3000);
        assert_eq!(log.entries.len(), 2);
        let e = &log.entries[0];
        assert_eq!(
            (e.count, e.entry_id, e.created_ms, e.updated_ms),
            (2, 0, 1000, 3000)
        );
        assert_eq!(e.client_info, "c");
        log.add(Reason::Command, b"get", b"u", "d".into(), 3000 + 60_001);
        assert_eq!(log.entries.len(), 3);
        assert_eq!(log.entries[0].entry_id, 2);
        log.reset();
        log.add(Reason::Auth, b"AUTH", b"x", "e".into(), 1);
        assert_eq!(log.entries[0].entry_id, 3);
        // Grouped or not, every denial counts.
        assert_eq!(
            log.info_lines(),
            "acl_access_denied_auth:1\r\nacl_access_denied_cmd:3\r\nacl_access_denied_key:1\r\nacl_access_denied_channel:0\r\n"
        );
    }

    // The log keeps at most its maximum number of entries, dropping the oldest.
    #[test]
    fn bounded() {
        let mut log = AclLog::default();
        for i in 0..(ACL_LOG_MAX_ENTRIES as u64 + 5) {
            log.add(Reason::Key, &i.to_be_bytes(), b"u", String::new(), i);
        }
        assert_eq!(log.entries.len(), ACL_LOG_MAX_ENTRIES);
        assert_eq!(log.entries.back().unwrap().entry_id, 5);
    }
}
