//! GEO commands on sorted sets (Redis 7.2 semantics and texts): GEOADD GEOPOS GEODIST
//! GEOHASH GEORADIUS GEORADIUS_RO GEORADIUSBYMEMBER GEORADIUSBYMEMBER_RO GEOSEARCH
//! GEOSEARCHSTORE.
//!
//! A position is stored as Redis stores it: the member's score is the 52-bit interleaved
//! geohash of (longitude, latitude) over [-180, 180] x [-85.05112878, 85.05112878], 26 bits
//! each, latitude in the even bits; decoding takes the centre of the cell. Distances are
//! Redis's haversine on a sphere of radius 6372797.560856 m.
//!
//! Deliberately different: Redis finds search candidates by scanning the score ranges of
//! nine geohash cells around the centre and then filters them by exact distance; lavik
//! filters every member by the same exact test. The members found are the same; the order
//! of a result without ASC/DESC/COUNT is lavik's (ascending score) instead of Redis's cell
//! order, and COUNT n ANY returns the n members with the lowest scores among the matches,
//! not the first n Redis's cell walk meets.

use super::collection::load_zset;
use super::zset::{parse_score, store_result, zadd};
use super::{eq_ic, parse_int, CmdResult, Ctx, ERR_SYNTAX};
use crate::resp::encode::Proto;
use crate::resp::ReplyBuf;
use crate::storage::zset::ZSetValue;

const LONG_MIN: f64 = -180.0;
const LONG_MAX: f64 = 180.0;
const LAT_MIN: f64 = -85.05112878;
const LAT_MAX: f64 = 85.05112878;
/// Bits per coordinate in the stored geohash.
const STEP_BITS: u32 = 26;
const EARTH_RADIUS_METERS: f64 = 6372797.560856;
const GEOALPHABET: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

/// Spreads the 32 bits of `v` to the even bit positions of a u64.
fn spread(v: u32) -> u64 {
    let mut x = v as u64;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    (x | (x << 1)) & 0x5555_5555_5555_5555
}

/// The even bits of `x`, packed.
fn squash(x: u64) -> u32 {
    let mut x = x & 0x5555_5555_5555_5555;
    x = (x | (x >> 1)) & 0x3333_3333_3333_3333;
    x = (x | (x >> 2)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0x0000_0000_FFFF_FFFF) as u32
}

/// Geohash bits of a position over the given latitude range (`None` outside the WGS84
/// limits Redis accepts).
fn encode(lon: f64, lat: f64, lat_min: f64, lat_max: f64) -> Option<u64> {
    if !(LONG_MIN..=LONG_MAX).contains(&lon) || !(LAT_MIN..=LAT_MAX).contains(&lat) {
        return None;
    }
    let cells = (1u64 << STEP_BITS) as f64;
    let lat_off = (lat - lat_min) / (lat_max - lat_min) * cells;
    let lon_off = (lon - LONG_MIN) / (LONG_MAX - LONG_MIN) * cells;
    Some(spread(lat_off as u32) | (spread(lon_off as u32) << 1))
}

/// The score GEOADD stores for a position.
pub fn geo_score(lon: f64, lat: f64) -> Option<f64> {
    encode(lon, lat, LAT_MIN, LAT_MAX).map(|b| b as f64)
}

/// The (longitude, latitude) a score decodes to: the centre of its cell, clamped.
pub fn decode_score(score: f64) -> (f64, f64) {
    let bits = score as u64;
    let (ilat, ilon) = (squash(bits), squash(bits >> 1));
    let cells = (1u64 << STEP_BITS) as f64;
    let lat_scale = LAT_MAX - LAT_MIN;
    let lon_scale = LONG_MAX - LONG_MIN;
    let lat_lo = LAT_MIN + (ilat as f64 / cells) * lat_scale;
    let lat_hi = LAT_MIN + ((ilat as f64 + 1.0) / cells) * lat_scale;
    let lon_lo = LONG_MIN + (ilon as f64 / cells) * lon_scale;
    let lon_hi = LONG_MIN + ((ilon as f64 + 1.0) / cells) * lon_scale;
    let lon = ((lon_lo + lon_hi) / 2.0).clamp(LONG_MIN, LONG_MAX);
    let lat = ((lat_lo + lat_hi) / 2.0).clamp(LAT_MIN, LAT_MAX);
    (lon, lat)
}

