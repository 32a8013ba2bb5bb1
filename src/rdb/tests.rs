//! The DUMP payload codec against payloads taken from Debian's redis-server 7.0.15.

use super::*;
use proptest::prelude::*;

/// `SET s1 hello` (verbatim string).
const STR_RAW: &[u8] = b"\x00\x05hello\n\x00cr\xdfve4 \n";
/// `SET s2 12` (8-bit integer).
const STR_INT8: &[u8] = b"\x00\xc0\x0c\n\x00<*\xf8Q\\\x04\xbc\xd5";
/// `SET s3 300` (16-bit integer).
const STR_INT16: &[u8] = b"\x00\xc1,\x01\n\x00\x95Ba\xf2e\x82\\\x10";
/// `SET s4 100000` (32-bit integer).
const STR_INT32: &[u8] = b"\x00\xc2\xa0\x86\x01\x00\n\x00\xf1$\x03Po/\xa6t";
/// `SET neg -129` (16-bit integer, negative).
const STR_NEG: &[u8] = b"\x00\xc1\x7f\xff\n\x00\x17`\x82(T\x80\x84\x80";
/// `SET s6 12345678901` (an integer above 32 bits: verbatim).
const STR_WIDE_INT: &[u8] = b"\x00\x0b12345678901\n\x000NR\xd7'\x17e\x10";
/// `SET s5` 53 times 'a' (LZF).
const STR_LZF: &[u8] = b"\x00\xc3\t5\x01aa\xe0(\x00\x01aa\n\x00\xc6\xc6\x0c\xe1\x9ea@\x10";
/// `SET lz 0123456789` x4 (LZF with a 14-bit... a 6-bit lengths and a long reference).
const STR_LZF_DIGITS: &[u8] = b"\x00\xc3\x12(\n01234567890\xe0\x12\t\x0189\n\x00]\x9b\x94\xa2{[?J";
/// `SET big` "abcdefghij" x30 (LZF, 14-bit original length).
const STR_LZF_BIG: &[u8] =
    b"\x00\xc3\x15A,\nabcdefghija\xe0\xff\t\xe1\x0e\r\x01ij\n\x008\xca\x02Z\xda\xf5@\x90";
/// `HSET h1 a 1 b hello c -5000` (listpack hash).
const HASH_LP: &[u8] = b"\x10\x1d\x1d\x00\x00\x00\x06\x00\x81a\x02\x01\x01\x81b\x02\x85hello\x06\x81c\x02\xf1x\xec\x03\xff\n\x00\tS\x04\x00\xe2&\x17?";
/// `HSET h a 1` as listpack, with `hash-max-listpack-entries 1` (still one pair).
const HASH_LP_ONE: &[u8] =
    b"\x10\x0c\x0c\x00\x00\x00\x02\x00\x81a\x02\x01\x01\xff\n\x00\x84\xa6\x93\xe8\xaa\x17\xe4\xdb";
/// `SADD i1 1 2 3 70000` (intset, 32-bit wide).
const SET_INTSET: &[u8] = b"\x0b\x18\x04\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00p\x11\x01\x00\n\x00\xef.e!\xe3\x85\xa2*";
/// `SADD st1 a b` (a hashtable set in 7.0: plain SET).
const SET_PLAIN: &[u8] = b"\x02\x02\x01a\x01b\n\x00\xfed!%\xeb\x03=\r";

fn string_of(p: &[u8]) -> Vec<u8> {
    match restore(p).unwrap() {
        RdbValue::String(s) => s,
        other => panic!("not a string: {other:?}"),
    }
}

