//! RESP2/RESP3 request parsing and reply encoding.
//!
//! Sans-IO: the parser takes the bytes a connection has received so far and
//! either returns one complete command (as byte ranges into that buffer, so
//! arguments are never copied), says "need more bytes" (`Ok(None)`, not an
//! error), or returns a protocol error whose text is what Redis 7 sends
//! before it closes the connection.
//!
//! Both request forms are accepted: multibulk (`*N\r\n$len\r\n...`) as sent
//! by client libraries, and inline (`GET k\r\n`) as sent by telnet and by
//! `redis-cli` for some commands.
//!
//! The encoder appends replies to a caller-owned `Vec<u8>`; the caller picks
//! RESP2 or RESP3 per connection (`HELLO 3`).
pub mod encode;
pub mod parse;

pub use encode::{Proto, ReplyBuf};
pub use parse::{
    parse_command, ParseError, ParsedCommand, ARGS_MAX, BULK_MAX_BYTES, INLINE_MAX_BYTES,
};
