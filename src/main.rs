//! The `lavik` server binary: parse settings, open the store, start one
//! worker per CPU, wait for a shutdown signal or command, stop cleanly.
use lavik::config::Settings;
use lavik::server::Shared;
use lavik::server::{build_shared, distribute_shards, new_worker};
use lavik::storage::{self, OpenedStore, RecoveryProgress, StoreConfig};
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

/// Binds (without SO_REUSEPORT) and closes a socket: fails if anything listens on the port.
fn probe_port(addr: &str, port: u16) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let sa = socket_addr(addr, port)?;
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, None)?;
    if sa.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_reuse_address(true)?;
    sock.bind(&sa.into())
}

fn socket_addr(addr: &str, port: u16) -> std::io::Result<std::net::SocketAddr> {
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
    Ok(std::net::SocketAddr::new(ip, port))
}

fn listen(addr: &str, port: u16) -> std::io::Result<OwnedFd> {
    use socket2::{Domain, Socket, Type};
    let sa = socket_addr(addr, port)?;
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

/// Waits `period` against a monotonic deadline. Not `thread::sleep`: with DPDK's tap PMD,
/// which signals every received frame to the process, the main thread's `nanosleep` was
/// seen sleeping for 15+ seconds after a load (the remaining time it reported had grown),
/// delaying SIGTERM handling by as much. `park_timeout` may return early on a signal; the
/// loop then waits out the rest of the period.
fn pause(period: Duration) {
    let deadline = std::time::Instant::now() + period;
    loop {
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Opens one `SO_REUSEPORT` listener per worker on every address, or exits (a busy
/// port is reported as Redis reports it).
fn open_listeners(binds: &[String], port: u16, per_worker: &mut [Vec<OwnedFd>]) {
    for addr in binds {
        // SO_REUSEPORT would let a second server share the port with a running
        // one (same user): probe with a plain bind first, as Redis fails then.
        // A server that just died (SIGKILL) can hold the port for a moment while
        // the kernel tears its io_uring down: give that a little time.
        let mut probed = probe_port(addr, port);
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while matches!(&probed, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
            && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(20));
            probed = probe_port(addr, port);
        }
        if let Err(e) = probed {
            tracing::error!("cannot listen on {addr}:{port}: {e}");
            eprintln!("lavik: cannot listen on {addr}:{port}: {e}");
            std::process::exit(1);
        }
        for l in per_worker.iter_mut() {
            match listen(addr, port) {
                Ok(fd) => l.push(fd),
                Err(e) => {
                    tracing::error!("cannot listen on {addr}:{port}: {e}");
                    eprintln!("lavik: cannot listen on {addr}:{port}: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Offline tools: they never start a server.
    if let Some(code) = lavik::tools::run_tool(&args) {
        std::process::exit(code);
    }
    // `--version` and `--help` print to stdout and exit 0 (clap reports them as errors).
    if let Err(e) = <lavik::config::Cli as clap::Parser>::try_parse_from(&args) {
        use clap::error::ErrorKind;
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            e.exit();
        }
    }
    let settings = match Settings::from_args(args) {
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
        "lavik {} starting: {} workers, data files {:?}, appendfsync {:?}",
        lavik::config::build::VERSION,
        threads,
        settings.data_files,
        settings.appendfsync
    );
    let started = std::time::Instant::now();
    let progress = Arc::new(RecoveryProgress::default());
    let store_cfg = StoreConfig {
        data_files: settings.data_files.clone(),
        create_size_bytes: settings.data_file_size_bytes,
        growth: settings.data_file_growth.clone(),
        shard_count: threads.max(8) as u32,
        fsync: settings.appendfsync,
        flush_max_ms: settings.cli.flush_max_ms,
        direct_io: settings.direct_io,
        tomb_raider_interval_ms: settings.cli.tomb_raider_interval_ms,
        defrag_paused: settings.cli.defrag_paused,
        defrag_sleep_ms: settings.cli.defrag_sleep_ms,
        defrag_max_active_per_device: settings.cli.defrag_max_active_per_device,
        defrag_record_sleep_us: settings.cli.defrag_record_sleep_us,
        recovery_progress: Some(progress.clone()),
        debug_hash_mask: settings.cli.debug_hash_mask,
        blind_writes: settings.blind_writes,
        paged_base_min_dirs: settings.cli.paged_base_min_dirs,
        ..StoreConfig::default()
    };
    lavik::commands::collection::set_coalescing(settings.cli.coalesce_lists != "no");
    // Recovery runs beside the workers: they listen at once and answer
    // -LOADING until it hands them their shards. Only the labels are read
    // before we go on, so a foreign or damaged file is refused before
    // anything listens.
    let spdk = (settings.cli.storage == "spdk").then(|| lavik::nvme::block::NvmeOptions {
        max_completions_per_poll: settings.cli.spdk_max_completions_per_poll as usize,
        io_queue_pairs: threads.min(u16::MAX as usize) as u16,
        ..lavik::nvme::block::NvmeOptions::from_env()
    });
    let load_delay_ms = settings.cli.debug_load_delay_ms;
    let hold = settings.cli.debug_async_device_hold.clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("lavik-recovery".into())
        .spawn(move || {
            let result = open_store(&store_cfg, spdk.as_ref(), hold.as_deref());
            std::thread::sleep(Duration::from_millis(load_delay_ms));
            let _ = opened_tx.send(result);
        })
        .expect("spawn recovery thread");
    let mut opened: Option<OpenedStore> = None;
    let shard_count = loop {
        let n = progress.shard_count.load(Ordering::SeqCst);
        if n != 0 {
            break n;
        }
        match opened_rx.recv_timeout(Duration::from_millis(1)) {
            Ok(Ok(o)) => {
                let n = o.info.shard_count;
                opened = Some(o);
                break n;
            }
            Ok(Err(e)) => fail_open(&e),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                fail_open("recovery thread ended without a result")
            }
        }
    };
    // Listeners first, so a busy port is reported before anything runs.
    let mut per_worker: Vec<Vec<OwnedFd>> = (0..threads).map(|_| Vec::new()).collect();
    // In DPDK mode `--port` is the userspace stack's port; kernel listeners open only for
    // addresses given with an explicit `--bind` (e.g. a loopback admin port).
    let kernel_listeners = settings.dpdk.is_none() || !settings.cli.bind.is_empty();
    if settings.cli.port != 0 && kernel_listeners {
        open_listeners(&settings.binds, settings.cli.port, &mut per_worker);
    }
    // The TLS port's listeners follow; a worker tells a TLS connection by its local port.
    if settings.tls.port != 0 && kernel_listeners {
        open_listeners(&settings.binds, settings.tls.port, &mut per_worker);
    }
    let pin = settings.pin_workers;
    let cpus = settings.cpus.clone();
    let (shared, mailboxes) = match build_shared(settings, shard_count, Some(progress)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("lavik: cannot start workers: {e}");
            std::process::exit(1);
        }
    };
    // The function catalog lives beside the first data file (not for SPDK namespaces).
    if let Some(data) = shared.settings.data_files.first() {
        if !data.to_string_lossy().starts_with("spdk://") {
            let path = lavik::scripting::functions::file_beside(data);
            if let Err(e) = lavik::scripting::open_function_file(&shared.scripts, path) {
                eprintln!("lavik: {e}");
                std::process::exit(1);
            }
        }
    }
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
    let sets = distribute_shards(Vec::new(), threads, shard_count);
    let mut handles = Vec::new();
    for (id, ((set, listeners), mailbox)) in
        sets.into_iter().zip(per_worker).zip(mailboxes).enumerate()
    {
        let shared = shared.clone();
        let cpu = cpus[id % cpus.len()];
        // Worker 0 owns the DPDK port (one RX/TX queue pair).
        #[cfg(feature = "dpdk")]
        let dpdk = if id == 0 {
            shared.settings.dpdk.clone()
        } else {
            None
        };
        let h = std::thread::Builder::new()
            .name(format!("lavik-w{id}"))
            // Scripts recurse as deep as Redis allows (cjson, reply conversion).
            .stack_size(lavik::scripting::THREAD_STACK_BYTES)
            .spawn(move || {
                if pin && !lavik::runtime::pin_current_thread(cpu) {
                    tracing::warn!("worker {id}: could not pin to CPU {cpu}");
                }
                match new_worker(id, shared.clone(), set, listeners, mailbox) {
                    #[cfg(feature = "dpdk")]
                    Ok(mut w) if dpdk.is_some() => {
                        let settings = dpdk.expect("checked above");
                        let maxclients = shared.settings.cli.maxclients;
                        match lavik::server::DpdkNet::open(&settings, maxclients) {
                            Ok(net) => w.attach_dpdk(net),
                            Err(e) => {
                                tracing::error!("cannot start DPDK networking: {e}");
                                eprintln!("lavik: cannot start DPDK networking: {e}");
                                std::process::exit(1);
                            }
                        }
                        // EAL init moved this thread to the main lcore's CPUs.
                        if pin && !lavik::runtime::pin_current_thread(cpu) {
                            tracing::warn!("worker {id}: could not pin to CPU {cpu}");
                        }
                        w.run()
                    }
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
        "listening on port {}{}{}; commands wait for recovery (-LOADING)",
        shared.settings.cli.port,
        if shared.settings.dpdk.is_some() {
            " (userspace TCP over DPDK, worker 0)"
        } else {
            ""
        },
        match shared.settings.tls.port {
            0 => String::new(),
            p => format!(", TLS port {p}"),
        }
    );
    // Instantaneous ops/s as Redis computes it: mean of recent 100 ms samples.
    let mut samples = [0u64; 16];
    let mut idx = 0;
    let mut last = shared.stats.total_commands.load(Ordering::Relaxed);
    let mut pending = Some(opened_rx);
    while !shared.shutdown.load(Ordering::SeqCst) {
        if let Some(rx) = pending.as_ref() {
            let result = match opened.take() {
                Some(o) => Some(Ok(o)),
                None => match rx.try_recv() {
                    Ok(r) => Some(r),
                    Err(std::sync::mpsc::TryRecvError::Empty) => None,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        Some(Err("recovery thread ended without a result".to_string()))
                    }
                },
            };
            match result {
                Some(Ok(o)) => {
                    hand_over(&shared, o, threads, started);
                    pending = None;
                }
                Some(Err(e)) => {
                    shared.request_shutdown(false);
                    for h in handles {
                        let _ = h.join();
                    }
                    fail_open(&e);
                }
                None => {}
            }
        }
        if SIGNALLED.load(Ordering::SeqCst) {
            tracing::info!("signal received, shutting down");
            shared.request_shutdown(false);
            break;
        }
        pause(Duration::from_millis(100));
        let now = shared.stats.total_commands.load(Ordering::Relaxed);
        // CONFIG RESETSTAT may have zeroed the counter since the last sample.
        samples[idx % 16] = now.saturating_sub(last) * 10;
        idx += 1;
        last = now;
        let n = idx.min(16) as u64;
        shared
            .stats
            .instantaneous_ops
            .store(samples.iter().sum::<u64>() / n, Ordering::Relaxed);
    }
    // Signal or SHUTDOWN: tell systemd before the workers finish (a shutdown checkpoint
    // can take a while).
    sd_notify("STOPPING=1");
    for h in handles {
        let _ = h.join();
    }
    tracing::info!("lavik stopped");
}

/// Opens the store (recovery included) on the data files or NVMe namespaces.
fn open_store(
    cfg: &StoreConfig,
    spdk: Option<&lavik::nvme::block::NvmeOptions>,
    hold: Option<&std::path::Path>,
) -> Result<OpenedStore, String> {
    if let (None, Some(hold)) = (spdk, hold) {
        let mut devices: Vec<std::sync::Arc<dyn lavik::device::BlockDevice>> = Vec::new();
        for path in &cfg.data_files {
            let dev =
                lavik::device::FileDevice::open(path, cfg.direct_io, Some(cfg.create_size_bytes))
                    .map_err(|e| format!("cannot open store: {e}"))?;
            devices.push(std::sync::Arc::new(lavik::device::GatedDevice::new(
                dev,
                hold.to_path_buf(),
            )));
        }
        return storage::open_on(devices, cfg).map_err(|e| format!("cannot open store: {e}"));
    }
    match spdk {
        Some(options) => {
            let uris: Vec<String> = cfg
                .data_files
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            let uris: Vec<&str> = uris.iter().map(String::as_str).collect();
            let devices = lavik::nvme::block::open_spdk_data_files(&uris, options)
                .map_err(|e| format!("cannot open NVMe devices: {e}"))?;
            storage::open_on(devices, cfg).map_err(|e| format!("cannot open store: {e}"))
        }
        None => storage::open(cfg).map_err(|e| format!("cannot open store: {e}")),
    }
}

/// Tells systemd (`Type=notify`) our state; a failure is logged, never fatal.
fn sd_notify(state: &str) {
    if let Err(e) = lavik::server::notify::notify(state) {
        tracing::warn!("cannot notify systemd ({state}): {e}");
    }
}

fn fail_open(e: &str) -> ! {
    tracing::error!("{e}");
    eprintln!("lavik: {e}");
    std::process::exit(1);
}

/// Recovery is done: each worker adopts its shards, then commands run.
fn hand_over(
    shared: &Arc<Shared>,
    opened: OpenedStore,
    threads: usize,
    started: std::time::Instant,
) {
    let shard_count = opened.info.shard_count;
    shared
        .recovered_keys
        .store(opened.info.recovered_keys, Ordering::Relaxed);
    shared
        .recovery_ms
        .store(opened.info.recovery_ms, Ordering::Relaxed);
    let phases: String = opened
        .info
        .phases
        .iter()
        .map(|(name, v)| format!("lavik_recovery_{name}:{v}\r\n"))
        .collect();
    *shared
        .recovery_phases
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = phases;
    let sets = distribute_shards(opened.shards, threads, shard_count);
    let mut acks = Vec::new();
    for (w, set) in sets.into_iter().enumerate() {
        let (done, ack) = std::sync::mpsc::channel();
        let shards = set.slots.into_iter().flatten().collect();
        shared.workers[w].send(lavik::server::Msg::Adopt { shards, done });
        acks.push(ack);
    }
    for ack in acks {
        // A worker that already exited (shutdown) dropped the sender.
        let _ = ack.recv();
    }
    shared.loading.store(false, Ordering::Release);
    tracing::info!(
        "store open: {} shards, {} keys recovered in {} ms; ready to accept connections",
        shard_count,
        opened.info.recovered_keys,
        started.elapsed().as_millis()
    );
    sd_notify(&format!(
        "READY=1\nSTATUS=serving; {} keys recovered in {} ms",
        opened.info.recovered_keys,
        started.elapsed().as_millis()
    ));
}