fn with_footer(object: &[u8], version: u16) -> Vec<u8> {
    let mut p = object.to_vec();
    p.extend_from_slice(&version.to_le_bytes());
    let crc = crc64::crc64(0, &p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

// Every string encoding Redis emits parses to the value, and DUMP re-emits Redis's bytes.
#[test]
fn strings_known_payloads() {
    let digits = b"0123456789".repeat(4);
    let big = b"abcdefghij".repeat(30);
    let cases: Vec<(&[u8], Vec<u8>)> = vec![
        (STR_RAW, b"hello".to_vec()),
        (STR_INT8, b"12".to_vec()),
        (STR_INT16, b"300".to_vec()),
        (STR_INT32, b"100000".to_vec()),
        (STR_NEG, b"-129".to_vec()),
        (STR_WIDE_INT, b"12345678901".to_vec()),
        (STR_LZF, vec![b'a'; 53]),
        (STR_LZF_DIGITS, digits),
        (STR_LZF_BIG, big),
    ];
    for (payload, value) in cases {
        assert_eq!(string_of(payload), value);
        assert_eq!(dump(&RdbValue::String(value)), payload);
    }
}

// A listpack hash parses in order and is re-emitted byte for byte.
#[test]
fn hash_listpack_known_payload() {
    let RdbValue::Hash(h) = restore(HASH_LP).unwrap() else {
        panic!("not a hash")
    };
    let pairs: Vec<(&[u8], &[u8])> = h.pairs().iter().map(|(f, v)| (&f[..], &v[..])).collect();
    assert_eq!(
        pairs,
        vec![
            (&b"a"[..], &b"1"[..]),
            (&b"b"[..], &b"hello"[..]),
            (&b"c"[..], &b"-5000"[..])
        ]
    );
    assert_eq!(h.encoding(), HashEncoding::Listpack);
    assert_eq!(dump(&RdbValue::Hash(h)), HASH_LP);
    assert!(matches!(restore(HASH_LP_ONE).unwrap(), RdbValue::Hash(h) if h.len() == 1));
}

// An intset set and a plain set parse; both are re-emitted as Redis 7.0 emits them.
#[test]
fn sets_known_payloads() {
    let RdbValue::Set(s) = restore(SET_INTSET).unwrap() else {
        panic!("not a set")
    };
    assert_eq!(s.encoding(), SetEncoding::Intset);
    assert_eq!(s.members(), [&b"1"[..], b"2", b"3", b"70000"]);
    assert_eq!(dump(&RdbValue::Set(s)), SET_INTSET);
    let RdbValue::Set(s) = restore(SET_PLAIN).unwrap() else {
        panic!("not a set")
    };
    assert_eq!(s.members(), [&b"a"[..], b"b"]);
    assert_eq!(dump(&RdbValue::Set(s)), SET_PLAIN);
}

// Redis 7.2's SET_LISTPACK under RDB 11 is accepted; RDB 12 is refused.
#[test]
fn rdb11_set_listpack_accepted_and_newer_refused() {
    let lp = blob::listpack_build([&b"x"[..], b"7"].into_iter());
    let mut object = vec![ObjectType::SetListpack as u8];
    put_string(&mut object, &lp);
    let RdbValue::Set(s) = restore(&with_footer(&object, 11)).unwrap() else {
        panic!("not a set")
    };
    assert_eq!(s.members(), [&b"x"[..], b"7"]);
    assert_eq!(
        restore(&with_footer(&object, 12)),
        Err(DumpError::VersionOrChecksum)
    );
}

// A Redis 6 ziplist hash and a Redis 2.4 zipmap hash parse.
#[test]
fn old_hash_encodings_accepted() {
    let zl: &[u8] = b"\x11\x00\x00\x00\x0d\x00\x00\x00\x02\x00\x00\x01f\x03\x01v\xff";
    let mut object = vec![ObjectType::HashZiplist as u8];
    put_len(&mut object, zl.len());
    object.extend_from_slice(zl);
    let RdbValue::Hash(h) = restore(&with_footer(&object, 9)).unwrap() else {
        panic!("not a hash")
    };
    assert_eq!(h.get(b"f"), Some(&b"v"[..]));
    let zm: &[u8] = b"\x01\x01k\x02\x00vv\xff";
    let mut object = vec![ObjectType::HashZipmap as u8];
    put_len(&mut object, zm.len());
    object.extend_from_slice(zm);
    let RdbValue::Hash(h) = restore(&with_footer(&object, 6)).unwrap() else {
        panic!("not a hash")
    };
    assert_eq!(h.get(b"k"), Some(&b"vv"[..]));
}

// Any cut of a valid payload fails (checksum or format), never panics.
#[test]
fn truncated_payloads_refused() {
    for p in [STR_LZF_BIG, HASH_LP, SET_INTSET, SET_PLAIN] {
        for n in 0..p.len() {
            assert!(restore(&p[..n]).is_err());
        }
    }
}

// A flipped bit anywhere in a payload is caught by the checksum or the version check.
#[test]
fn bad_checksum_refused() {
    for i in 0..HASH_LP.len() {
        let mut p = HASH_LP.to_vec();
        p[i] ^= 0x10;
        assert_eq!(restore(&p), Err(DumpError::VersionOrChecksum), "byte {i}");
    }
}

// Well-checksummed but malformed objects are "Bad data format".
#[test]
fn malformed_objects_refused() {
    let bad: Vec<Vec<u8>> = vec![
        vec![ObjectType::Set as u8, 0],                   // empty set
        vec![ObjectType::Set as u8, 2, 1, b'a', 1, b'a'], // duplicate member
        vec![ObjectType::Hash as u8, 0],                  // empty hash
        vec![
            ObjectType::Hash as u8,
            2,
            1,
            b'a',
            1,
            b'1',
            1,
            b'a',
            1,
            b'2',
        ], // duplicate field
        vec![ObjectType::Zset as u8, 0],                  // a type lavik does not store
        vec![0x7f],                                       // unknown type
        vec![ObjectType::String as u8, 0xc4],             // unknown string encoding
        vec![ObjectType::String as u8, 0xc3, 2, 5, 0x20, 0], // LZF reference before start
        vec![ObjectType::String as u8, 0x20, b'a'], // string longer than the payload and footer
        vec![ObjectType::String as u8, 0x82, 0, 0, 0, 1], // bad length tag
        vec![ObjectType::SetIntset as u8, 0x01, 0x00], // intset too short
        vec![],                                     // no type byte
    ];
    for object in bad {
        assert!(
            matches!(
                restore(&with_footer(&object, 10)),
                Err(DumpError::BadFormat(_))
            ),
            "{object:?}"
        );
    }
}

// Large collections emit the non-compact forms and come back equal.
#[test]
fn big_collections_round_trip() {
    let mut h = HashValue::new();
    for i in 0..300 {
        h.set(format!("field:{i}").as_bytes(), &vec![b'v'; i % 90]);
    }
    assert_eq!(h.encoding(), HashEncoding::Hashtable);
    let p = dump(&RdbValue::Hash(h.clone()));
    assert_eq!(p[0], ObjectType::Hash as u8);
    assert_eq!(restore(&p).unwrap(), RdbValue::Hash(h));
    let mut s = SetValue::create(b"1", 1);
    for i in 0..700 {
        s.add(format!("{}", i * 1_000_003).as_bytes());
    }
    let p = dump(&RdbValue::Set(s.clone()));
    assert_eq!(restore(&p).unwrap(), RdbValue::Set(s));
}

proptest! {
    // Any string survives DUMP then RESTORE.
    #[test]
    fn string_round_trip(s in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..400),
        proptest::collection::vec(prop_oneof![Just(b'x'), Just(b'y')], 0..2000),
        any::<i64>().prop_map(|v| v.to_string().into_bytes()),
    ]) {
        let v = RdbValue::String(s);
        prop_assert_eq!(restore(&dump(&v)).unwrap(), v);
    }

    // Any hash and any set survive DUMP then RESTORE (same members, order and encoding).
    #[test]
    fn collection_round_trip(
        fields in proptest::collection::btree_map(
            proptest::collection::vec(any::<u8>(), 0..12),
            proptest::collection::vec(any::<u8>(), 0..80), 1..200),
        members in proptest::collection::btree_set(prop_oneof![
            any::<i64>().prop_map(|v| v.to_string().into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..70),
        ], 1..600),
    ) {
        let mut h = HashValue::new();
        for (f, v) in &fields {
            h.set(f, v);
        }
        let hv = RdbValue::Hash(h);
        prop_assert_eq!(restore(&dump(&hv)).unwrap(), hv);
        let mut it = members.iter();
        let first = it.next().unwrap();
        let mut s = SetValue::create(first, members.len());
        s.add(first);
        for m in it {
            s.add(m);
        }
        let sv = RdbValue::Set(s);
        prop_assert_eq!(restore(&dump(&sv)).unwrap(), sv);
    }
}

// A "-0" member (which lavik's intset admits) survives DUMP: it is not rewritten as 0.
#[test]
fn negative_zero_member_kept() {
    let mut s = SetValue::create(b"-0", 2);
    s.add(b"-0");
    s.add(b"5");
    let RdbValue::Set(back) = restore(&dump(&RdbValue::Set(s))).unwrap() else {
        panic!("not a set")
    };
    assert!(back.contains(b"-0") && back.contains(b"5") && back.len() == 2);
}
