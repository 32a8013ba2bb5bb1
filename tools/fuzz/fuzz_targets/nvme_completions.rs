//! Fuzzes the NVMe queue logic's completion handling: arbitrary bytes become
//! a schedule of submissions, controller-written completion entries, polls,
//! expiries and resets, checked against a model (`lavik::nvme::fuzz`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    lavik::nvme::fuzz::completion_handling(data);
});
