//! The `lavik` server binary: parse settings, open the store, start one
//! worker per CPU, wait for a shutdown signal or command, stop cleanly.
use lavik::config::Settings;
use lavik::server::{build_shared, distribute_shards, Worker};
use lavik::storage::{self, StoreConfig};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

fn init_logging(settings: &Settings) {
    use tracing_subscriber::fmt;
    let log_file = settings.cli.log_dir.as_ref().and_then(|dir| {
        std::fs::create_dir_all(dir).ok()?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("lavik.log"))
            .ok()
    });
    let builder = fmt().with_ansi(false).with_target(false);
    match log_file {
        Some(f) => {
            let f = Arc::new(f);
            let to_stderr = settings.cli.logtostderr;
            builder
                .with_writer(move || -> Box<dyn std::io::Write> {
                    if to_stderr {
                        Box::new(Tee(f.clone()))
                    } else {
                        Box::new(f.clone())
                    }
                })
                .init()
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
}

struct Tee(Arc<std::fs::File>);
impl std::io::Write for Tee {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(b);
        (&*self.0).write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        (&*self.0).flush()
    }
}

fn listen(addr: &str, port: u16) -> std::io::Result<OwnedFd> {
    use socket2::{Domain, Socket, Type};
    let ip: std::net::IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid bind address '{addr}'"),
            )
        })?;
    let sa = std::net::SocketAddr::new(ip, port);
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, None)?;
    if sa.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&sa.into())?;
    sock.listen(511)?;
    Ok(sock.into())
}

fn main() {
    let settings = match Settings::from_args(std::env::args().collect()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    init_logging(&settings);
    // SAFETY: installing async-signal-safe handlers that only store an atomic.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let threads = settings.threads;
    tracing::info!(
        "lavik {} ({}) starting: {} workers, data files {:?}, appendfsync {:?}",
        env!("CARGO_PKG_VERSION"),
        env!("LAVIK_GIT_SHA"),
        threads,
        settings.data_files,
        settings.appendfsync
    );
    let store_cfg = StoreConfig {
        data_files: settings.data_files.clone(),
        create_size_bytes: settings.data_file_size_bytes,
        shard_count: threads.max(8) as u32,
        fsync: settings.appendfsync,
        flush_max_ms: settings.cli.flush_max_ms,
        direct_io: settings.direct_io,
        tomb_raider_interval_ms: settings.cli.tomb_raider_interval_ms,
        defrag_paused: settings.cli.defrag_paused,
        defrag_sleep_ms: settings.cli.defrag_sleep_ms,
        ..StoreConfig::default()
    };
    let started = std::time::Instant::now();
    let opened_result = if settings.cli.storage == "spdk" {
        let uris: Vec<String> = settings
            .data_files
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let uris: Vec<&str> = uris.iter().map(String::as_str).collect();
        let options = lavik::nvme::block::NvmeOptions {
            max_completions_per_poll: settings.cli.spdk_max_completions_per_poll as usize,
            io_queue_pairs: threads.min(u16::MAX as usize) as u16,
            ..lavik::nvme::block::NvmeOptions::from_env()
        };
        match lavik::nvme::block::open_spdk_data_files(&uris, &options) {
            Ok(devices) => storage::open_on(devices, &store_cfg),
            Err(e) => {
                tracing::error!("cannot open NVMe devices: {e}");
                eprintln!("lavik: cannot open NVMe devices: {e}");
                std::process::exit(1);
            }
        }
    } else {
        storage::open(&store_cfg)
    };
    let opened = match opened_result {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("cannot open store: {e}");
            eprintln!("lavik: cannot open store: {e}");
            std::process::exit(1);
        }
    };
    let shard_count = opened.info.shard_count;
    tracing::info!(
        "store open: {} shards, {} keys recovered in {} ms",
        shard_count,
        opened.info.recovered_keys,
        started.elapsed().as_millis()
    );
    // Listeners first, so a busy port is reported before anything runs.
    let mut per_worker: Vec<Vec<OwnedFd>> = (0..threads).map(|_| Vec::new()).collect();
    if settings.cli.port != 0 {
        for addr in &settings.binds {
            for l in per_worker.iter_mut() {
                match listen(addr, settings.cli.port) {
                    Ok(fd) => l.push(fd),
                    Err(e) => {
                        tracing::error!("cannot listen on {addr}:{}: {e}", settings.cli.port);
                        eprintln!("lavik: cannot listen on {addr}:{}: {e}", settings.cli.port);
                        std::process::exit(1);
                    }
                }
            }
        }
    }
    let pin = settings.pin_workers;
    let cpus = settings.cpus.clone();
    let (recovered, recovery_ms) = (opened.info.recovered_keys, opened.info.recovery_ms);
    let (shared, mailboxes) = match build_shared(settings, shard_count, recovered, recovery_ms) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("lavik: cannot start workers: {e}");
            std::process::exit(1);
        }
    };
    let metrics_port = shared.settings.cli.metrics_port;
    if metrics_port != 0 {
        let addr = shared
            .settings
            .binds
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".into());
        match std::net::TcpListener::bind((addr.as_str(), metrics_port)) {
            Ok(l) => {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("lavik-metrics".into())
                    .spawn(move || lavik::server::metrics::serve(shared, l))
                    .expect("spawn metrics thread");
            }
            Err(e) => {
                tracing::error!("cannot listen for metrics on {addr}:{metrics_port}: {e}");
                eprintln!("lavik: cannot listen for metrics on {addr}:{metrics_port}: {e}");
                shared.request_shutdown(false);
            }
        }
    }
    let sets = distribute_shards(opened.shards, threads, shard_count);
    let mut handles = Vec::new();
    for (id, ((set, listeners), mailbox)) in
        sets.into_iter().zip(per_worker).zip(mailboxes).enumerate()
    {
        let shared = shared.clone();
        let cpu = cpus[id % cpus.len()];
        let h = std::thread::Builder::new()
            .name(format!("lavik-w{id}"))
            .spawn(move || {
                if pin && !lavik::runtime::pin_current_thread(cpu) {
                    tracing::warn!("worker {id}: could not pin to CPU {cpu}");
                }
                match Worker::new(id, shared.clone(), set, listeners, mailbox) {
                    Ok(w) => w.run(),
                    Err(e) => {
                        tracing::error!("worker {id} failed to start: {e}");
                        shared.request_shutdown(false);
                    }
                }
            })
            .expect("spawn worker thread");
        handles.push(h);
    }
    tracing::info!(
        "ready to accept connections on port {}",
        shared.settings.cli.port
    );
    // Instantaneous ops/s as Redis computes it: mean of recent 100 ms samples.
    let mut samples = [0u64; 16];
    let mut idx = 0;
    let mut last = shared.stats.total_commands.load(Ordering::Relaxed);
    while !shared.shutdown.load(Ordering::SeqCst) {
        if SIGNALLED.load(Ordering::SeqCst) {
            tracing::info!("signal received, shutting down");
            shared.request_shutdown(false);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let now = shared.stats.total_commands.load(Ordering::Relaxed);
        samples[idx % 16] = (now - last) * 10;
        idx += 1;
        last = now;
        let n = idx.min(16) as u64;
        shared
            .stats
            .instantaneous_ops
            .store(samples.iter().sum::<u64>() / n, Ordering::Relaxed);
    }
    for h in handles {
        let _ = h.join();
    }
    tracing::info!("lavik stopped");
}
