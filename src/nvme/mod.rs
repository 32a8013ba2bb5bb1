//! The userspace NVMe driver (appliance storage), placeholder essay replaced below.
pub mod queue;
pub mod spec;