fn deg_rad(d: f64) -> f64 {
    d * (std::f64::consts::PI / 180.0)
}

fn lat_distance(lat1: f64, lat2: f64) -> f64 {
    EARTH_RADIUS_METERS * (deg_rad(lat2) - deg_rad(lat1)).abs()
}

/// Redis's `geohashGetDistance` (haversine), in meters.
pub fn distance(lon1: f64, lat1: f64, lon2: f64, lat2: f64) -> f64 {
    let v = ((deg_rad(lon2) - deg_rad(lon1)) / 2.0).sin();
    if v == 0.0 {
        return lat_distance(lat1, lat2);
    }
    let (lat1r, lat2r) = (deg_rad(lat1), deg_rad(lat2));
    let u = ((lat2r - lat1r) / 2.0).sin();
    let a = u * u + lat1r.cos() * lat2r.cos() * v * v;
    2.0 * EARTH_RADIUS_METERS * a.sqrt().asin()
}

/// `%.4f`, as GEODIST and WITHDIST print distances (always a bulk string).
fn reply_distance(r: &mut ReplyBuf, d: f64) {
    r.bulk(format!("{d:.4}").as_bytes());
}

/// Redis's `addReplyHumanLongDouble`: `%.17Lf` without trailing zeros (or point).
fn reply_coordinate(r: &mut ReplyBuf, v: f64) {
    let mut s = format!("{v:.17}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" {
        s = "0".into();
    }
    match r.proto {
        Proto::Resp2 => r.bulk(s.as_bytes()),
        Proto::Resp3 => {
            r.out.push(b',');
            r.out.extend_from_slice(s.as_bytes());
            r.out.extend_from_slice(b"\r\n");
        }
    }
}

/// A longitude, latitude argument pair, checked as `extractLongLatOrReply`.
fn parse_lon_lat(lon: &[u8], lat: &[u8]) -> Result<(f64, f64), String> {
    let lon = parse_score(lon).ok_or("ERR value is not a valid float")?;
    let lat = parse_score(lat).ok_or("ERR value is not a valid float")?;
    if !(LONG_MIN..=LONG_MAX).contains(&lon) || !(LAT_MIN..=LAT_MAX).contains(&lat) {
        // Redis formats this one with "%f".
        return Err(format!(
            "ERR invalid longitude,latitude pair {lon:.6},{lat:.6}"
        ));
    }
    Ok((lon, lat))
}

/// Meters per unit (`extractUnitOrReply`).
fn parse_unit(u: &[u8]) -> Result<f64, String> {
    let m = match u.to_ascii_lowercase().as_slice() {
        b"m" => 1.0,
        b"km" => 1000.0,
        b"ft" => 0.3048,
        b"mi" => 1609.34,
        _ => return Err("ERR unsupported unit provided. please use M, KM, FT, MI".into()),
    };
    Ok(m)
}

/// GEOADD key [NX|XX] [CH] longitude latitude member [...]: ZADD with geohash scores.
pub fn geoadd(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let (mut nx, mut xx) = (false, false);
    let mut i = 2;
    while i < a.len() {
        if eq_ic(a[i], "nx") {
            nx = true;
        } else if eq_ic(a[i], "xx") {
            xx = true;
        } else if !eq_ic(a[i], "ch") {
            break;
        }
        i += 1;
    }
    let rest = a.len() - i;
    // Redis answers NX with XX with a plain syntax error here (ZADD names the conflict).
    if !rest.is_multiple_of(3) || rest == 0 || (nx && xx) {
        return Err(ERR_SYNTAX.into());
    }
    let mut scores = Vec::with_capacity(rest / 3);
    for t in a[i..].chunks_exact(3) {
        let (lon, lat) = parse_lon_lat(t[0], t[1])?;
        let s = geo_score(lon, lat).expect("checked range");
        scores.push(format!("{}", s as u64).into_bytes());
    }
    let mut zargs: Vec<&[u8]> = vec![b"zadd"];
    zargs.extend_from_slice(&a[1..i]);
    for (t, s) in a[i..].chunks_exact(3).zip(&scores) {
        zargs.push(s);
        zargs.push(t[2]);
    }
    zadd(ctx, &zargs, r)
}

pub fn geopos(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let z = load_zset(ctx, a[1])?;
    r.array(a.len() - 2);
    for m in &a[2..] {
        match z.as_ref().and_then(|z| z.value.score(m)) {
            Some(s) => {
                let (lon, lat) = decode_score(s);
                r.array(2);
                reply_coordinate(r, lon);
                reply_coordinate(r, lat);
            }
            None => r.null_array(),
        }
    }
    Ok(())
}

/// GEODIST key member1 member2 [unit].
pub fn geodist(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    if a.len() > 5 {
        return Err(ERR_SYNTAX.into());
    }
    let to_meters = match a.get(4) {
        Some(u) => parse_unit(u)?,
        None => 1.0,
    };
    let z = load_zset(ctx, a[1])?;
    let pos = |m: &[u8]| z.as_ref().and_then(|z| z.value.score(m)).map(decode_score);
    match (pos(a[2]), pos(a[3])) {
        (Some((lon1, lat1)), Some((lon2, lat2))) => {
            reply_distance(r, distance(lon1, lat1, lon2, lat2) / to_meters)
        }
        _ => r.null(),
    }
    Ok(())
}

/// GEOHASH key member [...]: the standard 11-character geohash (latitude over ±90).
pub fn geohash(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    let z = load_zset(ctx, a[1])?;
    r.array(a.len() - 2);
    for m in &a[2..] {
        let Some(s) = z.as_ref().and_then(|z| z.value.score(m)) else {
            r.null();
            continue;
        };
        let (lon, lat) = decode_score(s);
        let bits = encode(lon, lat, -90.0, 90.0).unwrap_or(0);
        let mut out = [0u8; 11];
        for (i, c) in out.iter_mut().enumerate() {
            let idx = if i == 10 {
                0
            } else {
                ((bits >> (52 - (i + 1) * 5)) & 0x1f) as usize
            };
            *c = GEOALPHABET[idx];
        }
        r.bulk(&out);
    }
    Ok(())
}

// ---- searches ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Shape {
    /// Radius in meters.
    Radius(f64),
    /// Width and height in meters.
    Box(f64, f64),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sort {
    None,
    Asc,
    Desc,
}

const FROM_COORDS: u8 = 1;
const FROM_MEMBER: u8 = 2;
const SEARCH: u8 = 4;
const SEARCH_STORE: u8 = 8;
const NO_STORE: u8 = 16;

struct Found {
    member: Vec<u8>,
    score: f64,
    dist_m: f64,
    lon: f64,
    lat: f64,
}

fn member_position(z: &ZSetValue, m: &[u8]) -> Result<(f64, f64), String> {
    z.score(m)
        .map(decode_score)
        .ok_or_else(|| "ERR could not decode requested zset member".into())
}

fn parse_radius(d: &[u8], unit: &[u8]) -> Result<(f64, f64), String> {
    let v = parse_score(d).ok_or("ERR need numeric radius")?;
    if v < 0.0 {
        return Err("ERR radius cannot be negative".into());
    }
    Ok((v, parse_unit(unit)?))
}

/// Redis's `georadiusGeneric`: `src_at` is the source key's position.
fn search_generic(
    ctx: &mut Ctx,
    a: &[&[u8]],
    r: &mut ReplyBuf,
    src_at: usize,
    flags: u8,
) -> CmdResult {
    let zobj = load_zset(ctx, a[src_at])?.map(|z| z.value);
    let mut center = (0.0, 0.0);
    let mut shape = Shape::Radius(0.0);
    let mut conversion = 1.0;
    let mut store_key: Option<&[u8]> = None;
    let base_args;
    if flags & FROM_COORDS != 0 {
        base_args = 6;
        center = parse_lon_lat(a[2], a[3])?;
        let (v, c) = parse_radius(a[4], a[5])?;
        shape = Shape::Radius(v * c);
        conversion = c;
    } else if flags & FROM_MEMBER != 0 {
        base_args = 5;
        if let Some(z) = &zobj {
            center = member_position(z, a[2])?;
            let (v, c) = parse_radius(a[3], a[4])?;
            shape = Shape::Radius(v * c);
            conversion = c;
        }
    } else {
        base_args = if flags & SEARCH_STORE != 0 { 3 } else { 2 };
        if flags & SEARCH_STORE != 0 {
            store_key = Some(a[1]);
        }
    }
    let (mut withdist, mut withhash, mut withcoord, mut any) = (false, false, false, false);
    let (mut frommember, mut fromloc, mut byradius, mut bybox) = (false, false, false, false);
    let (mut sort, mut count, mut storedist) = (Sort::None, 0i64, false);
    let remaining = a.len().saturating_sub(base_args);
    let arg = |i: usize| a[base_args + i];
    let mut i = 0;
    while i < remaining {
        let o = arg(i);
        let search = flags & SEARCH != 0;
        let can_store = flags & NO_STORE == 0 && !search;
        if eq_ic(o, "withdist") {
            withdist = true;
        } else if eq_ic(o, "withhash") {
            withhash = true;
        } else if eq_ic(o, "withcoord") {
            withcoord = true;
        } else if eq_ic(o, "any") {
            any = true;
        } else if eq_ic(o, "asc") {
            sort = Sort::Asc;
        } else if eq_ic(o, "desc") {
            sort = Sort::Desc;
        } else if eq_ic(o, "count") && i + 1 < remaining {
            count = parse_int(arg(i + 1))?;
            if count <= 0 {
                return Err("ERR COUNT must be > 0".into());
            }
            i += 1;
        } else if (eq_ic(o, "store") || eq_ic(o, "storedist")) && i + 1 < remaining && can_store {
            store_key = Some(arg(i + 1));
            storedist = eq_ic(o, "storedist");
            i += 1;
        } else if eq_ic(o, "storedist") && search && flags & SEARCH_STORE != 0 {
            storedist = true;
        } else if eq_ic(o, "frommember") && i + 1 < remaining && search && !fromloc {
            if let Some(z) = &zobj {
                center = member_position(z, arg(i + 1))?;
            }
            frommember = true;
            i += 1;
        } else if eq_ic(o, "fromlonlat") && i + 2 < remaining && search && !frommember {
            center = parse_lon_lat(arg(i + 1), arg(i + 2))?;
            fromloc = true;
            i += 2;
        } else if eq_ic(o, "byradius") && i + 2 < remaining && search && !bybox {
            let (v, c) = parse_radius(arg(i + 1), arg(i + 2))?;
            shape = Shape::Radius(v * c);
            conversion = c;
            byradius = true;
            i += 2;
        } else if eq_ic(o, "bybox") && i + 3 < remaining && search && !byradius {
            let w = parse_score(arg(i + 1)).ok_or("ERR need numeric width")?;
            let h = parse_score(arg(i + 2)).ok_or("ERR need numeric height")?;
            if h < 0.0 || w < 0.0 {
                return Err("ERR height or width cannot be negative".into());
            }
            conversion = parse_unit(arg(i + 3))?;
            shape = Shape::Box(w * conversion, h * conversion);
            bybox = true;
            i += 3;
        } else {
            return Err(ERR_SYNTAX.into());
        }
        i += 1;
    }
    if store_key.is_some() && (withdist || withhash || withcoord) {
        return Err(format!(
            "ERR {} is not compatible with WITHDIST, WITHHASH and WITHCOORD options",
            if flags & SEARCH_STORE != 0 {
                "GEOSEARCHSTORE"
            } else {
                "STORE option in GEORADIUS"
            }
        ));
    }
    // GEORADIUS's STORE key is found by keyword, which the command table cannot declare,
    // so the router would not hold its shard: refused rather than half supported.
    if store_key.is_some() && flags & SEARCH_STORE == 0 {
        return Err(
            "ERR lavik does not support STORE/STOREDIST in GEORADIUS; use GEOSEARCHSTORE".into(),
        );
    }
    let name = String::from_utf8_lossy(a[0]).into_owned();
    if flags & SEARCH != 0 && !(frommember || fromloc) {
        return Err(format!(
            "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for {name}"
        ));
    }
    if flags & SEARCH != 0 && !(byradius || bybox) {
        return Err(format!(
            "ERR exactly one of BYRADIUS and BYBOX can be specified for {name}"
        ));
    }
    if any && count == 0 {
        return Err("ERR the ANY argument requires COUNT argument".into());
    }
    let Some(z) = zobj else {
        match store_key {
            Some(k) => {
                // Redis deletes the destination (a `del` event when it existed).
                store_result(ctx, k, &ZSetValue::new(), "geosearchstore")?;
                r.int(0);
            }
            None => r.array(0),
        }
        return Ok(());
    };
    if count != 0 && sort == Sort::None && !any {
        sort = Sort::Asc;
    }
    let (cx, cy) = center;
    let mut found: Vec<Found> = Vec::new();
    for (score, member) in z.pairs() {
        let (lon, lat) = decode_score(*score);
        let dist = match shape {
            Shape::Radius(radius) => {
                let d = distance(cx, cy, lon, lat);
                if d > radius {
                    continue;
                }
                d
            }
            Shape::Box(w, h) => {
                if lat_distance(lat, cy) > h / 2.0 || distance(lon, lat, cx, lat) > w / 2.0 {
                    continue;
                }
                distance(cx, cy, lon, lat)
            }
        };
        found.push(Found {
            member: member.clone(),
            score: *score,
            dist_m: dist,
            lon,
            lat,
        });
        if any && found.len() as i64 >= count {
            break;
        }
    }
    match sort {
        Sort::Asc => found.sort_by(|x, y| x.dist_m.total_cmp(&y.dist_m)),
        Sort::Desc => found.sort_by(|x, y| y.dist_m.total_cmp(&x.dist_m)),
        Sort::None => {}
    }
    if count > 0 {
        found.truncate(count as usize);
    }
    if let Some(k) = store_key {
        let pairs = found
            .iter()
            .map(|f| {
                let s = if storedist {
                    f.dist_m / conversion
                } else {
                    f.score
                };
                (s, f.member.clone())
            })
            .collect();
        let out = ZSetValue::from_pairs(pairs);
        store_result(ctx, k, &out, "geosearchstore")?;
        r.int(out.len() as i64);
        return Ok(());
    }
    let options = withdist as usize + withhash as usize + withcoord as usize;
    r.array(found.len());
    for f in &found {
        if options > 0 {
            r.array(options + 1);
        }
        r.bulk(&f.member);
        if withdist {
            reply_distance(r, f.dist_m / conversion);
        }
        if withhash {
            r.int(f.score as i64);
        }
        if withcoord {
            r.array(2);
            reply_coordinate(r, f.lon);
            reply_coordinate(r, f.lat);
        }
    }
    Ok(())
}

pub fn georadius(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 1, FROM_COORDS)
}

