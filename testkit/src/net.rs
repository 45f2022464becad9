//! Loopback ports for tests.

/// A port free on 127.0.0.1 now (the listener is closed again at once): for a server that must
/// be told its port before it starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}
