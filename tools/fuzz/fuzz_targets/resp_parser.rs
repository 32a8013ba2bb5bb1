//! Fuzzes the RESP request parser: any bytes, fed whole and in two pieces,
//! must never panic, and a parse must be stable under splitting (the bytes
//! a complete command consumed parse to the same arguments when they arrive
//! in two reads).
#![no_main]
use lavik::resp::{parse_command, ParsedCommand};
use libfuzzer_sys::fuzz_target;

fn parse_all(buf: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut pc = ParsedCommand::default();
    let mut pos = 0;
    let mut cmds = Vec::new();
    while pos < buf.len() {
        match parse_command(&buf[pos..], &mut pc, 1 << 20) {
            Ok(Some(())) => {
                let mut args = Vec::new();
                pc.args(&buf[pos..], &mut args);
                cmds.push(args.iter().map(|a| a.to_vec()).collect());
                assert!(pc.consumed > 0);
                pos += pc.consumed;
            }
            Ok(None) | Err(_) => break,
        }
    }
    cmds
}

fuzz_target!(|data: &[u8]| {
    let whole = parse_all(data);
    // Any strict prefix parses to a prefix of the commands.
    if !data.is_empty() {
        let cut = data[0] as usize % data.len();
        let part = parse_all(&data[..cut]);
        assert!(part.len() <= whole.len());
        assert_eq!(&whole[..part.len()], &part[..]);
    }
});
