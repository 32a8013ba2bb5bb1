//! lavik: a Redis-compatible key-value server whose key index lives in RAM and
//! whose values live on SSD.
//!
//! Module map (dependency direction `commands → storage → device`, with
//! `runtime` under all of them):
//! - `config`: command line and Redis-style config file.
//! - `resp`: RESP2/RESP3 request parser and reply encoder (sans-IO).
//! - `runtime`: io_uring ring code, provided buffers, wake-ups, pinning.
//! - `storage`: the engine: compact index, log-structured values, recovery.
//! - `device`: block devices (files and raw devices, in-memory for tests).
//! - `nvme`: the userspace NVMe driver over VFIO (appliance storage).
//! - `server`: workers, connections, routing, command dispatch.
//! - `commands`: the command table and one file per command family.
pub mod acl;
pub mod commands;
pub mod config;
pub mod device;
pub mod nvme;
pub mod rdb;
pub mod resp;
pub mod runtime;
pub mod scripting;
pub mod server;
pub mod storage;
pub mod tools;
