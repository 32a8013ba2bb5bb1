//! Sans-IO TCP/IP stack for lavik's appliance mode (issue 5).
#![forbid(unsafe_code)]

pub mod time;
pub mod wire;
