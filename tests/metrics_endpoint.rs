//! The metrics endpoint under idle, slow and too many clients, and at the descriptor limit:
//! `/metrics` keeps answering, nothing spins. Everything on 127.0.0.1, bounded in time.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcptap::server::{self, ServerEvent, ServerLimits, ServerState};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The tests change the process's descriptor limit: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

type Events = Arc<Mutex<HashMap<&'static str, u64>>>;

struct Running {
    addr: SocketAddr,
    events: Events,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    fn count(&self, reason: &str) -> u64 {
        self.events
            .lock()
            .map(|e| e.get(reason).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(limits: ServerLimits) -> Running {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let events: Events = Arc::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(ServerState {
        render_metrics: Box::new(|| "mcptap_build_info 1\n".to_string()),
        readiness: Box::new(|| Ok(())),
        on_event: Box::new({
            let events = events.clone();
            move |e: ServerEvent| {
                if let Ok(mut m) = events.lock() {
                    *m.entry(e.as_str()).or_default() += 1;
                }
            }
        }),
    });
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            server::serve(listener, state, limits, stop_rx).await;
        });
    });
    Running {
        addr,
        events,
        stop,
        thread: Some(thread),
    }
}

/// GET `path` on a new connection; the response, or why not.
fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)
        .map_err(|e| format!("read: {e}"))?;
    Ok(buf)
}

fn raise_nofile(want: u64) -> (u64, u64) {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let new = want.max(soft).min(hard);
    setrlimit(Resource::RLIMIT_NOFILE, new, hard).expect("setrlimit");
    (soft, hard)
}

#[test]
fn metrics_keep_answering_with_1100_idle_connections_open() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (soft, hard) = raise_nofile(8192);
    let srv = start(ServerLimits::default());
    let started = Instant::now();
    let idle: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(srv.addr).expect("idle connection"))
        .collect();
    for _ in 0..3 {
        let r = get(srv.addr, "/metrics").expect("/metrics answers");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.contains("mcptap_build_info 1"), "{r}");
    }
    // The endpoint held at most its cap; the rest were closed, oldest idle first, and counted.
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.count("connection_limit") < 1100 - 128 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(srv.count("connection_limit") >= 1100 - 128);
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(idle);
    drop(srv);
    let _ = setrlimit(Resource::RLIMIT_NOFILE, soft, hard);
}

#[test]
fn idle_and_silent_connections_time_out() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let srv = start(ServerLimits {
        max_connections: 16,
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
    });
    // A client that never sends, and one that sends half a request head.
    let mut silent = TcpStream::connect(srv.addr).expect("connect");
    let mut slow = TcpStream::connect(srv.addr).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost:")
        .expect("write");
    for s in [&mut silent, &mut slow] {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let started = Instant::now();
        let mut buf = [0u8; 512];
        // Closed (EOF, or a 408 then EOF) well before the 5 s read timeout.
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("not closed: {e}"),
            }
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    assert!(srv.count("timeout") >= 2, "{:?}", srv.events);
    assert!(get(srv.addr, "/metrics").is_ok_and(|r| r.starts_with("HTTP/1.1 200")));
}

/// Opens /dev/null until the descriptor table is full; dropping one frees one descriptor.
fn fill_descriptor_table() -> Vec<std::fs::File> {
    let mut filler = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        filler.push(f);
        assert!(filler.len() < 100_000, "the descriptor limit did not apply");
    }
    filler
}

#[test]
fn at_the_descriptor_limit_accept_backs_off_and_metrics_still_answer() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let srv = start(ServerLimits {
        max_connections: 100_000,
        header_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
    });
    // Up and serving before the table is filled (the runtime needs descriptors of its own).
    assert!(get(srv.addr, "/healthz").is_ok_and(|r| r.starts_with("HTTP/1.1 200")));
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count()) as u64;
    setrlimit(Resource::RLIMIT_NOFILE, open_now + 256, hard).expect("setrlimit");

    // 1. Nothing to free: a connection waits in the backlog while every descriptor is taken.
    //    accept fails, backs off, and does not spin.
    let mut filler = fill_descriptor_table();
    filler.pop();
    let mut waiting = TcpStream::connect(srv.addr).expect("connect");
    // Sent at once, as a scraper does: a descriptor the server frees late (its side of the
    // healthz connection, closed after the response's end was read) can let it accept this
    // one early, and a connection then idle past the descriptor-limit grace while this test
    // sleeps would be closed to free one, as designed.
    write!(
        waiting,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.count("fd_limit") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = srv.count("fd_limit");
    assert!(before >= 1, "{:?}", srv.events);
    std::thread::sleep(Duration::from_millis(1500));
    let failed = srv.count("fd_limit") - before;
    assert!(failed < 50, "{failed} failed accepts in 1.5 s: spinning");
    // Descriptors come free: the waiting scrape is served (two, so that a descriptor the
    // process takes meanwhile for something else cannot starve it; the wait is long because a
    // loaded CI machine can delay the back-off's wake-up).
    filler.pop();
    filler.pop();
    waiting
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut r = String::new();
    let read = waiting.read_to_string(&mut r);
    drop(filler);
    drop(waiting);

    // 2. The table is full of the endpoint's own idle connections: a scrape gets a descriptor
    //    by closing the connection idle the longest.
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(srv.addr).expect("idle"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut filler = fill_descriptor_table();
    filler.pop();
    let scrape = get(srv.addr, "/metrics");
    drop(filler);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).expect("restore");
    assert!(
        read.is_ok() && r.starts_with("HTTP/1.1 200"),
        "{read:?} {r}"
    );
    assert!(
        scrape.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")),
        "{scrape:?} {:?}",
        srv.events
    );
    drop(idle);
}
