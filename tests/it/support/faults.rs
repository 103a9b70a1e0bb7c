//! A TCP proxy to put between one process and the broker, to inject network
//! faults: delay each direction, black-hole (connections stay open, data is
//! dropped), or cut (connections closed, new ones refused until healed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    /// Milliseconds added before forwarding, client → server.
    up_delay_ms: AtomicU64,
    /// Milliseconds added before forwarding, server → client.
    down_delay_ms: AtomicU64,
    blackhole: AtomicBool,
    cut: AtomicBool,
    /// Woken to close every connection.
    close_all: Notify,
}

/// A proxy on a free loopback port forwarding to `127.0.0.1:target`.
pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.state.close_all.notify_waiters();
    }
}

impl Proxy {
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if st.cut.load(Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let st = st.clone();
                tokio::spawn(async move {
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, st.clone(), true);
                    let down = pump(sr, cw, st.clone(), false);
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = st.close_all.notified() => {}
                    }
                });
            }
        });
        Proxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Delays what the client sends (`up`) and receives (`down`).
    pub fn delay(&self, up: Duration, down: Duration) {
        self.state
            .up_delay_ms
            .store(up.as_millis() as u64, Ordering::Relaxed);
        self.state
            .down_delay_ms
            .store(down.as_millis() as u64, Ordering::Relaxed);
    }

    /// Drops everything in both directions while on; connections stay open.
    pub fn blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::Relaxed);
    }

    /// Closes every connection and refuses new ones until [`Proxy::heal`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::Relaxed);
        self.state.close_all.notify_waiters();
    }

    /// Back to a plain proxy.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::Relaxed);
        self.state.blackhole.store(false, Ordering::Relaxed);
        self.delay(Duration::ZERO, Duration::ZERO);
    }
}

/// Forwards one direction, chunk by chunk, in order; a delay holds each
/// chunk back (so the stream is late by the delay, not slower).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    st: Arc<State>,
    up: bool,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        let mut to = to;
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if st.blackhole.load(Ordering::Relaxed) {
            continue;
        }
        let ms = if up {
            st.up_delay_ms.load(Ordering::Relaxed)
        } else {
            st.down_delay_ms.load(Ordering::Relaxed)
        };
        let due = tokio::time::Instant::now() + Duration::from_millis(ms);
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