pub fn georadius_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 1, FROM_COORDS | NO_STORE)
}

pub fn georadiusbymember(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 1, FROM_MEMBER)
}

pub fn georadiusbymember_ro(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 1, FROM_MEMBER | NO_STORE)
}

pub fn geosearch(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 1, SEARCH)
}

pub fn geosearchstore(ctx: &mut Ctx, a: &[&[u8]], r: &mut ReplyBuf) -> CmdResult {
    search_generic(ctx, a, r, 2, SEARCH | SEARCH_STORE)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Palermo's stored score, position and geohash are the ones redis-server gives.
    #[test]
    fn palermo_as_redis() {
        let s = geo_score(13.361389, 38.115556).unwrap();
        assert_eq!(s, 3479099956230698.0);
        let (lon, lat) = decode_score(s);
        assert_eq!(format!("{lon:.17}"), "13.36138933897018433");
        assert_eq!(format!("{lat:.17}"), "38.11555639549629859");
        let catania = decode_score(geo_score(15.087269, 37.502669).unwrap());
        assert_eq!(
            format!("{:.4}", distance(lon, lat, catania.0, catania.1) / 1000.0),
            "166.2742"
        );
    }

    // Interleaving and its inverse agree on every bit.
    #[test]
    fn spread_squash() {
        for v in [0u32, 1, 0xFFFF_FFFF, 0x1234_5678, 0x03FF_FFFF] {
            assert_eq!(squash(spread(v)), v);
            assert_eq!(squash(spread(v) << 1 >> 1), v);
        }
    }
}
